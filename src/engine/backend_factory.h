// Chooses and builds the compute backend for a loaded model. The engine and
// the commands go through here and never name a backend themselves.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/context_size.h"
#include "model/loaded_model.h"

namespace m40::engine {

// How a model is divided over several GPUs (--split-mode): by layers (a
// chain of stages, backends/pipeline; CPU offload works this way too) or by
// rows (every layer's matrices divided, backends/cuda/row_split_backend.h:
// the GPUs read their shares at once). Auto: by rows where the model is
// split over GPUs alone and can be divided so and fits, else by layers.
enum class SplitMode { Auto, Layer, Row };

// "auto", "layer" or "row"; throws m40::Error naming the choices.
SplitMode split_mode_from_name(const std::string& name);

struct BackendOptions {
  int n_ctx = 0;          // 0: the model's training context, capped by what the memory holds
  int n_seq = 1;          // sequences (KV slots)
  backend::KvType kv_type = backend::KvType::F16;
  unsigned threads = 0;   // CPU threads, 0: every core
  bool force_cpu = false; // --cpu
  int gpu = -1;           // --gpu N; -1: $M40_LLM_DEVICE, else 0
  // --gpus: the GPUs a model may be split over, in the chain's order (the
  // last holds the output head); empty: --gpu (or $M40_LLM_DEVICE) alone
  // where given, else every GPU, that first one leading. A model that fits
  // the first GPU runs there alone unless gpu_layers or tensor_split asks.
  std::vector<int> gpus;
  // --tensor-split: the GPUs' shares of the layers (one per GPU of gpus);
  // empty: as many as fit, or in proportion to their memory.
  std::vector<double> tensor_split;
  // Row: the model divided by rows over every GPU of gpus (more than one),
  // in proportion to tensor_split or to the GPUs' memory, whether or not it
  // fits the first alone; it must fit the GPUs (no CPU offload). Layer: as
  // gpu_layers and tensor_split say. Auto: a model split over the GPUs
  // (it does not fit the first, or tensor_split asks) is divided by rows
  // where it can be and fits them, else by layers; gpu_layers means layers.
  SplitMode split_mode = SplitMode::Auto;
  uint64_t vram_budget = 0;  // --vram; 0: the GPU's free memory
  // --gpu-layers N: the last N layers and the output head on the GPU, the
  // others on the CPU (layer_placement.h); N at or above the layer count:
  // all on the GPU; 0: none. -1 (the default): all of them when the model
  // fits the GPU, else as many as fit.
  int gpu_layers = -1;
  // The paged KV cache's pool (backends/kv_blocks.h). By default it holds a
  // whole context for every sequence where the memory left after the
  // weights allows, else what that memory holds (sequences share it as
  // their prompts and answers grow). Either field overrides: a size in
  // bytes, or a fraction of the memory left after the weights.
  uint64_t kv_pool_bytes = 0;
  double kv_pool_fraction = 0;
};

// The blocks of the KV pool for a context of n_ctx positions per sequence,
// from `options` and what `budget` leaves after its fixed part; at least
// one block. Throws m40::Error for a fraction outside (0, 1].
int kv_pool_blocks(const BackendOptions& options, int n_ctx, const MemoryBudget& budget, uint64_t bytes_per_block);

// A KV cache element type by the name the commands take: f16, f32 (the CPU
// backend only) or q8_0. Throws m40::Error naming the choices.
backend::KvType kv_type_from_name(const std::string& name);

// True when this build has the CUDA backend and a GPU is present.
bool gpu_available();

// The context size a request for `requested` tokens gets (0: the trained
// context capped by `budget`, see context_size.h), with a warning on stderr
// when it exceeds what the model was trained for.
int resolve_context_size(const model::LoadedModel& model, int requested, const MemoryBudget& budget);

// MemAvailable of /proc/meminfo in bytes (0 where it cannot be read).
uint64_t system_available_memory();

// The CUDA backend when a GPU is present (and not force_cpu), else the CPU;
// a model split between them (backends/pipeline) where gpu_layers or the
// GPU's memory says so.
std::unique_ptr<backend::Backend> make_backend(const model::LoadedModel& model, const BackendOptions& options);

}  // namespace m40::engine

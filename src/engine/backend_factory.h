// Chooses and builds the compute backend for a loaded model. The engine and
// the commands go through here and never name a backend themselves.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "engine/context_size.h"
#include "model/loaded_model.h"

namespace m40::engine {

struct BackendOptions {
  int n_ctx = 0;          // 0: the model's training context, capped by what the memory holds
  int n_seq = 1;          // sequences (KV slots)
  backend::KvType kv_type = backend::KvType::F16;
  unsigned threads = 0;   // CPU threads, 0: every core
  bool force_cpu = false; // --cpu
  int gpu = -1;           // --gpu N; -1: $M40_LLM_DEVICE, else 0
  uint64_t vram_budget = 0;  // --vram; 0: the GPU's free memory
};

// True when this build has the CUDA backend and a GPU is present.
bool gpu_available();

// The context size a request for `requested` tokens gets (0: the trained
// context capped by `budget`, see context_size.h), with a warning on stderr
// when it exceeds what the model was trained for.
int resolve_context_size(const model::LoadedModel& model, int requested, const MemoryBudget& budget);

// MemAvailable of /proc/meminfo in bytes (0 where it cannot be read).
uint64_t system_available_memory();

// The CUDA backend when a GPU is present (and not force_cpu), else the CPU.
std::unique_ptr<backend::Backend> make_backend(const model::LoadedModel& model, const BackendOptions& options);

}  // namespace m40::engine

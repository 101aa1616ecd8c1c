#include "engine/backend_factory.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include <cstdlib>

#include "backends/cpu/cpu_backend.h"
#include "backends/kv_blocks.h"
#include "backends/pipeline/pipeline_backend.h"
#include "common/error.h"
#include "engine/layer_placement.h"
#include "model/decode_reads.h"
#ifdef M40_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/memory_plan.h"
#include "backends/cuda/row_split.h"
#endif

namespace m40::engine {

int resolve_context_size(const model::LoadedModel& model, int requested, const MemoryBudget& budget) {
  const int trained = static_cast<int>(model.hparams.n_ctx_train);
  const int n_ctx = choose_context_size(trained, requested, budget);
  if (trained > 0 && n_ctx > trained) {
    std::fprintf(stderr, "warning: context %d exceeds the %d tokens the model was trained for; "
                 "quality may degrade past that\n", n_ctx, trained);
  }
  return n_ctx;
}

int kv_pool_blocks(const BackendOptions& options, int n_ctx, const MemoryBudget& budget, uint64_t bytes_per_block) {
  if (options.kv_pool_fraction < 0 || options.kv_pool_fraction > 1) {
    throw Error("the KV pool fraction must be above 0% and at most 100%");
  }
  const uint64_t left = budget.available > budget.fixed ? budget.available - budget.fixed : 0;
  uint64_t blocks;
  if (options.kv_pool_bytes > 0) {
    blocks = options.kv_pool_bytes / bytes_per_block;
  } else if (options.kv_pool_fraction > 0) {
    blocks = static_cast<uint64_t>(static_cast<double>(left) * options.kv_pool_fraction) / bytes_per_block;
  } else {
    // A whole context per sequence where it fits, else what the memory
    // holds, but never less than one whole context (the plan then says
    // whether that fits).
    const uint64_t whole = static_cast<uint64_t>(options.n_seq) * backend::kv_blocks_for(n_ctx);
    blocks = std::max<uint64_t>(std::min(whole, left / bytes_per_block), backend::kv_blocks_for(n_ctx));
  }
  return static_cast<int>(std::clamp<uint64_t>(blocks, 1, std::numeric_limits<int32_t>::max()));
}

namespace {

// Bytes of K and V per position, every layer, one sequence: 4 or 2 bytes a
// value (F32, F16), or a 34-byte Q8_0 block per 32 values.
uint64_t kv_bytes_per_position(const model::ModelHparams& hp, backend::KvType type) {
  const uint64_t values = 2ull * hp.n_layer * hp.kv_dim();
  switch (type) {
    case backend::KvType::F32: return values * 4;
    case backend::KvType::Q8_0: return values / 32 * 34;
    case backend::KvType::F16: break;
  }
  return values * 2;
}

// The CPU's budget: the memory the system has available, less the model
// file (its pages become resident as the weights are read), with a fifth
// kept for everything else.
MemoryBudget cpu_budget(const model::LoadedModel& model, const BackendOptions& options) {
  MemoryBudget b;
  b.available = system_available_memory() / 5 * 4;
  b.fixed = model.file.total_size();
  b.per_position = kv_bytes_per_position(model.hparams, options.kv_type);
  return b;
}

}  // namespace

uint64_t system_available_memory() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long v = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
      kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

SplitMode split_mode_from_name(const std::string& name) {
  if (name == "auto") return SplitMode::Auto;
  if (name == "layer") return SplitMode::Layer;
  if (name == "row") return SplitMode::Row;
  throw Error("--split-mode must be auto, layer or row, got '" + name + "'");
}

backend::KvType kv_type_from_name(const std::string& name) {
  if (name == "f16") return backend::KvType::F16;
  if (name == "f32") return backend::KvType::F32;
  if (name == "q8_0") return backend::KvType::Q8_0;
  throw Error("--kv-type must be f16, f32 (CPU only) or q8_0, got '" + name + "'");
}

bool gpu_available() {
#ifdef M40_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

#ifdef M40_HAVE_CUDA
namespace {
int chosen_gpu(int requested) {
  if (requested >= 0) return requested;
  if (const char* env = std::getenv("M40_LLM_DEVICE"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0) throw Error("M40_LLM_DEVICE must be a GPU index such as 0, got '" + std::string(env) + "'");
    return static_cast<int>(v);
  }
  return 0;
}
}  // namespace
#endif

namespace {

std::unique_ptr<cpu::CpuBackend> make_cpu_backend(const model::LoadedModel& model, const BackendOptions& options, int n_ctx,
                                                  int kv_blocks, backend::LayerRange layers) {
  cpu::CpuBackendOptions cpu_options;
  cpu_options.n_ctx = n_ctx;
  cpu_options.kv_blocks = kv_blocks;
  cpu_options.n_seq = options.n_seq;
  cpu_options.kv_type = options.kv_type;
  cpu_options.threads = options.threads;
  cpu_options.layers = layers;
  return std::make_unique<cpu::CpuBackend>(model.hparams, model.weights, cpu_options);
}

#ifdef M40_HAVE_CUDA
// The GPUs a model may use: --gpus, else --gpu (or $M40_LLM_DEVICE) alone,
// else every GPU with that first one leading the list.
std::vector<int> chosen_gpus(const BackendOptions& options) {
  const int count = cuda::device_count();
  std::vector<int> gpus = options.gpus;
  if (gpus.empty()) {
    const int first = chosen_gpu(options.gpu);
    const bool one = options.gpu >= 0 || std::getenv("M40_LLM_DEVICE") != nullptr;
    gpus.push_back(first);
    for (int d = 0; d < count && !one; ++d) {
      if (d != first) gpus.push_back(d);
    }
  } else if (options.gpu >= 0) {
    throw Error("--gpu picks one GPU and --gpus a list: give one of them");
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i] < 0 || gpus[i] >= count) {
      throw Error("GPU " + std::to_string(gpus[i]) + " does not exist (found " + std::to_string(count) + ")");
    }
    if (std::find(gpus.begin(), gpus.begin() + static_cast<std::ptrdiff_t>(i), gpus[i]) != gpus.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw Error("GPU " + std::to_string(gpus[i]) + " is listed twice in --gpus");
    }
  }
  if (!options.tensor_split.empty() && options.tensor_split.size() != gpus.size()) {
    throw Error("--tensor-split gives " + std::to_string(options.tensor_split.size()) + " shares for " +
                std::to_string(gpus.size()) + " GPUs");
  }
  return gpus;
}

uint64_t gpu_budget(const BackendOptions& options, const cuda::DeviceInfo& info) {
  const uint64_t free = info.free_memory_bytes;
  return options.vram_budget > 0 ? std::min<uint64_t>(options.vram_budget, free) : free;
}

// A model split over the GPUs and the CPU (layer_placement.h). The context
// and the KV pool are sized by all their memory together; each GPU's stage
// must fit its own budget.
std::unique_ptr<backend::Backend> make_split_backend(const model::LoadedModel& model, const BackendOptions& options,
                                                     const std::vector<int>& gpus) {
  const int n_layer = static_cast<int>(model.hparams.n_layer);
  MemoryBudget budget = cpu_budget(model, options);
  std::vector<uint64_t> available;
  std::vector<double> bandwidth;
  for (int d : gpus) {
    const cuda::DeviceInfo info = cuda::device_info(d);
    available.push_back(gpu_budget(options, info));
    bandwidth.push_back(info.peak_memory_bandwidth_gb_per_s());
    budget.available += available.back();
  }
  const int n_ctx = choose_context_size(static_cast<int>(model.hparams.n_ctx_train), options.n_ctx, budget);
  const int kv_blocks = kv_pool_blocks(options, n_ctx, budget, budget.per_position * backend::kKvBlockSize);
  cuda::CudaBackendOptions cuda_options;
  cuda_options.n_ctx = n_ctx;
  cuda_options.n_seq = options.n_seq;
  cuda_options.kv_blocks = kv_blocks;
  cuda_options.kv_type = options.kv_type;
  cuda_options.vram_budget = options.vram_budget;
  const auto stages = place_layers(n_layer, options.gpu_layers, available, options.tensor_split,
                                   [&](int, backend::LayerRange layers) {
                                     const cuda::PlanShape shape{n_ctx,     options.n_seq,   cuda_options.max_batch, 32,
                                                                 kv_blocks, options.kv_type, layers};
                                     return cuda::plan_memory(model.hparams, model.weights, shape).total();
                                   });
  std::fprintf(stderr, "note: with a context of %d: %s\n", n_ctx, describe_placement(stages, n_layer, gpus).c_str());
  std::vector<uint64_t> reads;
  for (const PlacedStage& s : stages) {
    const model::DecodeScope scope{s.layers.first, s.layers.end, s.layers.first == 0, s.layers.end == n_layer};
    reads.push_back(model::decode_bytes_per_token(model.file, model.hparams.n_expert, model.hparams.n_expert_used, scope));
  }
  std::fprintf(stderr, "note: %s\n", describe_decode_reads(stages, reads, bandwidth, gpus).c_str());
  std::vector<std::unique_ptr<backend::Backend>> backends;
  for (const PlacedStage& s : stages) {
    if (s.gpu < 0) {
      backends.push_back(make_cpu_backend(model, options, n_ctx, kv_blocks, s.layers));
    } else {
      cuda_options.device = gpus[static_cast<size_t>(s.gpu)];
      cuda_options.layers = s.layers;
      backends.push_back(std::make_unique<cuda::CudaBackend>(model.hparams, model.weights, cuda_options));
    }
  }
  if (backends.size() == 1) return std::move(backends.front());  // one stage: the whole model there
  return std::make_unique<backend::PipelineBackend>(std::move(backends), n_layer);
}

// A model divided by rows over the GPUs (model/row_split.h), in proportion
// to --tensor-split or to their memory. The context and the KV pool are
// sized by all their memory together; each shard must fit its own GPU.
// Unless `required`, a model that cannot be divided so or does not fit
// gives null (with a note why) instead of an error.
std::unique_ptr<backend::Backend> make_row_split_backend(const model::LoadedModel& model, const BackendOptions& options,
                                                         const std::vector<int>& gpus, bool required) {
  std::vector<double> shares = options.tensor_split;
  std::vector<uint64_t> available;
  std::vector<double> bandwidth;
  MemoryBudget budget;
  budget.per_position = kv_bytes_per_position(model.hparams, options.kv_type);
  for (int d : gpus) {
    const cuda::DeviceInfo info = cuda::device_info(d);
    available.push_back(gpu_budget(options, info));
    bandwidth.push_back(info.peak_memory_bandwidth_gb_per_s());
    budget.available += available.back();
    if (options.tensor_split.empty()) shares.push_back(static_cast<double>(available.back()));
  }
  std::vector<model::RowShard> shards;
  try {
    shards = model::plan_row_split(model.hparams, model.weights, shares);
  } catch (const Error& e) {
    if (required) throw;
    std::fprintf(stderr, "note: not divided by rows (%s)\n", e.what());
    return nullptr;
  }
  cuda::CudaBackendOptions cuda_options;
  cuda_options.n_seq = options.n_seq;
  cuda_options.kv_type = options.kv_type;
  cuda_options.vram_budget = options.vram_budget;
  for (const model::RowShard& shard : shards) {  // the shards' plans without any context
    cuda::PlanShape shape{0, options.n_seq, cuda_options.max_batch, 32, 0, options.kv_type, {}, shard};
    budget.fixed += cuda::plan_memory(model.hparams, model.weights, shape).total();
  }
  const int n_ctx = resolve_context_size(model, options.n_ctx, budget);
  cuda_options.n_ctx = n_ctx;
  cuda_options.kv_blocks = kv_pool_blocks(options, n_ctx, budget, budget.per_position * backend::kKvBlockSize);
  // Each shard's plan against its GPU, before anything is allocated.
  std::vector<cuda::MemoryPlan> plans;
  for (const model::RowShard& shard : shards) {
    const cuda::PlanShape shape{n_ctx, options.n_seq, cuda_options.max_batch, 32, cuda_options.kv_blocks,
                                options.kv_type, {}, shard};
    plans.push_back(cuda::plan_memory(model.hparams, model.weights, shape));
    if (!required && plans.back().total() > available[static_cast<size_t>(shard.index)]) {
      std::fprintf(stderr, "note: not divided by rows (GPU %d's share does not fit)\n", gpus[static_cast<size_t>(shard.index)]);
      return nullptr;
    }
  }
  std::string where;
  for (const model::RowShard& s : shards) {
    where += std::string(where.empty() ? "" : ", ") + "GPU " + std::to_string(gpus[static_cast<size_t>(s.index)]) +
             " KV heads " + std::to_string(s.kv_head_first) + "-" + std::to_string(s.kv_head_end - 1) + " and FFN columns " +
             std::to_string(s.ff_first) + "-" + std::to_string(s.ff_end - 1);
  }
  std::fprintf(stderr, "note: with a context of %d: every layer divided by rows: %s; the output head on GPU %d\n", n_ctx,
               where.c_str(), gpus.front());
  // What each GPU reads a token: its share of the weights (the token
  // embedding a row, unless shard 0's tied head reads it all).
  std::vector<PlacedStage> parts;
  std::vector<uint64_t> reads;
  const uint64_t embedding = model.weights.token_embd.rows * model.weights.token_embd.row_bytes;
  for (const model::RowShard& shard : shards) {
    const uint64_t weights = plans[static_cast<size_t>(shard.index)].weights;
    const bool reads_table = shard.index == 0 && model.weights.tied_output;
    parts.push_back({shard.index, {0, static_cast<int>(model.hparams.n_layer)}});
    reads.push_back(reads_table || weights < embedding ? weights : weights - embedding);
  }
  std::fprintf(stderr, "note: %s\n", describe_decode_reads(parts, reads, bandwidth, gpus, true).c_str());
  return cuda::make_row_split_backend(model.hparams, model.weights, cuda_options, gpus, shares);
}
#endif

}  // namespace

std::unique_ptr<backend::Backend> make_backend(const model::LoadedModel& model, const BackendOptions& options) {
  if (options.force_cpu && options.split_mode == SplitMode::Row) {
    throw Error("--cpu runs no layer on the GPU and --split-mode row divides them over GPUs: give one of them");
  }
  if (options.force_cpu && options.gpu_layers > 0) {
    throw Error("--cpu runs no layer on the GPU and --gpu-layers " + std::to_string(options.gpu_layers) +
                " asks for some: give one of them");
  }
#ifdef M40_HAVE_CUDA
  if (!options.force_cpu && options.gpu_layers != 0 && gpu_available()) {
    if (options.kv_type == backend::KvType::F32) {
      throw Error("the CUDA backend keeps its KV cache in FP16 or Q8_0: use --cpu for f32");
    }
    const std::vector<int> gpus = chosen_gpus(options);
    const int n_layer = static_cast<int>(model.hparams.n_layer);
    if (options.split_mode == SplitMode::Row) {
      if (options.gpu_layers >= 0) {
        throw Error("--gpu-layers offloads whole layers to the CPU and --split-mode row keeps every layer on the GPUs: "
                    "give one of them");
      }
      if (gpus.size() > 1) return make_row_split_backend(model, options, gpus, true);
    }
    // Split over the GPUs alone: by rows where the model allows it (auto).
    const auto rows_if_possible = [&]() -> std::unique_ptr<backend::Backend> {
      if (options.split_mode != SplitMode::Auto || options.gpu_layers >= 0 || gpus.size() < 2) return nullptr;
      return make_row_split_backend(model, options, gpus, false);
    };
    const bool asked_to_split = !options.tensor_split.empty() || (options.gpu_layers >= 0 && options.gpu_layers < n_layer);
    if (asked_to_split) {
      if (auto rows = rows_if_possible()) return rows;
    } else {
      // The first GPU alone when the model fits it.
      cuda::CudaBackendOptions cuda_options;
      cuda_options.device = gpus.front();
      cuda_options.n_seq = options.n_seq;
      cuda_options.kv_type = options.kv_type;
      cuda_options.vram_budget = options.vram_budget;
      // The GPU's budget: the memory plan without any context, and what one
      // position adds to it.
      MemoryBudget budget;
      budget.available = gpu_budget(options, cuda::device_info(cuda_options.device));
      cuda::PlanShape shape{0, options.n_seq, cuda_options.max_batch, 32, 0, options.kv_type};
      budget.fixed = cuda::plan_memory(model.hparams, model.weights, shape).total();
      budget.per_position = kv_bytes_per_position(model.hparams, options.kv_type);
      const int n_ctx = resolve_context_size(model, options.n_ctx, budget);
      cuda_options.n_ctx = n_ctx;
      cuda_options.kv_blocks = kv_pool_blocks(options, n_ctx, budget, budget.per_position * backend::kKvBlockSize);
      shape.n_ctx = n_ctx;
      shape.kv_blocks = cuda_options.kv_blocks;
      // All layers asked for on one GPU: its plan says whether they fit.
      const bool fits = cuda::plan_memory(model.hparams, model.weights, shape).total() <= budget.available;
      if (fits || (options.gpu_layers >= n_layer && gpus.size() == 1)) {
        return std::make_unique<cuda::CudaBackend>(model.hparams, model.weights, cuda_options);
      }
      std::fprintf(stderr, "note: the model does not fit GPU %d: it is split\n", gpus.front());
      if (auto rows = rows_if_possible()) return rows;
    }
    return make_split_backend(model, options, gpus);
  }
#endif
  if (options.gpu >= 0 && !options.force_cpu && options.gpu_layers != 0) throw Error("--gpu was given but no CUDA GPU is available (or this build has no CUDA backend)");
  if (!options.force_cpu && options.gpu_layers != 0) {
    const char* asked = options.gpu_layers > 0 ? "--gpu-layers" : !options.gpus.empty() ? "--gpus"
                        : !options.tensor_split.empty() ? "--tensor-split"
                        : options.split_mode == SplitMode::Row ? "--split-mode row" : nullptr;
    if (asked != nullptr) {
      throw Error(std::string(asked) + " was given but no CUDA GPU is available (or this build has no CUDA backend)");
    }
  }
  const MemoryBudget budget = cpu_budget(model, options);
  const int n_ctx = resolve_context_size(model, options.n_ctx, budget);
  return make_cpu_backend(model, options, n_ctx,
                          kv_pool_blocks(options, n_ctx, budget, budget.per_position * backend::kKvBlockSize), {});
}

}  // namespace m40::engine

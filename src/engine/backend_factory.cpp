#include "engine/backend_factory.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include <cstdlib>

#include "backends/cpu/cpu_backend.h"
#include "backends/kv_blocks.h"
#include "backends/pipeline/pipeline_backend.h"
#include "common/error.h"
#include "engine/layer_placement.h"
#ifdef M40_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/memory_plan.h"
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
// The first layers on the CPU, the last ones (options.gpu_layers, or as
// many as fit `gpu_bytes_available`) and the output head on the GPU. The
// context and the KV pool are sized by the CPU's budget, which holds most
// of the model; the GPU's stage must fit its own.
std::unique_ptr<backend::Backend> make_offloaded_backend(const model::LoadedModel& model, const BackendOptions& options,
                                                         cuda::CudaBackendOptions cuda_options, uint64_t gpu_bytes_available) {
  const int n_layer = static_cast<int>(model.hparams.n_layer);
  const MemoryBudget budget = cpu_budget(model, options);
  const int n_ctx = choose_context_size(static_cast<int>(model.hparams.n_ctx_train), options.n_ctx, budget);
  const int kv_blocks = kv_pool_blocks(options, n_ctx, budget, budget.per_position * backend::kKvBlockSize);
  cuda_options.n_ctx = n_ctx;
  cuda_options.kv_blocks = kv_blocks;
  int gpu_layers = options.gpu_layers;
  if (gpu_layers < 0) {
    gpu_layers = gpu_layers_that_fit(
        n_layer,
        [&](int g) {
          const cuda::PlanShape shape{n_ctx,     options.n_seq,        cuda_options.max_batch, 32,
                                      kv_blocks, options.kv_type, backend::LayerRange{n_layer - g, n_layer}};
          return cuda::plan_memory(model.hparams, model.weights, shape).total();
        },
        gpu_bytes_available);
    std::fprintf(stderr, "note: the model does not fit GPU %d with a context of %d: %s\n", cuda_options.device, n_ctx,
                 describe_offload(n_layer, gpu_layers, cuda_options.device).c_str());
    if (gpu_layers == 0) return make_cpu_backend(model, options, n_ctx, kv_blocks, {});
  }
  const int first_gpu_layer = n_layer - gpu_layers;
  std::vector<std::unique_ptr<backend::Backend>> stages;
  stages.push_back(make_cpu_backend(model, options, n_ctx, kv_blocks, {0, first_gpu_layer}));
  cuda_options.layers = {first_gpu_layer, n_layer};
  stages.push_back(std::make_unique<cuda::CudaBackend>(model.hparams, model.weights, cuda_options));
  return std::make_unique<backend::PipelineBackend>(std::move(stages), n_layer);
}
#endif

}  // namespace

std::unique_ptr<backend::Backend> make_backend(const model::LoadedModel& model, const BackendOptions& options) {
  if (options.force_cpu && options.gpu_layers > 0) {
    throw Error("--cpu runs no layer on the GPU and --gpu-layers " + std::to_string(options.gpu_layers) +
                " asks for some: give one of them");
  }
#ifdef M40_HAVE_CUDA
  if (!options.force_cpu && options.gpu_layers != 0 && gpu_available()) {
    if (options.kv_type == backend::KvType::F32) {
      throw Error("the CUDA backend keeps its KV cache in FP16 or Q8_0: use --cpu for f32");
    }
    cuda::CudaBackendOptions cuda_options;
    cuda_options.device = chosen_gpu(options.gpu);
    cuda_options.n_seq = options.n_seq;
    // The GPU's budget: the memory plan without any context, and what one
    // position adds to it.
    const cuda::DeviceInfo info = cuda::device_info(cuda_options.device);
    MemoryBudget budget;
    budget.available = options.vram_budget > 0 ? std::min<uint64_t>(options.vram_budget, info.free_memory_bytes)
                                               : info.free_memory_bytes;
    cuda_options.kv_type = options.kv_type;
    cuda::PlanShape shape{0, options.n_seq, cuda_options.max_batch, 32, 0, options.kv_type};
    budget.fixed = cuda::plan_memory(model.hparams, model.weights, shape).total();
    budget.per_position = kv_bytes_per_position(model.hparams, options.kv_type);
    const int n_ctx = resolve_context_size(model, options.n_ctx, budget);
    cuda_options.n_ctx = n_ctx;
    cuda_options.kv_blocks = kv_pool_blocks(options, n_ctx, budget, budget.per_position * backend::kKvBlockSize);
    cuda_options.n_seq = options.n_seq;
    cuda_options.vram_budget = options.vram_budget;
    const int n_layer = static_cast<int>(model.hparams.n_layer);
    shape.n_ctx = n_ctx;
    shape.kv_blocks = cuda_options.kv_blocks;
    const bool whole = options.gpu_layers >= n_layer ||
                       (options.gpu_layers < 0 &&
                        cuda::plan_memory(model.hparams, model.weights, shape).total() <= budget.available);
    if (whole) return std::make_unique<cuda::CudaBackend>(model.hparams, model.weights, cuda_options);
    return make_offloaded_backend(model, options, cuda_options, budget.available);
  }
#endif
  if (options.gpu >= 0 && !options.force_cpu && options.gpu_layers != 0) throw Error("--gpu was given but no CUDA GPU is available (or this build has no CUDA backend)");
  if (options.gpu_layers > 0) {
    throw Error("--gpu-layers was given but no CUDA GPU is available (or this build has no CUDA backend)");
  }
  const MemoryBudget budget = cpu_budget(model, options);
  const int n_ctx = resolve_context_size(model, options.n_ctx, budget);
  return make_cpu_backend(model, options, n_ctx,
                          kv_pool_blocks(options, n_ctx, budget, budget.per_position * backend::kKvBlockSize), {});
}

}  // namespace m40::engine

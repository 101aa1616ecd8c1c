#include "engine/backend_factory.h"

#include <algorithm>
#include <cstdio>

#include <cstdlib>

#include "backends/cpu/cpu_backend.h"
#include "common/error.h"
#ifdef M40_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#endif

namespace m40::engine {

int resolve_context_size(const model::LoadedModel& model, int requested) {
  const int trained = static_cast<int>(model.hparams.n_ctx_train);
  if (requested < 0) throw Error("the context size must be positive");
  if (requested == 0) return trained > 0 ? std::min(trained, 4096) : 4096;
  if (trained > 0 && requested > trained) {
    std::fprintf(stderr, "warning: context %d exceeds the %d tokens the model was trained for; "
                 "quality may degrade past that\n", requested, trained);
  }
  return requested;
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

std::unique_ptr<backend::Backend> make_backend(const model::LoadedModel& model, const BackendOptions& options) {
  const int n_ctx = resolve_context_size(model, options.n_ctx);
#ifdef M40_HAVE_CUDA
  if (!options.force_cpu && gpu_available()) {
    if (options.kv_type != backend::KvType::F16) throw Error("the CUDA backend keeps its KV cache in FP16: use --cpu for f32");
    cuda::CudaBackendOptions cuda_options;
    cuda_options.device = chosen_gpu(options.gpu);
    cuda_options.n_ctx = n_ctx;
    cuda_options.n_seq = options.n_seq;
    cuda_options.vram_budget = options.vram_budget;
    return std::make_unique<cuda::CudaBackend>(model.hparams, model.weights, cuda_options);
  }
#endif
  if (options.gpu >= 0 && !options.force_cpu) throw Error("--gpu was given but no CUDA GPU is available (or this build has no CUDA backend)");
  cpu::CpuBackendOptions cpu_options;
  cpu_options.n_ctx = n_ctx;
  cpu_options.n_seq = options.n_seq;
  cpu_options.kv_type = options.kv_type;
  cpu_options.threads = options.threads;
  return std::make_unique<cpu::CpuBackend>(model.hparams, model.weights, cpu_options);
}

}  // namespace m40::engine

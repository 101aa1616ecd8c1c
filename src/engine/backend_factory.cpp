#include "engine/backend_factory.h"

#include <algorithm>
#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "common/error.h"

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

std::unique_ptr<backend::Backend> make_backend(const model::LoadedModel& model, const BackendOptions& options) {
  cpu::CpuBackendOptions cpu_options;
  cpu_options.n_ctx = resolve_context_size(model, options.n_ctx);
  cpu_options.n_seq = options.n_seq;
  cpu_options.kv_type = options.kv_type;
  cpu_options.threads = options.threads;
  return std::make_unique<cpu::CpuBackend>(model.hparams, model.weights, cpu_options);
}

}  // namespace m40::engine

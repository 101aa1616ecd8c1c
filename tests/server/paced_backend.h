// The real backend, made slower per step and stoppable at a gate, so server
// tests can hold requests in the engine as long as they need (bounded
// waits only).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "backends/backend.h"
#include "wrapped_backend.h"

namespace m40::test {

struct Pacing {
  std::atomic<int> delay_ms{0};
  std::atomic<bool> gate_open{true};
};

class PacedBackend : public WrappedBackend {
 public:
  PacedBackend(std::unique_ptr<backend::Backend> inner, std::shared_ptr<Pacing> pacing)
      : WrappedBackend(std::move(inner)), pacing_(std::move(pacing)) {}
  void forward(const backend::Batch& batch, std::span<float> logits) override {
    for (int i = 0; i < 3000 && !pacing_->gate_open.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (int d = pacing_->delay_ms.load(); d > 0) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    inner().forward(batch, logits);
  }

 private:
  std::shared_ptr<Pacing> pacing_;
};

}  // namespace m40::test

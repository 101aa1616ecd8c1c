// A backend that passes everything to another one: the tests' slow, gated,
// faulty and recording backends derive from it and override forward().
#pragma once

#include <memory>
#include <span>
#include <string>

#include "backends/backend.h"

namespace m40::test {

class WrappedBackend : public backend::Backend {
 public:
  // Owns `inner`.
  explicit WrappedBackend(std::unique_ptr<backend::Backend> inner) : owned_(std::move(inner)), inner_(*owned_) {}
  // Uses `inner`, which must outlive this.
  explicit WrappedBackend(backend::Backend& inner) : inner_(inner) {}

  std::string name() const override { return inner_.name(); }
  int n_ctx() const override { return inner_.n_ctx(); }
  int n_seq_max() const override { return inner_.n_seq_max(); }
  int n_vocab() const override { return inner_.n_vocab(); }
  int n_embd() const override { return inner_.n_embd(); }
  int n_kv_blocks() const override { return inner_.n_kv_blocks(); }
  uint64_t memory_bytes() const override { return inner_.memory_bytes(); }
  uint64_t gpu_memory_bytes() const override { return inner_.gpu_memory_bytes(); }
  void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) override {
    inner_.set_blocks(seq, blocks, n_cached);
  }
  void copy_block(int32_t src, int32_t dst) override { inner_.copy_block(src, dst); }
  void forward(const backend::Batch& batch, std::span<float> logits) override { inner_.forward(batch, logits); }
  backend::SliceSupport layer_slices() const override { return inner_.layer_slices(); }

 protected:
  backend::Backend& inner() { return inner_; }

 private:
  std::unique_ptr<backend::Backend> owned_;
  backend::Backend& inner_;
};

}  // namespace m40::test

// A model split over devices by layers (llama.cpp's --split-mode layer,
// and its -ngl CPU offload): a chain of stages, each a backend that
// computes a contiguous range of layers (Backend::layers()). The first
// embeds the tokens, the last computes the outputs; a step runs them in
// order and hands each token's hidden state (n_embd floats) from one to
// the next through host memory. Every stage keeps K and V of its own
// layers in a pool of the same blocks, so the block tables, block copies
// and the engine's prefix reuse (KvBlockPool) apply to all of them at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace m40::backend {

class PipelineBackend : public Backend {
 public:
  // `stages` in layer order. Throws m40::Error unless they cover layers
  // [0, n_layer) one after another, each at least one layer, and agree on
  // the context, the sequences, the vocabulary and the hidden width.
  PipelineBackend(std::vector<std::unique_ptr<Backend>> stages, int n_layer);

  // "CPU (layers 0-9) + CUDA:0 (layers 10-31)"
  std::string name() const override;
  int n_ctx() const override { return stages_.front()->n_ctx(); }
  int n_seq_max() const override { return stages_.front()->n_seq_max(); }
  int n_vocab() const override { return stages_.back()->n_vocab(); }
  int n_embd() const override { return stages_.back()->n_embd(); }
  // Every stage's memory together.
  uint64_t memory_bytes() const override;
  uint64_t gpu_memory_bytes() const override;

  // The blocks every stage has (block ids below it are valid in all).
  int n_kv_blocks() const override;
  void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) override;
  void copy_block(int32_t src, int32_t dst) override;

  void forward(const Batch& batch, std::span<float> logits) override;

  size_t n_stages() const { return stages_.size(); }
  const Backend& stage(size_t i) const { return *stages_.at(i); }

 private:
  // Block ids checked against the smallest pool before any stage takes
  // them, so that no stage holds a table or copy another refuses.
  void check_blocks(std::span<const int32_t> blocks) const;

  std::vector<std::unique_ptr<Backend>> stages_;
  std::vector<float> hidden_;  // the hand-over between stages, kept between steps
};

}  // namespace m40::backend

// A model split by rows (llama.cpp's --split-mode row; tensor parallelism):
// every shard holds every layer's slices (model/row_split.h) and computes
// its share of each product, so a decode step reads all the GPUs' memory at
// once instead of one after the other as a layer split does. A step runs
// every shard at once, each on its own host thread (Backend::forward_shard);
// after each branch the shards add their partial sums through the group
// they share (backends/shard_group.h) and go on with identical hidden
// states. Shard 0 computes the outputs. The CUDA backend's shards are the
// product (cuda/row_split.h); the CPU backend's (cpu/row_split.h) are its
// reference, testable without GPUs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/shard_group.h"

namespace m40::backend {

class RowSplitBackend : public Backend {
 public:
  // `shards` in shard order, built with `group` (which they point to).
  // Throws m40::Error unless they agree on the context, the sequences, the
  // vocabulary and the hidden width, and number as the group says.
  RowSplitBackend(std::unique_ptr<ShardGroup> group, std::vector<std::unique_ptr<Backend>> shards);
  ~RowSplitBackend() override;

  // "CUDA:0 + CUDA:1 (row split)"
  std::string name() const override;
  int n_ctx() const override { return shards_.front()->n_ctx(); }
  int n_seq_max() const override { return shards_.front()->n_seq_max(); }
  int n_vocab() const override { return shards_.front()->n_vocab(); }
  int n_embd() const override { return shards_.front()->n_embd(); }
  uint64_t memory_bytes() const override;
  uint64_t gpu_memory_bytes() const override;

  int n_kv_blocks() const override { return shards_.front()->n_kv_blocks(); }
  void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) override;
  void copy_block(int32_t src, int32_t dst) override;
  void forward(const Batch& batch, std::span<float> logits) override;

  size_t n_shards() const { return shards_.size(); }
  const Backend& shard(size_t i) const { return *shards_.at(i); }

 private:
  std::unique_ptr<ShardGroup> group_;  // declared first: outlives the shards that point to it
  std::vector<std::unique_ptr<Backend>> shards_;
};

}  // namespace m40::backend

// A model split over GPUs by rows (llama.cpp's --split-mode row; tensor
// parallelism): every GPU holds every layer's slices (model/row_split.h)
// and computes its share of each product, so a decode step reads all the
// GPUs' memory at once instead of one after the other as a layer split
// does. A step runs every shard at once, each on its own host thread;
// after each branch the shards add their partial sums (ShardExchange) and
// go on with identical hidden states. Shard 0 computes the outputs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/shard_exchange.h"

namespace m40::cuda {

class RowSplitBackend : public backend::Backend {
 public:
  // One shard per GPU of `devices`, the layers divided by `shares` (one
  // per GPU, model::plan_row_split); `options` as for one CudaBackend
  // (its device, shard and exchange are set here). Throws m40::Error where
  // the model cannot be split so or a shard does not fit its GPU.
  RowSplitBackend(const model::ModelHparams& hparams, const model::ModelWeights& weights, CudaBackendOptions options,
                  const std::vector<int>& devices, const std::vector<double>& shares);
  ~RowSplitBackend() override;

  // "CUDA:0 + CUDA:1 (row split)"
  std::string name() const override;
  int n_ctx() const override { return shards_.front()->n_ctx(); }
  int n_seq_max() const override { return shards_.front()->n_seq_max(); }
  int n_vocab() const override { return shards_.front()->n_vocab(); }
  int n_embd() const override { return shards_.front()->n_embd(); }
  uint64_t memory_bytes() const override;
  uint64_t gpu_memory_bytes() const override { return memory_bytes(); }

  int n_kv_blocks() const override { return shards_.front()->n_kv_blocks(); }
  void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) override;
  void copy_block(int32_t src, int32_t dst) override;
  void forward(const backend::Batch& batch, std::span<float> logits) override;

  size_t n_shards() const { return shards_.size(); }
  const CudaBackend& shard(size_t i) const { return *shards_.at(i); }

 private:
  std::unique_ptr<ShardExchange> exchange_;  // declared first: outlives the shards that point to it
  std::vector<std::unique_ptr<CudaBackend>> shards_;
};

}  // namespace m40::cuda

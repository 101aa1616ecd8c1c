// The CPU backend: the forward pass of every runnable architecture in FP32 over weights read straight
// from the GGUF mapping, a KV cache in FP16 (or FP32), and a thread pool over
// matrix rows and attention heads.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "backends/block_tables.h"
#include "backends/layer_slices.h"
#include "backends/cpu/kv_cache.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/shard_sums.h"
#include "backends/cpu/thread_pool.h"
#include "model/hparams.h"
#include "model/row_split.h"
#include "model/weights.h"

namespace m40::cpu {

struct CpuBackendOptions {
  int n_ctx = 2048;
  int n_seq = 1;
  int kv_blocks = 0;  // blocks in the KV pool; 0: n_seq * kv_blocks_for(n_ctx), a whole context per sequence
  backend::KvType kv_type = backend::KvType::F16;
  unsigned threads = 0;  // 0: every core
  // The layers it computes: {0, 0} (the default) for all of them, else one
  // stage of a model split over devices (Backend::forward_stage). Its KV
  // cache holds those layers only.
  backend::LayerRange layers{};
  // One shard of a model split by rows (model/row_split.h; cpu/row_split.h
  // builds them, the reference of the CUDA shards): its slices of every
  // layer (the output and down products' columns copied, the rest viewed),
  // its heads' K/V, its branches' partial sums added through `sums`; shard
  // 0 computes the outputs.
  model::RowShard shard{};
  ShardSums* sums = nullptr;
};

class CpuBackend : public backend::Backend {
 public:
  // `weights` views the model's mapping, which must outlive the backend.
  CpuBackend(const model::ModelHparams& hparams, const model::ModelWeights& weights, CpuBackendOptions options);

  std::string name() const override { return "CPU"; }
  int n_ctx() const override { return options_.n_ctx; }
  int n_seq_max() const override { return options_.n_seq; }
  int n_vocab() const override { return static_cast<int>(hparams_.n_vocab); }
  int n_embd() const override { return static_cast<int>(hparams_.n_embd); }
  unsigned threads() const { return pool_.size(); }
  // K and V of the layers it computes: the cache's layer i is the model's
  // layers().first + i.
  const KvCache& kv_cache() const { return kv_; }
  int n_kv_blocks() const override { return kv_.n_blocks(); }
  // The mapped weights it reads (ModelWeights::stage_bytes of its layers)
  // and the KV pool (a step's activations come and go).
  uint64_t memory_bytes() const override;
  void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) override;
  void copy_block(int32_t src, int32_t dst) override;

  void forward(const backend::Batch& batch, std::span<float> logits) override;
  // Layer slices of any size, where it holds the whole model.
  backend::SliceSupport layer_slices() const override;
  backend::LayerRange layers() const override { return layers_; }
  void forward_stage(const backend::Batch& batch, std::span<float> hidden, std::span<float> out) override;
  void forward_shard(const backend::Batch& batch, std::span<float> out) override;

 private:
  // The residual stream x after layers_ (embedded from the batch's tokens
  // at layer 0, else read from `hidden_in`).
  void run_layers(const backend::Batch& batch, std::span<const float> hidden_in, std::vector<float>& x);
  // The output norm and head (or the hidden states) of the tokens that
  // want an output.
  void write_outputs(const backend::Batch& batch, const std::vector<float>& x, std::span<float> out);

  // A shard's view of the weights: row slices of the model's mapping, its
  // columns of the output and down products in column_copies_.
  void slice_weights(const model::ModelHparams& model_hparams);
  // After a branch's output product: a shard's partial sum becomes the
  // shards' sum.
  void add_shard_partials(float* branch, int64_t n);

  model::ModelHparams hparams_;  // a row split's shard: its own heads and FFN width (model::shard_hparams)
  const model::ModelWeights* weights_;  // the model's, or shard_weights_
  model::ModelWeights shard_weights_;
  std::vector<std::vector<uint8_t>> column_copies_;
  CpuBackendOptions options_;
  backend::LayerRange layers_;
  ThreadPool pool_;
  KvCache kv_;
  std::vector<float> rope_freq_factors_;
  std::vector<RopeParams> layer_rope_;  // per layer; only where hparams_.rope_layers says it applies
  // The layers' vectors (norms, biases) as floats; empty where a layer has none.
  std::vector<std::vector<float>> attn_norm_, ffn_norm_, bq_, bk_, bv_, bo_, q_norm_, k_norm_, post_attn_norm_,
      post_ffn_norm_;
  std::vector<float> output_norm_;
  backend::BlockTables tables_;
  backend::SliceTracker slices_;
  std::vector<float> slice_hidden_;  // the slice in flight's hidden states after its last layer so far
};

}  // namespace m40::cpu

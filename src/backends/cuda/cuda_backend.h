// The CUDA backend: weights uploaded once in their GGUF types, the forward
// pass as a sequence of our own kernels on one stream, following the
// architecture's features per layer as cpu::CpuBackend::forward does (the
// reference), the KV cache in FP16 (or Q8_0) on the device, and each decode step
// replayed from a CUDA graph captured per batch size (launch overhead matters
// at ~1 ms per token; per-layer settings are constants of the graph).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/block_tables.h"
#include "backends/layer_slices.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/cuda/matmul.h"
#include "backends/cuda/memory_plan.h"
#include "backends/cuda/shard_exchange.h"
#include "backends/cuda/stage_timer.h"
#include "model/hparams.h"
#include "model/row_split.h"
#include "model/weights.h"

namespace m40::cuda {

struct CudaBackendOptions {
  int device = 0;
  int n_ctx = 2048;
  int n_seq = 1;
  uint64_t vram_budget = 0;  // 0: the device's free memory; otherwise a cap (e.g. 24 GiB to plan as on an M40)
  bool use_graphs = true;
  int max_batch = 512;       // prompt tokens per internal chunk
  int kv_blocks = 0;         // KV pool blocks (kv_blocks.h); 0: n_seq * kv_blocks_for(n_ctx)
  backend::KvType kv_type = backend::KvType::F16;  // F16 or Q8_0 (kv_dim a multiple of 32)
  // The layers on this GPU: {0, 0} (the default) for all of them, else one
  // stage of a model split over devices (Backend::forward_stage), holding
  // those layers' weights and K/V only (PlanShape::layers).
  backend::LayerRange layers{};
  // One shard of a row split (model/row_split.h; cuda/row_split.h builds them):
  // this GPU's slices of every layer, its branches' partial sums added to
  // the other shards' through `exchange`; shard 0 computes the outputs.
  model::RowShard shard{};
  ShardExchange* exchange = nullptr;
};

// The positions a decode graph's attention is sized for, when the step's
// tokens see at most max_positions: the power of two from one split
// granule (kAttentionSplitGranule, 64) up that holds them, capped at the
// context. The split attention plans its parts for the span
// it is given, so a graph sized for the whole context would launch (and
// combine) parts for positions a short conversation does not have; one
// graph per span and batch size keeps that cost to at most twice the
// positions present.
int decode_graph_span(int max_positions, int n_ctx);

class CudaBackend : public backend::Backend {
 public:
  // Plans memory (throws m40::Error with the numbers if it does not fit),
  // then uploads the weights from the mapping through pinned staging memory.
  CudaBackend(const model::ModelHparams& hparams, const model::ModelWeights& weights, CudaBackendOptions options);
  ~CudaBackend() override;

  std::string name() const override;
  int n_ctx() const override { return options_.n_ctx; }
  int n_seq_max() const override { return options_.n_seq; }
  int n_vocab() const override { return static_cast<int>(hparams_.n_vocab); }
  int n_embd() const override { return static_cast<int>(hparams_.n_embd); }
  const MemoryPlan& memory_plan() const { return plan_; }
  uint64_t memory_bytes() const override { return plan_.total(); }
  uint64_t gpu_memory_bytes() const override { return plan_.total(); }

  int n_kv_blocks() const override { return tables_.n_blocks(); }
  void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) override;
  void copy_block(int32_t src, int32_t dst) override;
  void forward(const backend::Batch& batch, std::span<float> logits) override;
  // Layer slices of up to max_batch tokens in all, where it holds the
  // whole model on one GPU.
  backend::SliceSupport layer_slices() const override;
  backend::LayerRange layers() const override { return stage_; }
  void forward_stage(const backend::Batch& batch, std::span<float> hidden, std::span<float> out) override;
  void forward_shard(const backend::Batch& batch, std::span<float> out) override;

 private:
  struct LayerOnDevice {
    const float* attn_norm;
    DeviceWeight wq, wk, wv, wo;
    const float* ffn_norm;
    DeviceWeight w_gate, w_up, w_down;
    // Optional vectors (null where the layer has none): Q/K/V and output
    // biases, per-head Q/K norms, post-norms of the two branches.
    const float *bq, *bk, *bv, *bo;
    const float *q_norm, *k_norm;
    const float *post_attn_norm, *post_ffn_norm;
    // The same matrices read as one for fused decode products (rows 0 when
    // they are not back to back in one type): Q, K and V (qkv_parts = 3), or
    // Q and K (2) when V has another type; gate and up.
    DeviceWeight wqkv;
    int qkv_parts = 0;
    DeviceWeight w_gate_up;
    // Mixture-of-experts layers (router.rows 0: a dense FFN): the router
    // [n_embd -> n_expert] and the experts' matrices, stacked (moe.h);
    // where gate and up have one type, each expert's gate rows then its up
    // rows in gate_up_exps (one grouped product for both), else
    // gate_exps and up_exps.
    DeviceWeight router, gate_up_exps, gate_exps, up_exps, down_exps;
    // A shared expert beside the routed ones (qwen2moe; shexp_down.rows 0:
    // none): its gate's row, gate, up and down; the router's rows then the
    // gate's row as one matrix, and gate then up (rows 0 where they are not
    // back to back in one type).
    DeviceWeight shexp_gate_inp, shexp_gate, shexp_up, shexp_down;
    DeviceWeight router_and_shexp_gate, shexp_gate_up;
  };

  class Uploader;
  // The constructor's part that creates the streams and allocates and
  // uploads everything (the constructor destroys the streams if it throws).
  void allocate(const model::ModelWeights& weights);
  void destroy_streams();
  void upload_weights(const model::ModelWeights& weights);
  DeviceWeight upload_matrix(const model::WeightView& w, Uploader& uploader);
  // Columns [first, end) of every row of w (a row split's share of the
  // output and down products).
  DeviceWeight upload_columns(const model::WeightView& w, uint64_t first, uint64_t end, Uploader& uploader);
  // Expert e's gate rows then its up rows, for every expert: one matrix of
  // n_expert x (gate rows + up rows).
  DeviceWeight upload_interleaved(const std::vector<model::WeightView>& gate, const std::vector<model::WeightView>& up,
                                  Uploader& uploader);
  const float* upload_vector(const model::WeightView& w);
  // Enqueues the layers for the n tokens already in the device id buffers,
  // leaving the hidden states in x_.
  // The first n_single tokens are each their sequence's only token in the
  // step (decode tokens of a mixed batch): their attention runs as its own
  // decode-kernel call, sized by max_single_positions (0: no split).
  void enqueue_layers(int n_tokens, int max_positions, int n_single_tokens = 0, int max_single_positions = 0,
                      const backend::LayerSlice& slice = {});
  // A layer's Q, K and V products of xn_ into q_, k_ and v_.
  void enqueue_qkv(const LayerOnDevice& w, int n);
  // A dense layer's FFN (gate and up, activation, down joined to x_) on
  // xn_, or with norm_due on x_ normalized by the FFN norm first (folded
  // into the gate/up product where it can be); true when the join also
  // normalized x for the next layer.
  bool enqueue_dense_ffn(const LayerOnDevice& w, int n, const float* next_attn_norm, bool norm_due);
  // A branch's output product W h joining the residual stream x_: fused
  // into the product's epilogue for plain layers, else through xn_ (free
  // once the branch's input products have read it) and add_branch, which
  // then also writes rms_norm(x) * next_norm to xn_ when next_norm is given.
  // Returns whether it did (xn_ then holds the next stage's input).
  bool enqueue_branch_output(const DeviceWeight& w, const float* h, const float* bias, const float* post_norm, int n,
                             const char* stage, const float* next_norm);
  // The same for a branch whose output product(y, residual, next) computes
  // (y = residual + the branch, residual null or y). A product that can also
  // write next.out = rms_norm(y) * next.weight (product_normalizes: the MoE
  // combination) is given the next norm where the join is plain.
  using BranchProduct = std::function<void(float* y, const float* residual, const NextNorm& next)>;
  bool join_branch(const BranchProduct& product, const float* bias, const float* post_norm, int n, const char* stage,
                   const float* next_norm, bool product_normalizes = false);
  // The FFN of a mixture-of-experts layer on xn_ (moe.h), joined like
  // enqueue_branch_output (cuda_backend_moe.cpp).
  bool enqueue_moe_ffn(const LayerOnDevice& w, int n, const float* next_norm);
  // One of the products that read xn_ together: W · xn_ into y.
  struct XnProduct {
    const DeviceWeight* w;
    float* y;
  };
  // The products W_i · xn_ for n tokens: one launch over `fused` (the W_i
  // back to back; rows 0 where they are not) where the decode kernel takes
  // it (matvec_parts), else one product each.
  void enqueue_xn_products(const DeviceWeight& fused, std::initializer_list<XnProduct> products, int n);
  // Captures a decode step of n tokens (the layers, and the outputs where
  // this GPU computes them) with the attention sized for `span` positions
  // as a graph; a row split's shards capture one graph together
  // (ShardExchange::begin_capture), which shard 0 gets, the others null.
  cudaGraphExec_t capture_decode_graph(int n, int span);
  // Final norm and output head (with the logits' scale and soft-cap) for
  // n_out consecutive hidden-state rows.
  void enqueue_output(const float* rows, int n_out);
  // The chunk [begin, end) of a step. A stage that does not hold layer 0
  // reads the chunk's hidden states from `hidden` (n_embd floats per batch
  // token), one that does not hold the last writes them back there.
  void run_chunk(const backend::Batch& batch, size_t begin, size_t end, float* hidden, float* logits_out,
                 size_t& logits_written);
  // forward() and forward_stage() after their checks.
  void run_step(const backend::Batch& batch, float* hidden, float* out);
  bool holds_input() const { return stage_.first == 0; }
  bool holds_output() const { return stage_.end == static_cast<int>(hparams_.n_layer); }
  // Holds the last layer and is the shard that computes the outputs (the
  // only one of a row split that holds the output head).
  bool computes_output() const { return holds_output() && options_.shard.index == 0; }
  bool sharded() const { return !options_.shard.whole(); }
  // Batch::output_embeddings: the final norm of the chunk's n hidden states
  // (in x_), the wanted rows copied to `out` (n_embd floats each); no
  // output head.
  void copy_hidden_states(const backend::Batch& batch, size_t begin, int n, float* out, size_t& rows_written);
  // Enqueues the upload of the block tables when set_blocks changed them.
  void upload_tables();

  model::ModelHparams hparams_;  // a row split's shard: its own heads and FFN width (model::shard_hparams)
  CudaBackendOptions options_;
  model::ShardRows shard_rows_;   // the rows (and columns) of the model's matrices this GPU holds
  backend::LayerRange stage_;  // the layers on this GPU; layers_[i] is layer stage_.first + i
  std::string device_name_;
  MemoryPlan plan_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;

  Arena weights_arena_;
  DeviceWeight token_embd_, output_;
  const float* output_norm_ = nullptr;
  const float* rope_factors_ = nullptr;  // the set n_ctx selects (rope_freqs, LongRoPE short or long)
  std::vector<LayerOnDevice> layers_;

  // The paged KV pool: per layer, K then V, each n_kv_blocks x 16 rows of
  // kv_dim halves or kv_dim / 32 Q8_0 blocks; every KvLayer reads the block
  // tables from block_tables_.
  DeviceAllocation kv_memory_;
  uint64_t kv_half_bytes_ = 0;  // one layer's K (or V) pool
  std::vector<KvLayer> kv_layers_;
  backend::BlockTables tables_;
  backend::SliceTracker slices_;
  int32_t* block_tables_ = nullptr;  // device copy of tables_.flat(), in scratch_
  PinnedBuffer host_tables_;         // its staging copy
  bool tables_dirty_ = true;         // set_blocks changed tables_ since the last upload

  Arena scratch_;
  float *x_, *xn_, *q_, *k_, *v_, *attn_, *gate_, *up_, *logits_, *gathered_;
  int32_t *tokens_, *positions_, *seq_ids_;
  // The layer slice in flight's hidden states between steps ([max_batch][n_embd]).
  float* slice_hidden_ = nullptr;
  // MoE layers' buffers (null for dense models): per token the router's
  // logits, per slot (token x chosen expert) the expert and its weight,
  // the slots in expert order and each slot's row there, the work items,
  // and the rows in expert order: x, gate, up and the expert's output.
  float* router_logits_ = nullptr;
  int32_t *expert_ids_ = nullptr, *sorted_slots_ = nullptr, *slot_rows_ = nullptr;
  float* expert_weights_ = nullptr;
  ExpertItem* expert_items_ = nullptr;
  // gate_up_ holds [slots][2 n_ff_expert] (the fused product) or gate
  // then up, [slots][n_ff_expert] each; act_ silu(gate) * up.
  float *expert_x_ = nullptr, *expert_gate_up_ = nullptr, *expert_act_ = nullptr, *expert_out_ = nullptr;
  // A shared expert's gate logit per token and its output ([b][n_embd]).
  float *shexp_logit_ = nullptr, *shexp_out_ = nullptr;
  PinnedBuffer host_ids_;     // tokens, positions, seq ids staged for upload
  PinnedBuffer host_logits_;  // max_logit_rows x n_vocab
  PinnedBuffer host_hidden_;  // a stage's hand-over: max_batch x n_embd
  int max_logit_rows_ = 32;

  // By batch size and decode_graph_span (null: a row split's shard other than 0).
  std::map<std::pair<int, int>, cudaGraphExec_t> decode_graphs_;
  StageTimer stage_timer_;  // M40_CUDA_STAGE_TIMES=1: GPU time per stage, printed at the end
};

}  // namespace m40::cuda

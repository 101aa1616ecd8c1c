#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "backends/cuda/device.h"
#include "backends/cuda/moe.h"
#include "backends/kv_blocks.h"
#include "common/error.h"

namespace m40::cuda {

namespace {

// The sequences' block tables over the pool the options ask for, after the
// options' own checks (so a bad option is named as such).
backend::BlockTables block_tables_for(const CudaBackendOptions& o) {
  if (o.n_ctx <= 0 || o.n_seq <= 0 || o.max_batch <= 0) {
    throw Error("the context size, sequence count and batch size must be positive");
  }
  if (o.kv_blocks < 0) throw Error("the KV block count must not be negative (0: one context per sequence)");
  return backend::BlockTables(o.n_seq, o.n_ctx, PlanShape{o.n_ctx, o.n_seq, 1, 1, o.kv_blocks}.kv_pool_blocks());
}

}  // namespace

CudaBackend::CudaBackend(const model::ModelHparams& hparams, const model::ModelWeights& weights,
                         CudaBackendOptions options)
    : hparams_(model::shard_hparams(hparams, options.shard)),
      options_(options),
      shard_rows_(model::shard_rows(hparams, options.shard)),
      stage_(backend::resolve_layers(options.layers, static_cast<int>(hparams.n_layer))),
      tables_(block_tables_for(options)),
      slices_(static_cast<int>(hparams.n_layer)) {
  if (!options.shard.whole()) {
    if (options.exchange == nullptr || options.exchange->count() != options.shard.count) {
      throw Error("a row split's shard needs the exchange of its shards");
    }
    if (stage_.size() != static_cast<int>(hparams.n_layer)) throw Error("a row split's shard holds every layer");
    if (hparams.has_experts()) throw Error("a row split divides dense layers only: use --split-mode layer");
    // A decode step's graph spans every shard's GPU, its copies between
    // them plain device copies: it needs peer access between the GPUs.
    options_.use_graphs = options.use_graphs && options.exchange->graphs_possible();
  }
  if (options.kv_type == backend::KvType::F32) {
    throw Error("the CUDA backend keeps its KV cache in FP16 or Q8_0: use --cpu for f32");
  }
  if (options.kv_type == backend::KvType::Q8_0 && hparams_.kv_dim() % 32 != 0) {  // a shard's rows where split
    throw Error("a Q8_0 KV cache needs K/V rows of a multiple of 32 values; " + hparams.architecture + " has " +
                std::to_string(hparams_.kv_dim()) + (sharded() ? " on this GPU of a row split" : "") +
                ": use --kv-type f16");
  }
  if (!attention_head_dim_supported(static_cast<int>(hparams.head_dim()))) {
    throw Error("the CUDA attention takes heads of a multiple of 4 values up to 128, or of 8 up to 256; " +
                hparams.architecture + " has " + std::to_string(hparams.head_dim()) + ": use --cpu");
  }
  if (hparams.n_expert > static_cast<uint32_t>(kMaxExperts)) {
    throw Error("the CUDA backend routes up to " + std::to_string(kMaxExperts) + " experts; " + hparams.architecture +
                " has " + std::to_string(hparams.n_expert) + ": use --cpu");
  }
  const int count = device_count();
  if (count == 0) throw Error("no CUDA GPU is available: use --cpu");
  if (options.device < 0 || options.device >= count) {
    throw Error("GPU " + std::to_string(options.device) + " does not exist (found " + std::to_string(count) + ")");
  }
  select_device(options.device);
  const DeviceInfo info = device_info(options.device);
  device_name_ = info.name;

  PlanShape shape{options.n_ctx, options.n_seq, options.max_batch, max_logit_rows_, tables_.n_blocks(), options.kv_type,
                  stage_, options.shard};
  plan_ = plan_memory(hparams, weights, shape);
  const uint64_t available =
      options.vram_budget > 0 ? std::min<uint64_t>(options.vram_budget, info.free_memory_bytes) : info.free_memory_bytes;
  check_plan_fits(plan_, available, "GPU " + std::to_string(options.device) + " (" + info.name + ")");

  // The streams are raw handles: a failure from here on (an allocation that
  // another process's memory use made fail) destroys them before it leaves,
  // since no destructor runs for a half-built object.
  try {
    allocate(weights);
  } catch (...) {
    destroy_streams();
    throw;
  }
}

void CudaBackend::allocate(const model::ModelWeights& weights) {
  M40_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  M40_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  upload_weights(weights);

  scratch_ = Arena(plan_.scratch);
  block_tables_ = static_cast<int32_t*>(scratch_.take(tables_.flat().size() * sizeof(int32_t)));
  host_tables_ = PinnedBuffer(tables_.flat().size() * sizeof(int32_t));

  // The pool: the stage's layer l's K at 2 l P and its V at (2 l + 1) P,
  // P = kv_half_bytes_.
  const int kv_dim = static_cast<int>(hparams_.kv_dim());
  kv_half_bytes_ =
      static_cast<uint64_t>(tables_.n_blocks()) * backend::kKvBlockSize * kv_row_bytes(kv_format(options_.kv_type), kv_dim);
  kv_memory_ = DeviceAllocation(2 * kv_half_bytes_ * static_cast<uint64_t>(stage_.size()));
  for (int l = 0; l < stage_.size(); ++l) {
    auto* base = static_cast<uint8_t*>(kv_memory_.data()) + 2 * kv_half_bytes_ * l;
    kv_layers_.push_back(
        {base, base + kv_half_bytes_, options_.n_ctx, kv_dim, block_tables_, tables_.max_blocks(), kv_format(options_.kv_type)});
  }

  const size_t b = options_.max_batch;
  auto floats = [&](size_t n) { return static_cast<float*>(scratch_.take(n * sizeof(float))); };
  x_ = floats(b * hparams_.n_embd);
  xn_ = floats(b * hparams_.n_embd);
  slice_hidden_ = floats(b * hparams_.n_embd);
  q_ = floats(b * hparams_.q_dim());
  attn_ = floats(b * hparams_.q_dim());
  k_ = floats(b * hparams_.kv_dim());
  v_ = floats(b * hparams_.kv_dim());
  // The dense FFN's gate and up, or a shared expert's.
  const size_t dense_ff = std::max(hparams_.n_ff, hparams_.n_ff_shared_expert);
  gate_ = floats(b * dense_ff);
  up_ = floats(b * dense_ff);
  logits_ = floats(static_cast<size_t>(max_logit_rows_) * hparams_.n_vocab);
  gathered_ = floats(static_cast<size_t>(max_logit_rows_) * hparams_.n_embd);
  tokens_ = static_cast<int32_t*>(scratch_.take(b * sizeof(int32_t)));
  positions_ = static_cast<int32_t*>(scratch_.take(b * sizeof(int32_t)));
  seq_ids_ = static_cast<int32_t*>(scratch_.take(b * sizeof(int32_t)));
  if (hparams_.has_experts()) {
    const size_t slots = b * hparams_.n_expert_used;
    router_logits_ = floats(b * hparams_.n_expert);
    expert_weights_ = floats(slots);
    auto ints = [&](size_t n) { return static_cast<int32_t*>(scratch_.take(n * sizeof(int32_t))); };
    expert_ids_ = ints(slots);
    sorted_slots_ = ints(slots);
    slot_rows_ = ints(slots);
    expert_items_ = static_cast<ExpertItem*>(scratch_.take(slots * sizeof(ExpertItem)));  // never more items than slots
    expert_x_ = floats(slots * hparams_.n_embd);
    expert_gate_up_ = floats(2 * slots * hparams_.n_ff_expert);
    expert_act_ = floats(slots * hparams_.n_ff_expert);
    expert_out_ = floats(slots * hparams_.n_embd);
    if (hparams_.n_ff_shared_expert != 0) {
      shexp_logit_ = floats(b);
      shexp_out_ = floats(b * hparams_.n_embd);
    }
  }
  host_ids_ = PinnedBuffer(3 * b * sizeof(int32_t));
  host_logits_ = PinnedBuffer(static_cast<size_t>(max_logit_rows_) * hparams_.n_vocab * sizeof(float));
  if (!holds_input() || !holds_output()) host_hidden_ = PinnedBuffer(b * hparams_.n_embd * sizeof(float));
  if (sharded()) {
    ShardExchange& exchange = *options_.exchange;
    if (exchange.max_values() < static_cast<int64_t>(b * hparams_.n_embd)) {
      throw Error("the row split's exchange holds fewer values than a chunk's branch");
    }
    exchange.attach(options_.shard.index, floats(static_cast<size_t>(exchange.buffer_floats())));
  }
}

CudaBackend::~CudaBackend() {
  for (auto& [key, graph] : decode_graphs_) {
    if (graph != nullptr) cudaGraphExecDestroy(graph);  // a row split's shards but 0 hold none
  }
  destroy_streams();
}

void CudaBackend::destroy_streams() {
  if (stream_ != nullptr) cudaStreamDestroy(std::exchange(stream_, nullptr));
  if (copy_stream_ != nullptr) cudaStreamDestroy(std::exchange(copy_stream_, nullptr));
}

// A stage of a split model names its GPU ("CUDA:1"), the whole model on one
// GPU is "CUDA".
std::string CudaBackend::name() const {
  return holds_input() && holds_output() && !sharded() ? "CUDA" : "CUDA:" + std::to_string(options_.device);
}

namespace {

// One layer's RoPE as cpu::rope_params describes it, on the device.
RopeConfig rope_config(const model::ModelHparams& hp, const model::RopeSettings& settings, const float* factors) {
  RopeConfig c;
  c.head_dim = static_cast<int>(hp.head_dim());
  c.n_rot = static_cast<int>(hp.n_rot);
  c.freq_base = settings.freq_base;
  c.freq_scale = settings.freq_scale;
  c.ext_factor = settings.ext_factor;
  c.corr_low = settings.corr_low;
  c.corr_high = settings.corr_high;
  c.magnitude = settings.magnitude;
  c.neox = hp.rope_style() == model::RopeStyle::NeoX;
  c.freq_factors = factors;
  return c;
}

}  // namespace

void CudaBackend::enqueue_layers(int n_tokens, int max_positions, int n_single_tokens, int max_single_positions,
                                 const backend::LayerSlice& slice) {
  const auto& hp = hparams_;
  const int n_embd = static_cast<int>(hp.n_embd);
  const int n_head = static_cast<int>(hp.n_head);
  const int n_head_kv = static_cast<int>(hp.n_head_kv);
  const int head_dim = static_cast<int>(hp.head_dim());
  const int q_dim = static_cast<int>(hp.q_dim());
  const int kv_dim = static_cast<int>(hp.kv_dim());

  if (holds_input()) {  // a later stage finds the hidden states in x_
    embed_tokens(token_embd_, tokens_, n_tokens, x_, stream_);
    if (hp.embedding_scale != 1.0f) scale_and_cap(x_, int64_t{n_tokens} * n_embd, hp.embedding_scale, 0.0f, stream_);
    stage_timer_.mark(stream_, "embed");
  }
  // A layer slice's tokens (the last ones) pass its layers only: their
  // hidden states come from slice_hidden_ before its first layer and go
  // back there after its last (layer_slices.h; whole models only, so l is
  // the model's layer).
  const size_t slice_row_bytes = static_cast<size_t>(slice.tokens) * n_embd * sizeof(float);
  float* const slice_x = x_ + static_cast<size_t>(n_tokens - slice.tokens) * n_embd;
  bool xn_holds_attn_norm = false;  // the previous layer's branch join normalized x already
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerOnDevice& w = layers_[l];
    const auto layer = static_cast<uint32_t>(stage_.first) + static_cast<uint32_t>(l);  // the model's layer
    const int n = slice.tokens_at(n_tokens, static_cast<int>(l));
    const int n_single = std::min(n_single_tokens, n);
    if (slice.resumes_at(static_cast<int>(l))) {
      M40_CUDA_CHECK(cudaMemcpyAsync(slice_x, slice_hidden_, slice_row_bytes, cudaMemcpyDeviceToDevice, stream_));
      xn_holds_attn_norm = false;  // the join before normalized the other tokens only
    }
    // One token of Q, K and V in one streamed product folds the norm in
    // (matvec_parts_normalized); otherwise x is normalized into xn_ first.
    const OutputPart qkv[3] = {{q_, w.wq.rows}, {k_, w.wk.rows}, {v_, w.wv.rows}};
    if (!xn_holds_attn_norm && n == 1 && w.qkv_parts == 3 && w.wqkv.rows > 0 &&
        matvec_parts_normalized(w.wqkv, x_, FoldedNorm{w.attn_norm, hp.rms_eps}, qkv, 3, stream_)) {
      stage_timer_.mark(stream_, "attn_norm_qkv");
    } else {
      if (!xn_holds_attn_norm) {
        rms_norm(x_, w.attn_norm, xn_, n, n_embd, hp.rms_eps, stream_);
        stage_timer_.mark(stream_, "attn_norm");
      }
      enqueue_qkv(w, n);
      stage_timer_.mark(stream_, "qkv");
    }
    if (w.bq != nullptr) {  // the loader gives all three biases or none
      const BiasTarget biases[3] = {{q_, w.bq, q_dim}, {k_, w.bk, kv_dim}, {v_, w.bv, kv_dim}};
      add_biases(biases, 3, n, stream_);
      stage_timer_.mark(stream_, "qkv_bias");
    }
    // Per-head norms (in place), RoPE and the KV cache's append, Q's, K's
    // and V's heads in one launch (kv_append where a Q8_0 block would
    // straddle two heads). NoPE layers (smollm3) apply no RoPE.
    const model::RopeSettings rope_settings = hp.rope_for_layer(layer);
    const RopeConfig rope_cfg = rope_config(hp, rope_settings, rope_factors_);
    const KvLayer& cache = kv_layers_[l];
    const bool store = heads_can_store(cache, head_dim);
    const HeadRows heads[3] = {
        {q_, n_head, q_dim, w.q_norm},
        {k_, n_head_kv, kv_dim, w.k_norm, true, store ? HeadCache::K : HeadCache::None},
        {v_, n_head_kv, kv_dim, nullptr, false, store ? HeadCache::V : HeadCache::None}};
    norm_and_rope_heads(heads, store ? 3 : 2, n, head_dim, hp.rms_eps, positions_,
                        rope_settings.enabled ? &rope_cfg : nullptr, stream_, HeadStore{&cache, seq_ids_});
    if (!store) kv_append(cache, k_, v_, seq_ids_, positions_, n, stream_);
    stage_timer_.mark(stream_, "qk_norm_rope_kv");
    if (hp.attn_temperature_scale != 0.0f) {
      attention_temperature(q_, n, q_dim, positions_, hp.attn_temperature_scale, hp.attn_temperature_length, stream_);
      stage_timer_.mark(stream_, "q_temperature");
    }
    const AttentionShape shape{n_head, n_head_kv, head_dim, hp.attention_scale, hp.attn_softcap,
                               static_cast<int>(hp.window_of_layer(layer))};
    // The leading tokens that are each their sequence's only one go through
    // the decode kernel, however many: the prefill kernel would take each
    // as a segment of its own (7 of them beside a 64-token chunk: 2x the
    // attention time on an H200, bench_cuda_attention; a decode step of 64
    // sequences: N x). The rest (prompt chunks) take the usual choice.
    if (n_single > 0) {
      attention_decode(kv_layers_[l], shape, q_, seq_ids_, positions_, n_single, max_single_positions, attn_, stream_);
    }
    if (n_single < n) {
      const int64_t skip = int64_t{n_single} * q_dim;
      attention(kv_layers_[l], shape, q_ + skip, seq_ids_ + n_single, positions_ + n_single, n - n_single,
                max_positions, attn_ + skip, stream_);
    }
    stage_timer_.mark(stream_, "attention");
    // The FFN norm: done by a join that normalizes, else by the dense FFN
    // (folded into its gate/up product where it can) or here.
    const bool ffn_norm_due = !enqueue_branch_output(w.wo, attn_, w.bo, w.post_attn_norm, n, "attn_output", w.ffn_norm);
    const float* next_attn_norm = l + 1 < layers_.size() ? layers_[l + 1].attn_norm : nullptr;
    if (w.router.rows > 0) {
      if (ffn_norm_due) {
        rms_norm(x_, w.ffn_norm, xn_, n, n_embd, hp.rms_eps, stream_);
        stage_timer_.mark(stream_, "ffn_norm");
      }
      xn_holds_attn_norm = enqueue_moe_ffn(w, n, next_attn_norm);
    } else {
      xn_holds_attn_norm = enqueue_dense_ffn(w, n, next_attn_norm, ffn_norm_due);
    }
    if (slice.pauses_after(static_cast<int>(l), static_cast<int>(layers_.size()))) {
      M40_CUDA_CHECK(cudaMemcpyAsync(slice_hidden_, slice_x, slice_row_bytes, cudaMemcpyDeviceToDevice, stream_));
    }
  }
}

void CudaBackend::enqueue_qkv(const LayerOnDevice& w, int n) {
  // Decode steps read x once for Q, K (and V) in one launch when the
  // matrices allow it (matvec_parts), else one product each.
  if (w.qkv_parts == 3) return enqueue_xn_products(w.wqkv, {{&w.wq, q_}, {&w.wk, k_}, {&w.wv, v_}}, n);
  // V of another type than Q and K (Q6_K in half the layers of Q4_K_M
  // files): the three in one launch at one token where matvec_pair can.
  const OutputPart qk[2] = {{q_, w.wq.rows}, {k_, w.wk.rows}};
  if (w.wqkv.rows == 0 || !matvec_pair(w.wqkv, qk, 2, w.wv, v_, xn_, n, stream_)) {
    enqueue_xn_products(w.wqkv, {{&w.wq, q_}, {&w.wk, k_}}, n);
    matmul(w.wv, xn_, n, v_, nullptr, stream_);
  }
}

bool CudaBackend::enqueue_dense_ffn(const LayerOnDevice& w, int n, const float* next_attn_norm, bool norm_due) {
  const auto& hp = hparams_;
  const bool gelu = hp.desc->activation == model::FfnActivation::GeluTanh;
  // One or two tokens: the activation in the gate/up product's epilogue.
  const GatedActivation act = gelu ? GatedActivation::GeluTanh : GatedActivation::Silu;
  const bool paired = w.w_gate_up.rows == 2 * w.w_gate.rows;  // back to back (rows 0 when not)
  // One token of a streamed gate/up folds the norm in.
  if (norm_due && paired && n == 1 &&
      matvec_gated_normalized(w.w_gate_up, w.w_gate.rows, act, x_, FoldedNorm{w.ffn_norm, hp.rms_eps}, gate_,
                              stream_)) {
    stage_timer_.mark(stream_, "ffn_norm_gate_up_activation");
  } else {
    if (norm_due) {
      rms_norm(x_, w.ffn_norm, xn_, n, static_cast<int>(hp.n_embd), hp.rms_eps, stream_);
      stage_timer_.mark(stream_, "ffn_norm");
    }
    if (paired && matvec_gated(w.w_gate_up, w.w_gate.rows, act, xn_, n, gate_, stream_)) {
      stage_timer_.mark(stream_, "gate_up_activation");
    } else {
      enqueue_xn_products(w.w_gate_up, {{&w.w_gate, gate_}, {&w.w_up, up_}}, n);
      stage_timer_.mark(stream_, "gate_up");
      const int64_t ff_values = int64_t{n} * hp.n_ff;
      if (gelu) {
        gelu_mul(gate_, up_, gate_, ff_values, stream_);
      } else {
        silu_mul(gate_, up_, gate_, ff_values, stream_);
      }
      stage_timer_.mark(stream_, "ffn_activation");
    }
  }
  return enqueue_branch_output(w.w_down, gate_, nullptr, w.post_ffn_norm, n, "ffn_down", next_attn_norm);
}

void CudaBackend::enqueue_xn_products(const DeviceWeight& fused, std::initializer_list<XnProduct> products, int n) {
  if (products.size() > static_cast<size_t>(kMaxOutputParts)) throw Error("enqueue_xn_products: too many products");
  OutputPart parts[kMaxOutputParts];
  int n_parts = 0;
  for (const XnProduct& p : products) parts[n_parts++] = {p.y, p.w->rows};
  if (fused.rows > 0 && matvec_parts(fused, xn_, n, parts, n_parts, stream_)) return;
  for (const XnProduct& p : products) matmul(*p.w, xn_, n, p.y, nullptr, stream_);
}

bool CudaBackend::enqueue_branch_output(const DeviceWeight& w, const float* h, const float* bias,
                                        const float* post_norm, int n, const char* stage, const float* next_norm) {
  return join_branch([&](float* y, const float* residual, const NextNorm&) { matmul(w, h, n, y, residual, stream_); },
                     bias, post_norm, n, stage, next_norm);
}

bool CudaBackend::join_branch(const BranchProduct& product, const float* bias, const float* post_norm, int n,
                              const char* stage, const float* next_norm, bool product_normalizes) {
  const BranchJoin join{bias, post_norm, hparams_.rms_eps, hparams_.residual_scale};
  if (sharded()) {
    // This shard's partial sum of the branch, the shards' sum in xn_ (free
    // once the branch's input products have read it), then the join.
    const int shard = options_.shard.index;
    product(options_.exchange->partial(shard), nullptr, NextNorm{});
    stage_timer_.mark(stream_, stage);
    options_.exchange->all_reduce(shard, xn_, int64_t{n} * hparams_.n_embd, stream_);
    stage_timer_.mark(stream_, "shard_all_reduce");
  } else if (join.plain()) {
    // Residual add fused: x += branch; a product that can also normalize
    // x for the next stage (the MoE combination) does that too.
    const bool norms = next_norm != nullptr && product_normalizes;
    product(x_, x_, norms ? NextNorm{next_norm, xn_} : NextNorm{});
    stage_timer_.mark(stream_, stage);
    return norms;
  } else {
    product(xn_, nullptr, NextNorm{});
    stage_timer_.mark(stream_, stage);
  }
  // The join also normalizes x for the next stage, over the branch in xn.
  add_branch(x_, xn_, join, n, static_cast<int>(hparams_.n_embd), stream_, NextNorm{next_norm, next_norm ? xn_ : nullptr});
  stage_timer_.mark(stream_, "branch_join");
  return next_norm != nullptr;
}

void CudaBackend::enqueue_output(const float* rows, int n_out) {
  const auto& hp = hparams_;
  rms_norm(rows, output_norm_, xn_, n_out, static_cast<int>(hp.n_embd), hp.rms_eps, stream_);
  stage_timer_.mark(stream_, "output_norm");
  matmul(output_, xn_, n_out, logits_, nullptr, stream_);
  stage_timer_.mark(stream_, "output_head");
  if (hp.logit_scale != 1.0f || hp.final_softcap > 0.0f) {
    scale_and_cap(logits_, int64_t{n_out} * hp.n_vocab, hp.logit_scale, hp.final_softcap, stream_);
    stage_timer_.mark(stream_, "logit_scale_cap");
  }
}

void CudaBackend::run_chunk(const backend::Batch& batch, size_t begin, size_t end, float* hidden, float* logits_out,
                            size_t& logits_written) {
  const int n = static_cast<int>(end - begin);
  auto* ids = host_ids_.as<int32_t>();
  int max_positions = 0;
  bool all_want_logits = true;
  for (int i = 0; i < n; ++i) {
    ids[i] = batch.tokens[begin + i];
    ids[options_.max_batch + i] = batch.positions[begin + i];
    ids[2 * options_.max_batch + i] = batch.seq_ids[begin + i];
    max_positions = std::max(max_positions, batch.positions[begin + i] + 1);
    all_want_logits = all_want_logits && batch.want_logits[begin + i] != 0;
  }
  const size_t id_bytes = n * sizeof(int32_t);
  M40_CUDA_CHECK(cudaMemcpyAsync(tokens_, ids, id_bytes, cudaMemcpyHostToDevice, stream_));
  M40_CUDA_CHECK(cudaMemcpyAsync(positions_, ids + options_.max_batch, id_bytes, cudaMemcpyHostToDevice, stream_));
  M40_CUDA_CHECK(cudaMemcpyAsync(seq_ids_, ids + 2 * options_.max_batch, id_bytes, cudaMemcpyHostToDevice, stream_));

  const size_t n_vocab = hparams_.n_vocab;
  const size_t row_bytes = hparams_.n_embd * sizeof(float);
  float* chunk_hidden = hidden != nullptr ? hidden + begin * hparams_.n_embd : nullptr;
  if (!holds_input()) {  // the previous stage's hidden states, through pinned memory
    std::memcpy(host_hidden_.as<float>(), chunk_hidden, n * row_bytes);
    M40_CUDA_CHECK(cudaMemcpyAsync(x_, host_hidden_.as<float>(), n * row_bytes, cudaMemcpyHostToDevice, stream_));
  }
  // A stage before the last hands x_ on after its layers.
  const auto hand_over = [&] {
    M40_CUDA_CHECK(cudaMemcpyAsync(host_hidden_.as<float>(), x_, n * row_bytes, cudaMemcpyDeviceToHost, stream_));
    M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(chunk_hidden, host_hidden_.as<float>(), n * row_bytes);
  };
  // A decode step (every token wants logits, few tokens) replays a graph
  // captured once per batch size and span of positions; its kernels read
  // positions from the device, and the attention is sized for the span
  // (decode_graph_span), so the graph stays valid for every step it covers.
  // (Stage timing runs the steps eagerly: events inside graphs do not time.)
  // (A stage before the last computes no outputs: any few tokens qualify.)
  // (A row split's shards decide alike: each holds the last layer.)
  const bool outputs_fit =
      !holds_output() || (all_want_logits && !batch.output_embeddings && n <= max_logit_rows_);
  const bool decode_step = options_.use_graphs && !stage_timer_.enabled() && outputs_fit && n <= kMaxMatvecTokens &&
                           batch.slice.tokens == 0;
  if (decode_step) {
    const auto key = std::make_pair(n, decode_graph_span(max_positions, options_.n_ctx));
    auto it = decode_graphs_.find(key);
    if (it == decode_graphs_.end()) it = decode_graphs_.emplace(key, capture_decode_graph(n, key.second)).first;
    if (sharded()) {
      // One graph over every shard's GPU, launched by shard 0.
      options_.exchange->launch(options_.shard.index, stream_, it->second);
      if (!computes_output()) return;
    } else {
      M40_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    }
    if (!holds_output()) {
      hand_over();
      return;
    }
    M40_CUDA_CHECK(cudaMemcpyAsync(host_logits_.as<float>(), logits_, n * n_vocab * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(logits_out + logits_written * n_vocab, host_logits_.as<float>(), n * n_vocab * sizeof(float));
    logits_written += n;
    return;
  }

  // Leading tokens that are their sequence's only one in the chunk (the
  // scheduler puts decode tokens first).
  int n_single = 0, max_single_positions = 0;
  for (; n_single < n; ++n_single) {
    const int32_t seq = batch.seq_ids[begin + n_single];
    const bool alone = std::count(batch.seq_ids.begin() + static_cast<std::ptrdiff_t>(begin),
                                  batch.seq_ids.begin() + static_cast<std::ptrdiff_t>(end), seq) == 1;
    if (!alone) break;
    max_single_positions = std::max(max_single_positions, batch.positions[begin + n_single] + 1);
  }
  stage_timer_.begin(stream_);
  enqueue_layers(n, max_positions, n_single, max_single_positions, batch.slice);  // one chunk holds a slice
  if (!holds_output()) {
    hand_over();
    stage_timer_.collect();
    return;
  }
  if (!computes_output()) {  // a row split's shard other than 0
    M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
    stage_timer_.collect();
    return;
  }
  if (batch.output_embeddings) {
    copy_hidden_states(batch, begin, n, logits_out, logits_written);
    stage_timer_.collect();
    return;
  }
  // The output head runs on the rows that want logits, gathered in groups
  // of at most max_logit_rows_.
  std::vector<int> wanted;
  for (int i = 0; i < n; ++i) {
    if (batch.want_logits[begin + i] != 0) wanted.push_back(i);
  }
  for (size_t g = 0; g < wanted.size(); g += max_logit_rows_) {
    const int rows = static_cast<int>(std::min<size_t>(max_logit_rows_, wanted.size() - g));
    for (int r = 0; r < rows; ++r) {
      M40_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(gathered_) + r * row_bytes,
                                     reinterpret_cast<const char*>(x_) + wanted[g + r] * row_bytes, row_bytes,
                                     cudaMemcpyDeviceToDevice, stream_));
    }
    enqueue_output(gathered_, rows);
    M40_CUDA_CHECK(cudaMemcpyAsync(host_logits_.as<float>(), logits_, rows * n_vocab * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(logits_out + logits_written * n_vocab, host_logits_.as<float>(), rows * n_vocab * sizeof(float));
    logits_written += rows;
  }
  M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
  stage_timer_.collect();
}

int decode_graph_span(int max_positions, int n_ctx) {
  int span = kAttentionSplitGranule;  // fewer positions are one part anyway
  while (span < max_positions && span < n_ctx) span *= 2;
  return std::min(span, n_ctx);
}

cudaGraphExec_t CudaBackend::capture_decode_graph(int n, int span) {
  cudaGraph_t graph = nullptr;
  if (sharded()) {
    // Shard 0's stream captures; the other shards' streams join it.
    options_.exchange->begin_capture(options_.shard.index, stream_);
  } else {
    M40_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }
  try {
    enqueue_layers(n, span);
    if (computes_output()) enqueue_output(x_, n);
  } catch (...) {
    if (!sharded() || options_.shard.index == 0) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    throw;
  }
  if (sharded()) {
    graph = options_.exchange->end_capture(options_.shard.index, stream_);
    if (graph == nullptr) return nullptr;  // shard 0 holds the step's graph
  } else {
    M40_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiateWithFlags(&exec, graph, 0);  // same signature in CUDA 11.8 and 13
  cudaGraphDestroy(graph);
  M40_CUDA_CHECK(status);
  return exec;
}

void CudaBackend::copy_hidden_states(const backend::Batch& batch, size_t begin, int n, float* out, size_t& rows_written) {
  const auto& hp = hparams_;
  const size_t n_embd = hp.n_embd;
  // Normalizing every row costs little beside the layers and leaves the
  // wanted ones in place, runs of them copied at once.
  rms_norm(x_, output_norm_, xn_, n, static_cast<int>(n_embd), hp.rms_eps, stream_);
  stage_timer_.mark(stream_, "output_norm");
  for (int i = 0; i < n;) {
    if (batch.want_logits[begin + i] == 0) {
      ++i;
      continue;
    }
    int run = 1;
    while (i + run < n && batch.want_logits[begin + i + run] != 0) ++run;
    M40_CUDA_CHECK(cudaMemcpyAsync(out + rows_written * n_embd, xn_ + static_cast<size_t>(i) * n_embd,
                                   static_cast<size_t>(run) * n_embd * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    rows_written += static_cast<size_t>(run);
    i += run;
  }
  M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) {
  tables_.set(seq, blocks, n_cached);
  tables_dirty_ = true;
  slices_.forget_sequence(seq);
}

void CudaBackend::copy_block(int32_t src, int32_t dst) {
  tables_.check_block(src);
  tables_.check_block(dst);
  if (src == dst) return;
  select_device(options_.device);
  // Block b's rows sit at the same offset in each layer's K and V pool, and
  // the pools follow one another every kv_half_bytes_: one 2-D copy moves
  // all 2 x n_layer of them, ordered before the next step on the stream.
  const size_t block_bytes =
      static_cast<size_t>(backend::kKvBlockSize) * kv_row_bytes(kv_format(options_.kv_type), static_cast<int>(hparams_.kv_dim()));
  auto* base = static_cast<uint8_t*>(kv_memory_.data());
  M40_CUDA_CHECK(cudaMemcpy2DAsync(base + static_cast<size_t>(dst) * block_bytes, kv_half_bytes_,
                                   base + static_cast<size_t>(src) * block_bytes, kv_half_bytes_, block_bytes,
                                   2 * static_cast<size_t>(stage_.size()), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::upload_tables() {
  if (!tables_dirty_) return;
  // The previous upload from the staging copy has landed (every step ends
  // with a synchronize; this one covers a step that threw midway).
  M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<int32_t>& flat = tables_.flat();
  std::memcpy(host_tables_.as<int32_t>(), flat.data(), flat.size() * sizeof(int32_t));
  M40_CUDA_CHECK(cudaMemcpyAsync(block_tables_, host_tables_.as<int32_t>(), flat.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  tables_dirty_ = false;
}

void CudaBackend::forward(const backend::Batch& batch, std::span<float> logits) {
  backend::require_whole_model(name(), stage_, static_cast<int>(hparams_.n_layer));
  if (sharded()) throw Error("a shard of a model split by rows runs only beside its other shards");
  tables_.check(batch, logits.size(), static_cast<int>(hparams_.n_vocab), static_cast<int>(hparams_.n_embd));
  slices_.check(batch, options_.max_batch);
  slices_.begin(batch);
  run_step(batch, nullptr, logits.data());
  slices_.advance(batch);
}

backend::SliceSupport CudaBackend::layer_slices() const {
  const int n_layer = static_cast<int>(hparams_.n_layer);
  if (stage_.first != 0 || stage_.end != n_layer || sharded()) return {};
  return {n_layer, options_.max_batch};
}

void CudaBackend::forward_stage(const backend::Batch& batch, std::span<float> hidden, std::span<float> out) {
  tables_.check_stage(batch, hidden.size(), out.size(), static_cast<int>(hparams_.n_vocab),
                      static_cast<int>(hparams_.n_embd), holds_input(), holds_output());
  if (batch.slice.tokens != 0) throw Error("a stage of a split model runs no layer slices");
  run_step(batch, hidden.data(), out.data());
}

void CudaBackend::forward_shard(const backend::Batch& batch, std::span<float> out) {
  if (!sharded()) throw Error("the CUDA backend was not built as a shard of a model split by rows");
  if (batch.slice.tokens != 0) throw Error("a shard of a model split by rows runs no layer slices");
  if (computes_output()) {
    tables_.check(batch, out.size(), static_cast<int>(hparams_.n_vocab), static_cast<int>(hparams_.n_embd));
  } else {
    tables_.check_tokens(batch, static_cast<int>(hparams_.n_vocab));
  }
  run_step(batch, nullptr, out.data());
}

void CudaBackend::run_step(const backend::Batch& batch, float* hidden, float* out) {
  select_device(options_.device);
  upload_tables();  // before the step's kernels or graph, on the same stream
  size_t written = 0;
  // Chunks of max_batch tokens, in order: later chunks attend to the K/V the
  // earlier ones appended, so a long prompt needs no larger scratch.
  for (size_t begin = 0; begin < batch.size(); begin += options_.max_batch) {
    const size_t end = std::min(batch.size(), begin + options_.max_batch);
    run_chunk(batch, begin, end, hidden, out, written);
  }
  tables_.advance(batch, slices_.cached_tokens(batch));
}

}  // namespace m40::cuda

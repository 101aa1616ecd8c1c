#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backends/cpu/moe.h"
#include "common/error.h"

namespace m40::cpu {

namespace {
// The pool's blocks; the options are checked first (the members built
// from them come before the constructor's body).
int pool_blocks(const CpuBackendOptions& o) {
  if (o.n_ctx <= 0 || o.n_seq <= 0) throw Error("the context size and sequence count must be positive");
  if (o.kv_blocks < 0) throw Error("the KV pool cannot have a negative block count");
  return o.kv_blocks > 0 ? o.kv_blocks : o.n_seq * backend::kv_blocks_for(o.n_ctx);
}

std::vector<float> vector_of(const model::WeightView& w) {
  if (!w.present()) return {};
  std::vector<float> v(w.cols * w.rows);
  load_vector(w, v.data());
  return v;
}
}  // namespace

CpuBackend::CpuBackend(const model::ModelHparams& hparams, const model::ModelWeights& weights,
                       CpuBackendOptions options)
    : hparams_(model::shard_hparams(hparams, options.shard)),
      weights_(&weights),
      options_(options),
      layers_(backend::resolve_layers(options.layers, static_cast<int>(hparams.n_layer))),
      pool_(options.threads),
      kv_(layers_.size(), pool_blocks(options), static_cast<int>(hparams_.kv_dim()), options.kv_type),
      tables_(options.n_seq, options.n_ctx, pool_blocks(options)),
      slices_(static_cast<int>(hparams.n_layer)) {
  if (!options.shard.whole()) {
    if (options.sums == nullptr || options.sums->count() != options.shard.count) {
      throw Error("a row split's shard needs the group of its shards");
    }
    if (layers_.size() != static_cast<int>(hparams.n_layer)) throw Error("a row split's shard holds every layer");
    if (hparams.has_experts()) throw Error("a row split divides dense layers only: use --split-mode layer");
    slice_weights(hparams);
  }
  if (const model::WeightView* factors = weights.rope_factors(hparams, static_cast<uint32_t>(options.n_ctx))) {
    rope_freq_factors_ = vector_of(*factors);
  }
  const float* factors = rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data();
  for (uint32_t l = 0; l < hparams.n_layer; ++l) {
    layer_rope_.push_back(rope_params(hparams, hparams.rope_for_layer(l), factors));
  }
  for (const auto& l : weights_->layers) {
    attn_norm_.push_back(vector_of(l.attn_norm));
    ffn_norm_.push_back(vector_of(l.ffn_norm));
    bq_.push_back(vector_of(l.bq));
    bk_.push_back(vector_of(l.bk));
    bv_.push_back(vector_of(l.bv));
    bo_.push_back(vector_of(l.bo));
    q_norm_.push_back(vector_of(l.q_norm));
    k_norm_.push_back(vector_of(l.k_norm));
    post_attn_norm_.push_back(vector_of(l.post_attn_norm));
    post_ffn_norm_.push_back(vector_of(l.post_ffn_norm));
  }
  output_norm_ = vector_of(weights_->output_norm);
}

void CpuBackend::slice_weights(const model::ModelHparams& model_hparams) {
  shard_weights_ = *weights_;
  const model::ShardRows r = model::shard_rows(model_hparams, options_.shard);
  const auto columns = [&](const model::WeightView& w, uint64_t first, uint64_t end) {
    const model::ColumnSlice slice = model::column_slice(w, first, end);
    std::vector<uint8_t>& copy = column_copies_.emplace_back(slice.bytes * w.rows);
    for (uint64_t row = 0; row < w.rows; ++row) {
      std::copy_n(w.row(row) + slice.offset, slice.bytes, copy.data() + row * slice.bytes);
    }
    model::WeightView v = w;
    v.name = w.name + " (shard)";
    v.cols = end - first;
    v.row_bytes = slice.bytes;
    v.data = copy.data();
    return v;
  };
  for (model::LayerWeights& l : shard_weights_.layers) {
    l = model::row_slices(l, r);
    l.wo = columns(l.wo, r.q_first, r.q_end);
    l.w_down = columns(l.w_down, r.ff_first, r.ff_end);
  }
  weights_ = &shard_weights_;
}

void CpuBackend::add_shard_partials(float* branch, int64_t n) {
  if (options_.sums != nullptr) options_.sums->all_reduce(options_.shard.index, branch, n);
}

uint64_t CpuBackend::memory_bytes() const {
  return weights_->stage_bytes(static_cast<size_t>(layers_.first), static_cast<size_t>(layers_.end)) + kv_.bytes();
}

void CpuBackend::copy_block(int32_t src, int32_t dst) {
  tables_.check_block(src);
  tables_.check_block(dst);
  kv_.copy_block(src, dst);
}

void CpuBackend::forward(const backend::Batch& batch, std::span<float> logits) {
  backend::require_whole_model(name(), layers_, static_cast<int>(hparams_.n_layer));
  if (!options_.shard.whole()) throw Error("a shard of a model split by rows runs only beside its other shards");
  tables_.check(batch, logits.size(), static_cast<int>(hparams_.n_vocab), static_cast<int>(hparams_.n_embd));
  slices_.check(batch, std::numeric_limits<int>::max());
  slices_.begin(batch);
  std::vector<float> x;
  run_layers(batch, {}, x);
  tables_.advance(batch, slices_.cached_tokens(batch));
  slices_.advance(batch);
  write_outputs(batch, x, logits);
}

backend::SliceSupport CpuBackend::layer_slices() const {
  const int n_layer = static_cast<int>(hparams_.n_layer);
  if (layers_.first != 0 || layers_.end != n_layer || !options_.shard.whole()) return {};
  return {n_layer, std::numeric_limits<int>::max()};
}

void CpuBackend::set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) {
  tables_.set(seq, blocks, n_cached);
  slices_.forget_sequence(seq);
}

void CpuBackend::forward_stage(const backend::Batch& batch, std::span<float> hidden, std::span<float> out) {
  const bool holds_first = layers_.first == 0, holds_last = layers_.end == static_cast<int>(hparams_.n_layer);
  tables_.check_stage(batch, hidden.size(), out.size(), static_cast<int>(hparams_.n_vocab),
                      static_cast<int>(hparams_.n_embd), holds_first, holds_last);
  if (batch.slice.tokens != 0) throw Error("a stage of a split model runs no layer slices");
  const size_t hidden_size = batch.size() * hparams_.n_embd;
  std::vector<float> x;
  run_layers(batch, holds_first ? std::span<const float>() : std::span<const float>(hidden.first(hidden_size)), x);
  tables_.advance(batch);
  if (holds_last) {
    write_outputs(batch, x, out);
  } else {
    std::copy(x.begin(), x.end(), hidden.begin());
  }
}

void CpuBackend::forward_shard(const backend::Batch& batch, std::span<float> out) {
  if (options_.shard.whole()) throw Error("the CPU backend was not built as a shard of a model split by rows");
  if (batch.slice.tokens != 0) throw Error("a shard of a model split by rows runs no layer slices");
  const bool outputs = options_.shard.index == 0;
  if (outputs) {
    tables_.check(batch, out.size(), static_cast<int>(hparams_.n_vocab), static_cast<int>(hparams_.n_embd));
  } else {
    tables_.check_tokens(batch, static_cast<int>(hparams_.n_vocab));
  }
  std::vector<float> x;
  run_layers(batch, {}, x);
  tables_.advance(batch);
  if (outputs) write_outputs(batch, x, out);
}

void CpuBackend::run_layers(const backend::Batch& batch, std::span<const float> hidden_in, std::vector<float>& x) {
  const auto& hp = hparams_;
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t n_embd = hp.n_embd, q_dim = hp.q_dim(), kv_dim = hp.kv_dim(), n_ff = hp.n_ff;
  const int head_dim = static_cast<int>(hp.head_dim());

  x.resize(n * n_embd);
  std::vector<float> xn(n * n_embd), q(n * q_dim), k(n * kv_dim), v(n * kv_dim);
  const int64_t dense_ff = hp.has_experts() ? 0 : n * n_ff;  // expert layers keep their own buffers (moe_ffn)
  std::vector<float> attn(n * q_dim), proj(n * n_embd), gate(dense_ff), up(dense_ff);

  if (layers_.first == 0) {
    for (int64_t t = 0; t < n; ++t) get_row(weights_->token_embd, batch.tokens[t], x.data() + t * n_embd);
    if (hp.embedding_scale != 1.0f) scale(x.data(), n * n_embd, hp.embedding_scale);
  } else {
    std::copy(hidden_in.begin(), hidden_in.begin() + n * n_embd, x.begin());
  }

  // A branch's output (attention or FFN, in proj) joins the residual stream:
  // RMSNorm'd first where the architecture has post-norms, scaled where it
  // has a residual scale.
  const auto add_branch = [&](const std::vector<float>& post_norm, int64_t rows) {
    if (!post_norm.empty()) {
      for (int64_t t = 0; t < rows; ++t) {
        rms_norm(proj.data() + t * n_embd, post_norm.data(), proj.data() + t * n_embd, n_embd, hp.rms_eps);
      }
    }
    if (hp.residual_scale != 1.0f) scale(proj.data(), rows * n_embd, hp.residual_scale);
    add_in_place(x.data(), proj.data(), rows * n_embd);
  };

  for (int layer = layers_.first; layer < layers_.end; ++layer) {
    const model::LayerWeights& w = weights_->layers[layer];
    const int kv_layer = layer - layers_.first;  // the KV cache holds this stage's layers
    // A layer slice's tokens pass its layers only: their hidden states
    // come from the previous step before its first layer and wait for the
    // next one after its last (layer_slices.h).
    const int64_t nl = batch.slice.tokens_at(static_cast<int>(n), layer);
    const int64_t slice_row = n - batch.slice.tokens;
    if (batch.slice.resumes_at(layer)) {
      std::copy(slice_hidden_.begin(), slice_hidden_.end(), x.begin() + slice_row * n_embd);
    }
    for (int64_t t = 0; t < nl; ++t) {
      rms_norm(x.data() + t * n_embd, attn_norm_[layer].data(), xn.data() + t * n_embd, n_embd, hp.rms_eps);
    }
    matmul(w.wq, xn.data(), nl, q.data(), pool_);
    matmul(w.wk, xn.data(), nl, k.data(), pool_);
    matmul(w.wv, xn.data(), nl, v.data(), pool_);
    const bool rope_on = hp.rope_layers[layer] != 0;
    for (int64_t t = 0; t < nl; ++t) {
      float* qt = q.data() + t * q_dim;
      float* kt = k.data() + t * kv_dim;
      float* vt = v.data() + t * kv_dim;
      if (!bq_[layer].empty()) {
        add_in_place(qt, bq_[layer].data(), q_dim);
        add_in_place(kt, bk_[layer].data(), kv_dim);
        add_in_place(vt, bv_[layer].data(), kv_dim);
      }
      if (!q_norm_[layer].empty()) {  // per-head RMSNorm of Q and K
        for (uint32_t h = 0; h < hp.n_head; ++h) {
          rms_norm(qt + h * head_dim, q_norm_[layer].data(), qt + h * head_dim, head_dim, hp.rms_eps);
        }
        for (uint32_t h = 0; h < hp.n_head_kv; ++h) {
          rms_norm(kt + h * head_dim, k_norm_[layer].data(), kt + h * head_dim, head_dim, hp.rms_eps);
        }
      }
      if (rope_on) {
        rope(qt, static_cast<int>(hp.n_head), batch.positions[t], layer_rope_[layer]);
        rope(kt, static_cast<int>(hp.n_head_kv), batch.positions[t], layer_rope_[layer]);
      }
      if (hp.attn_temperature_scale != 0.0f) scale(qt, q_dim, hp.attention_temperature(batch.positions[t]));
      kv_.store(kv_layer, backend::kv_row(tables_.table(batch.seq_ids[t]), batch.positions[t]), kt, vt);
    }
    AttentionShape shape{static_cast<int>(hp.n_head), static_cast<int>(hp.n_head_kv), head_dim, hp.attention_scale,
                         hp.attn_softcap, static_cast<int>(hp.window_of_layer(layer))};
    cpu::attention(kv_, kv_layer, shape, q.data(), batch.seq_ids.data(), batch.positions.data(), static_cast<int>(nl),
                   tables_, attn.data(), pool_);
    matmul(w.wo, attn.data(), nl, proj.data(), pool_);
    add_shard_partials(proj.data(), nl * n_embd);
    if (!bo_[layer].empty()) {
      for (int64_t t = 0; t < nl; ++t) add_in_place(proj.data() + t * n_embd, bo_[layer].data(), n_embd);
    }
    add_branch(post_attn_norm_[layer], nl);

    for (int64_t t = 0; t < nl; ++t) {
      rms_norm(x.data() + t * n_embd, ffn_norm_[layer].data(), xn.data() + t * n_embd, n_embd, hp.rms_eps);
    }
    if (w.has_experts()) {
      moe_ffn(w, static_cast<int>(hp.n_expert_used), hp.desc->expert_weights_renormalized, xn.data(), nl, n_embd,
              proj.data(), pool_);
    } else {
      matmul(w.w_gate, xn.data(), nl, gate.data(), pool_);
      matmul(w.w_up, xn.data(), nl, up.data(), pool_);
      if (hp.desc->activation == model::FfnActivation::GeluTanh) {
        gelu_mul(gate.data(), up.data(), gate.data(), nl * n_ff);
      } else {
        silu_mul(gate.data(), up.data(), gate.data(), nl * n_ff);
      }
      matmul(w.w_down, gate.data(), nl, proj.data(), pool_);
      add_shard_partials(proj.data(), nl * n_embd);
    }
    add_branch(post_ffn_norm_[layer], nl);
    if (batch.slice.pauses_after(layer, static_cast<int>(hp.n_layer))) {
      slice_hidden_.assign(x.begin() + slice_row * n_embd, x.end());
    }
  }
}

void CpuBackend::write_outputs(const backend::Batch& batch, const std::vector<float>& x, std::span<float> logits) {
  const auto& hp = hparams_;
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t n_embd = hp.n_embd;
  std::vector<float> xn(n * n_embd);
  // Only the tokens whose logits are wanted go through the output head.
  int64_t n_out = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (batch.want_logits[t] == 0) continue;
    rms_norm(x.data() + t * n_embd, output_norm_.data(), xn.data() + n_out * n_embd, n_embd, hp.rms_eps);
    ++n_out;
  }
  if (n_out == 0) return;
  if (batch.output_embeddings) {  // the hidden states themselves: no output head
    std::copy(xn.begin(), xn.begin() + n_out * n_embd, logits.begin());
    return;
  }
  matmul(weights_->output, xn.data(), n_out, logits.data(), pool_);
  const int64_t n_logits = n_out * static_cast<int64_t>(hp.n_vocab);
  if (hp.logit_scale != 1.0f) scale(logits.data(), n_logits, hp.logit_scale);
  if (hp.final_softcap > 0.0f) softcap(logits.data(), n_logits, hp.final_softcap);
}

}  // namespace m40::cpu

#include "backends/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>

#include "backends/batch_check.h"
#include "common/error.h"

namespace m40::cpu {

namespace {
std::vector<float> vector_of(const model::WeightView& w) {
  if (!w.present()) return {};
  std::vector<float> v(w.cols * w.rows);
  load_vector(w, v.data());
  return v;
}

void add_in_place(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
}  // namespace

CpuBackend::CpuBackend(const model::LlamaHparams& hparams, const model::LlamaWeights& weights,
                       CpuBackendOptions options)
    : hparams_(hparams),
      weights_(weights),
      options_(options),
      pool_(options.threads),
      kv_(static_cast<int>(hparams.n_layer), options.n_seq, options.n_ctx, static_cast<int>(hparams.kv_dim()),
          options.kv_type),
      filled_(options.n_seq, 0) {
  if (options.n_ctx <= 0 || options.n_seq <= 0) throw Error("the context size and sequence count must be positive");
  rope_.head_dim = static_cast<int>(hparams.head_dim());
  rope_.n_rot = static_cast<int>(hparams.n_rot);
  rope_.freq_base = hparams.rope_freq_base;
  rope_.freq_scale = hparams.rope_scaling == model::RopeScaling::Linear ? 1.0f / hparams.rope_scaling_factor : 1.0f;
  rope_.style = hparams.rope_style();
  rope_freq_factors_ = vector_of(weights.rope_freqs);
  rope_.freq_factors = rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data();
  for (const auto& l : weights.layers) {
    attn_norm_.push_back(vector_of(l.attn_norm));
    ffn_norm_.push_back(vector_of(l.ffn_norm));
    bq_.push_back(vector_of(l.bq));
    bk_.push_back(vector_of(l.bk));
    bv_.push_back(vector_of(l.bv));
  }
  output_norm_ = vector_of(weights.output_norm);
}

void CpuBackend::forward(const backend::Batch& batch, std::span<float> logits) {
  backend::check_batch(batch, logits.size(), static_cast<int>(hparams_.n_vocab), options_.n_ctx, filled_);
  const auto& hp = hparams_;
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t n_embd = hp.n_embd, q_dim = hp.q_dim(), kv_dim = hp.kv_dim(), n_ff = hp.n_ff;

  std::vector<float> x(n * n_embd), xn(n * n_embd), q(n * q_dim), k(n * kv_dim), v(n * kv_dim);
  std::vector<float> attn(n * q_dim), proj(n * n_embd), gate(n * n_ff), up(n * n_ff);

  for (int64_t t = 0; t < n; ++t) get_row(weights_.token_embd, batch.tokens[t], x.data() + t * n_embd);

  for (int layer = 0; layer < static_cast<int>(hp.n_layer); ++layer) {
    const model::LayerWeights& w = weights_.layers[layer];
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(x.data() + t * n_embd, attn_norm_[layer].data(), xn.data() + t * n_embd, n_embd, hp.rms_eps);
    }
    matmul(w.wq, xn.data(), n, q.data(), pool_);
    matmul(w.wk, xn.data(), n, k.data(), pool_);
    matmul(w.wv, xn.data(), n, v.data(), pool_);
    for (int64_t t = 0; t < n; ++t) {
      if (!bq_[layer].empty()) {
        add_in_place(q.data() + t * q_dim, bq_[layer].data(), q_dim);
        add_in_place(k.data() + t * kv_dim, bk_[layer].data(), kv_dim);
        add_in_place(v.data() + t * kv_dim, bv_[layer].data(), kv_dim);
      }
      rope(q.data() + t * q_dim, static_cast<int>(hp.n_head), batch.positions[t], rope_);
      rope(k.data() + t * kv_dim, static_cast<int>(hp.n_head_kv), batch.positions[t], rope_);
      kv_.store(layer, batch.seq_ids[t], batch.positions[t], k.data() + t * kv_dim, v.data() + t * kv_dim);
    }
    AttentionShape shape{static_cast<int>(hp.n_head), static_cast<int>(hp.n_head_kv), static_cast<int>(hp.head_dim())};
    cpu::attention(kv_, layer, shape, q.data(), batch.seq_ids.data(), batch.positions.data(), static_cast<int>(n),
                   attn.data(), pool_);
    matmul(w.wo, attn.data(), n, proj.data(), pool_);
    add_in_place(x.data(), proj.data(), n * n_embd);

    for (int64_t t = 0; t < n; ++t) {
      rms_norm(x.data() + t * n_embd, ffn_norm_[layer].data(), xn.data() + t * n_embd, n_embd, hp.rms_eps);
    }
    matmul(w.w_gate, xn.data(), n, gate.data(), pool_);
    matmul(w.w_up, xn.data(), n, up.data(), pool_);
    silu_mul(gate.data(), up.data(), gate.data(), n * n_ff);
    matmul(w.w_down, gate.data(), n, proj.data(), pool_);
    add_in_place(x.data(), proj.data(), n * n_embd);
  }

  backend::advance_cached(batch, filled_);

  // Only the tokens whose logits are wanted go through the output head.
  int64_t n_out = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (batch.want_logits[t] == 0) continue;
    rms_norm(x.data() + t * n_embd, output_norm_.data(), xn.data() + n_out * n_embd, n_embd, hp.rms_eps);
    ++n_out;
  }
  if (n_out > 0) matmul(weights_.output, xn.data(), n_out, logits.data(), pool_);
}

}  // namespace m40::cpu

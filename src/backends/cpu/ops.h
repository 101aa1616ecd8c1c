// The operations of the llama forward pass on the CPU, in FP32. They are the
// reference the CUDA kernels are tested against (their "CPU twins"), so they
// follow llama.cpp's definitions closely (RoPE angles, RMSNorm, SwiGLU).
#pragma once

#include <cstdint>

#include "backends/block_tables.h"
#include "backends/cpu/kv_cache.h"
#include "backends/cpu/thread_pool.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace m40::cpu {

float dot(const float* a, const float* b, int64_t n);

// y = x / sqrt(mean(x^2) + eps) * weight
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);

// RoPE as ggml's rope_ext computes it (model::RopeSettings says what each
// field means).
struct RopeParams {
  int head_dim = 0;
  int n_rot = 0;             // rotated dimensions per head (the rest pass through)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // 1 / scaling factor
  float ext_factor = 0.0f;   // YaRN: 1 mixes extrapolated and interpolated angles
  float corr_low = 0.0f;     // YaRN ramp bounds (rotary pair indices)
  float corr_high = 0.0f;
  float magnitude = 1.0f;    // cos and sin are multiplied by this
  model::RopeStyle style = model::RopeStyle::Normal;
  const float* freq_factors = nullptr;  // optional, n_rot / 2 divisors (rope_freqs, LongRoPE factors)
};

// The parameters of one layer's RoPE (settings.enabled is not looked at).
RopeParams rope_params(const model::ModelHparams& hp, const model::RopeSettings& settings,
                       const float* freq_factors);

// Rotates n_heads consecutive heads of `vec` in place for position `pos`.
void rope(float* vec, int n_heads, int32_t pos, const RopeParams& p);

// out = silu(gate) * up
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// out = gelu(gate) * up, GELU in its tanh form
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed in FP32.
void gelu_mul(const float* gate, const float* up, float* out, int64_t n);

// x = cap * tanh(x / cap) over n values (soft-capping; cap > 0).
void softcap(float* x, int64_t n, float cap);

// x *= s over n values.
void scale(float* x, int64_t n, float s);

// y += x over n values (biases, residual adds).
void add_in_place(float* y, const float* x, int64_t n);

// In-place softmax over n values.
void softmax(float* x, int64_t n);

// y[t * w.rows + r] = dot(row r of W, x[t * w.cols ...]) for t < n_tokens.
// W stays in its storage type; rows are dequantized on the fly, a few at a
// time, and each dequantized row serves every token of the batch.
void matmul(const model::WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// Row `row` of W as floats (the embedding lookup).
void get_row(const model::WeightView& w, int64_t row, float* out);

// A whole 1-D weight (norms, biases) as floats.
void load_vector(const model::WeightView& w, float* out);

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float scale = 0.0f;    // scores = Q·K × scale (usually 1/sqrt(head_dim))
  float softcap = 0.0f;  // > 0: scores = softcap · tanh(scores / softcap), after the scale
  int window = 0;        // > 0: keys at p' with p - p' >= window are masked (sliding window)
};

// Causal attention: token t (of sequence seq_ids[t], at positions[t]) attends
// to its sequence's cached K/V at positions 0..positions[t] (the last
// `window` of them when windowed), read through the sequence's block table, with scores scaled and optionally
// soft-capped, a softmax and the weighted sum of V, all in FP32 (FP16 cache
// entries are widened). Query head h reads KV head h / (n_head / n_head_kv).
// q and out: [n_tokens][n_head * head_dim].
void attention(const KvCache& kv, int layer, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, const backend::BlockTables& tables, float* out, ThreadPool& pool);

}  // namespace m40::cpu

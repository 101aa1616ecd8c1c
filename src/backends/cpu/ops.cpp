#include "backends/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/dequantize.h"

namespace m40::cpu {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double sum = 0.0;  // llama.cpp accumulates the squares in double as well
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void rope(float* vec, int n_heads, int32_t pos, const RopeParams& p) {
  // The angles as ggml computes them: theta_i = pos * base^(-2i/n_rot), built
  // by repeated multiplication in float, divided by the optional frequency
  // factor, then scaled.
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  const int pairs = p.n_rot / 2;
  float cos_table[512], sin_table[512];
  std::vector<float> big_cos, big_sin;
  float* cos_t = cos_table;
  float* sin_t = sin_table;
  if (pairs > 512) {
    big_cos.resize(pairs);
    big_sin.resize(pairs);
    cos_t = big_cos.data();
    sin_t = big_sin.data();
  }
  float theta_base = static_cast<float>(pos);
  for (int i = 0; i < pairs; ++i) {
    const float ff = p.freq_factors != nullptr ? p.freq_factors[i] : 1.0f;
    const float theta_extrap = theta_base / ff;
    float theta = p.freq_scale * theta_extrap;
    if (p.ext_factor != 0.0f) {
      // YaRN: pairs below corr_low keep their extrapolated angle, pairs
      // above corr_high the interpolated one, a linear ramp between.
      const float y = (static_cast<float>(i) - p.corr_low) / std::max(0.001f, p.corr_high - p.corr_low);
      const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
      theta = theta * (1.0f - mix) + theta_extrap * mix;
    }
    cos_t[i] = std::cos(theta) * p.magnitude;
    sin_t[i] = std::sin(theta) * p.magnitude;
    theta_base *= theta_scale;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* x = vec + static_cast<int64_t>(h) * p.head_dim;
    for (int i = 0; i < pairs; ++i) {
      // Normal: adjacent pairs (2i, 2i+1). NeoX: (i, i + n_rot/2).
      const int a = p.style == model::RopeStyle::Normal ? 2 * i : i;
      const int b = p.style == model::RopeStyle::Normal ? 2 * i + 1 : i + pairs;
      const float x0 = x[a], x1 = x[b];
      x[a] = x0 * cos_t[i] - x1 * sin_t[i];
      x[b] = x0 * sin_t[i] + x1 * cos_t[i];
    }
  }
}

RopeParams rope_params(const model::ModelHparams& hp, const model::RopeSettings& settings,
                       const float* freq_factors) {
  RopeParams p;
  p.head_dim = static_cast<int>(hp.head_dim());
  p.n_rot = static_cast<int>(hp.n_rot);
  p.freq_base = settings.freq_base;
  p.freq_scale = settings.freq_scale;
  p.ext_factor = settings.ext_factor;
  p.corr_low = settings.corr_low;
  p.corr_high = settings.corr_high;
  p.magnitude = settings.magnitude;
  p.style = hp.rope_style();
  p.freq_factors = freq_factors;
  return p;
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kCubic = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCubic * x * x))) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_in_place(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax(float* x, int64_t n) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

namespace {

constexpr int64_t kRowTile = 4;  // rows dequantized together; each x vector is read once per tile

// Four dot products against the same x: x is loaded once for four rows.
void dot4(const float* w0, const float* w1, const float* w2, const float* w3, const float* x, int64_t n,
          float* out) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    s0 += w0[i] * x[i];
    s1 += w1[i] * x[i];
    s2 += w2[i] * x[i];
    s3 += w3[i] * x[i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

}  // namespace

void matmul(const model::WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const int64_t rows = static_cast<int64_t>(w.rows);
  const int64_t cols = static_cast<int64_t>(w.cols);
  const bool is_f32 = w.type == gguf::TensorType::F32;
  const int64_t tiles = (rows + kRowTile - 1) / kRowTile;
  pool.parallel_for(tiles, [&](int64_t begin, int64_t end, unsigned) {
    std::vector<float> scratch(is_f32 ? 0 : static_cast<size_t>(kRowTile * cols));
    const float* row_ptr[kRowTile];
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile * kRowTile;
      const int64_t n_rows = std::min(kRowTile, rows - r0);
      for (int64_t r = 0; r < kRowTile; ++r) {
        const int64_t row = r0 + std::min(r, n_rows - 1);  // a short last tile repeats its last row
        if (is_f32) {
          row_ptr[r] = reinterpret_cast<const float*>(w.row(row));
        } else {
          float* dst = scratch.data() + r * cols;
          if (r < n_rows) quant::dequantize_row(w.type, w.row(row), dst, cols);
          row_ptr[r] = r < n_rows ? dst : row_ptr[n_rows - 1];
        }
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        float out[kRowTile];
        dot4(row_ptr[0], row_ptr[1], row_ptr[2], row_ptr[3], x + t * cols, cols, out);
        float* yt = y + t * rows + r0;
        for (int64_t r = 0; r < n_rows; ++r) yt[r] = out[r];
      }
    }
  });
}

void get_row(const model::WeightView& w, int64_t row, float* out) {
  quant::dequantize_row(w.type, w.row(static_cast<uint64_t>(row)), out, static_cast<int64_t>(w.cols));
}

void load_vector(const model::WeightView& w, float* out) {
  quant::dequantize_row(w.type, w.data, out, static_cast<int64_t>(w.cols * w.rows));
}

}  // namespace m40::cpu

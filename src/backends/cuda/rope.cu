// RoPE, normal (adjacent pairs) and NeoX (pairs n_rot/2 apart), in place,
// with frequency factors, linear scaling and YaRN (ggml's rope_ext).
// CPU twin: cpu::rope.
//
// The angles are built exactly as the CPU (and ggml) builds them: theta_base
// starts at the position and is multiplied by theta_scale = base^(-2/n_rot)
// once per pair, in float. Replicating that product (rather than computing
// base^(-2i/n_rot) with powf) makes the angles equal bit for bit; at position
// 4000 a one-ulp difference in an angle would already move cos/sin by ~2e-4.
// theta_scale itself is computed on the host with the CPU's std::pow. The
// rotation keeps its products unfused (__fmul_rn) so it rounds like the CPU;
// what remains is sincosf against the host's sin/cos, a few ulp. YaRN's mix
// of two angles is unfused too, as the CPU's source reads; a host compiler
// that contracts it into an FMA (-march=native) moves such an angle by an
// ulp, which the tests bound per position. Without YaRN (ext_factor 0) and
// with magnitude 1 the table holds exactly what it held before YaRN was
// added (x * 1 is exact).
//
// Grid: x = token, y = a slice of 256 (head, pair) items. Each block first
// fills a shared table of cos/sin for its token's position (thread i runs the
// i multiplications of pair i: at most n_rot/2 dependent products).
//
// Also here, the other thing a token's position does to Q: the attention
// temperature (mistral3), Q x 1 + scale * ln(floor(p / length) + 1) after
// RoPE. CPU twin: model::ModelHparams::attention_temperature, computed in
// double like it (a float rounding of the double result), then cpu::scale.
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/layer_kernels.h"
#include "common/error.h"

namespace m40::cuda {

namespace {

constexpr int kRopeThreads = 256;

struct RopeArgs {
  float* x;
  const int32_t* positions;
  const float* freq_factors;
  int n_heads;
  int row_stride;
  int head_dim;
  int pairs;  // n_rot / 2
  float theta_scale;
  float freq_scale;
  float ext_factor;
  float corr_low;
  float corr_high;
  float magnitude;
  bool neox;
};

__global__ void __launch_bounds__(kRopeThreads) rope_kernel(RopeArgs a) {
  extern __shared__ float table[];  // cos[pairs] then sin[pairs]
  float* cos_t = table;
  float* sin_t = table + a.pairs;
  const int64_t t = blockIdx.x;
  const int32_t pos = __ldg(a.positions + t);
  for (int i = static_cast<int>(threadIdx.x); i < a.pairs; i += kRopeThreads) {
    float theta_base = static_cast<float>(pos);
    for (int k = 0; k < i; ++k) theta_base *= a.theta_scale;
    const float ff = a.freq_factors != nullptr ? __ldg(a.freq_factors + i) : 1.0f;
    const float theta_extrap = theta_base / ff;
    float theta = a.freq_scale * theta_extrap;
    if (a.ext_factor != 0.0f) {
      // YaRN's ramp: extrapolated below pair corr_low, interpolated above corr_high.
      const float y = (static_cast<float>(i) - a.corr_low) / fmaxf(0.001f, a.corr_high - a.corr_low);
      const float mix = __fmul_rn(1.0f - fminf(1.0f, fmaxf(0.0f, y)), a.ext_factor);
      theta = __fadd_rn(__fmul_rn(theta, 1.0f - mix), __fmul_rn(theta_extrap, mix));
    }
    float s, c;
    sincosf(theta, &s, &c);
    cos_t[i] = c * a.magnitude;
    sin_t[i] = s * a.magnitude;
  }
  __syncthreads();

  const int item = static_cast<int>(blockIdx.y) * kRopeThreads + static_cast<int>(threadIdx.x);
  if (item >= a.n_heads * a.pairs) return;
  const int h = item / a.pairs;
  const int i = item % a.pairs;
  float* head = a.x + t * a.row_stride + static_cast<int64_t>(h) * a.head_dim;
  const int ia = a.neox ? i : 2 * i;
  const int ib = a.neox ? i + a.pairs : 2 * i + 1;
  const float x0 = head[ia];
  const float x1 = head[ib];
  const float c = cos_t[i];
  const float s = sin_t[i];
  head[ia] = __fmul_rn(x0, c) - __fmul_rn(x1, s);
  head[ib] = __fmul_rn(x0, s) + __fmul_rn(x1, c);
}

constexpr int kTemperatureThreads = 256;

__global__ void __launch_bounds__(kTemperatureThreads)
    attention_temperature_kernel(float* q, int row_len, const int32_t* positions, float scale, uint32_t length) {
  __shared__ float temperature;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    const double steps = floor(static_cast<double>(__ldg(positions + t)) / static_cast<double>(length));
    // Unfused, as the host rounds: log * scale, then + 1.
    temperature = static_cast<float>(__dadd_rn(__dmul_rn(log(steps + 1.0), static_cast<double>(scale)), 1.0));
  }
  __syncthreads();
  float* row = q + t * row_len;
  for (int i = static_cast<int>(threadIdx.x); i < row_len; i += kTemperatureThreads) row[i] *= temperature;
}

}  // namespace

void attention_temperature(float* q, int n_tokens, int row_len, const int32_t* positions, float scale,
                           uint32_t length, cudaStream_t stream) {
  if (n_tokens < 0 || row_len < 0 || length == 0) {
    throw Error("attention_temperature: bad shape (" + std::to_string(n_tokens) + " tokens of " +
                std::to_string(row_len) + ", step length " + std::to_string(length) + ")");
  }
  if (n_tokens == 0 || row_len == 0) return;
  attention_temperature_kernel<<<n_tokens, kTemperatureThreads, 0, stream>>>(q, row_len, positions, scale, length);
  M40_CUDA_CHECK_LAUNCH();
}

void rope(float* x, int n_tokens, int n_heads, int row_stride, const int32_t* positions, const RopeConfig& config,
          cudaStream_t stream) {
  if (config.head_dim <= 0 || config.n_rot <= 0 || config.n_rot % 2 != 0 || config.n_rot > config.head_dim) {
    throw Error("rope: n_rot must be even and in 1.." + std::to_string(config.head_dim) + " (head_dim), got " +
                std::to_string(config.n_rot));
  }
  if (n_tokens < 0 || n_heads < 0 || row_stride < static_cast<int64_t>(n_heads) * config.head_dim) {
    throw Error("rope: " + std::to_string(n_heads) + " heads of " + std::to_string(config.head_dim) +
                " do not fit a row stride of " + std::to_string(row_stride));
  }
  if (n_tokens == 0 || n_heads == 0) return;
  RopeArgs a{};
  a.x = x;
  a.positions = positions;
  a.freq_factors = config.freq_factors;
  a.n_heads = n_heads;
  a.row_stride = row_stride;
  a.head_dim = config.head_dim;
  a.pairs = config.n_rot / 2;
  a.theta_scale = std::pow(config.freq_base, -2.0f / static_cast<float>(config.n_rot));  // as the CPU
  a.freq_scale = config.freq_scale;
  a.ext_factor = config.ext_factor;
  a.corr_low = config.corr_low;
  a.corr_high = config.corr_high;
  a.magnitude = config.magnitude;
  a.neox = config.neox;
  const int items = n_heads * a.pairs;
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>((items + kRopeThreads - 1) / kRopeThreads));
  const size_t shared = 2 * static_cast<size_t>(a.pairs) * sizeof(float);
  rope_kernel<<<grid, kRopeThreads, shared, stream>>>(a);
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda

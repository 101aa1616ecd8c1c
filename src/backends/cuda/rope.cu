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
// The same launch also applies the per-head RMS norms that come before RoPE
// (qwen3, gemma3: Q's and K's heads each normalized over head_dim values),
// takes Q's and K's heads together and stores K's and V's heads into the KV
// cache: one small kernel a layer where there were up to five (two norms,
// two rotations, the cache append), each a few microseconds of a decode
// step's critical path.
//
// Grid: x = token, y = a slice of kHeadWarps heads (Q's, K's, V's). Each
// block first fills a shared table of cos/sin for its token's position
// (thread i runs the i multiplications of pair i: at most n_rot/2 dependent
// products); then each warp takes one head: its norm (the head in shared
// memory, a warp sum of squares), its pairs, then its store into the cache.
//
// Also here, the other thing a token's position does to Q: the attention
// temperature (mistral3), Q x 1 + scale * ln(floor(p / length) + 1) after
// RoPE. CPU twin: model::ModelHparams::attention_temperature, computed in
// double like it (a float rounding of the double result), then cpu::scale.
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kv_store.cuh"
#include "backends/cuda/layer_kernels.h"
#include "backends/cuda/rms_scale.cuh"
#include "backends/cuda/warp_reduce.cuh"
#include "common/error.h"

namespace m40::cuda {

namespace {

constexpr int kHeadWarps = 8;  // heads per block
constexpr int kHeadThreads = kHeadWarps * kWarpSize;
// The largest head a warp normalizes in shared memory (8 x 4 KB).
constexpr int kMaxNormedHeadDim = 1024;

struct HeadsArgs {
  HeadRows rows[kMaxHeadRows];
  int n_rows;
  const int32_t* positions;
  KvLayer cache;  // where a set names K or V
  const int32_t* seq_ids;
  int head_dim;
  float eps;
  bool rope;  // the fields below apply
  const float* freq_factors;
  int pairs;  // n_rot / 2
  float theta_scale;
  float freq_scale;
  float ext_factor;
  float corr_low;
  float corr_high;
  float magnitude;
  bool neox;
};

// cos and sin of each pair's angle at position pos, times the magnitude.
__device__ void fill_rope_table(const HeadsArgs& a, int32_t pos, float* cos_t, float* sin_t) {
  for (int i = static_cast<int>(threadIdx.x); i < a.pairs; i += kHeadThreads) {
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
}

__global__ void __launch_bounds__(kHeadThreads) heads_kernel(HeadsArgs a) {
  extern __shared__ float shared[];  // cos[pairs], sin[pairs], then a head per warp
  float* cos_t = shared;
  float* sin_t = shared + a.pairs;
  const int64_t t = blockIdx.x;
  if (a.rope) fill_rope_table(a, __ldg(a.positions + t), cos_t, sin_t);
  __syncthreads();

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  // The warp's head: the sets' heads one after the other. The unrolled loop
  // indexes the parameter array by constants only (a runtime index would
  // copy it to local memory).
  int h = static_cast<int>(blockIdx.y) * kHeadWarps + warp;
  HeadRows rows{};
  bool found = false;
#pragma unroll
  for (int r = 0; r < kMaxHeadRows; ++r) {
    if (!found && r < a.n_rows) {
      if (h < a.rows[r].n_heads) {
        rows = a.rows[r];
        found = true;
      } else {
        h -= a.rows[r].n_heads;
      }
    }
  }
  if (!found) return;  // past the last head; no barrier follows
  float* head = rows.x + t * rows.row_stride + static_cast<int64_t>(h) * a.head_dim;
  const bool rotate = a.rope && rows.rotated;
  const int n_rot = rotate ? 2 * a.pairs : 0;

  float* normed = shared + 2 * a.pairs + warp * a.head_dim;
  if (rows.norm != nullptr) {
    // As rms_norm: mean of squares + eps, an IEEE sqrt and division, x * scale * w.
    float sum = 0.0f;
    for (int i = lane; i < a.head_dim; i += kWarpSize) {
      const float v = head[i];
      normed[i] = v;
      sum += v * v;
    }
    sum = warp_sum(sum);
    const float scale = rms_scale(sum, a.head_dim, a.eps);
    for (int i = lane; i < a.head_dim; i += kWarpSize) normed[i] = normed[i] * scale * __ldg(rows.norm + i);
    __syncwarp();
    for (int i = n_rot + lane; i < a.head_dim; i += kWarpSize) head[i] = normed[i];  // not rotated
  }
  const float* in = rows.norm != nullptr ? normed : head;
  for (int i = lane; i < a.pairs && rotate; i += kWarpSize) {
    const int ia = a.neox ? i : 2 * i;
    const int ib = a.neox ? i + a.pairs : 2 * i + 1;
    const float x0 = in[ia];
    const float x1 = in[ib];
    const float c = cos_t[i];
    const float s = sin_t[i];
    head[ia] = __fmul_rn(x0, c) - __fmul_rn(x1, s);
    head[ib] = __fmul_rn(x0, s) + __fmul_rn(x1, c);
  }
  if (rows.cache == HeadCache::None) return;

  // The head as it now is (other lanes wrote parts of it) into the cache.
  __syncwarp();
  const int64_t row = kv_store_row(a.cache, __ldg(a.seq_ids + t), __ldg(a.positions + t));
  if (row < 0) return;
  void* half = rows.cache == HeadCache::K ? a.cache.k : a.cache.v;
  const int64_t first = row * a.cache.kv_dim + static_cast<int64_t>(h) * a.head_dim;  // the head's first value
  if (a.cache.type == KvFormat::Q8_0) {
    constexpr int kValues = quant::BlockQ8_0::kValues;
    for (int b = lane; b < a.head_dim / kValues; b += kWarpSize) {
      quantize_into(head + b * kValues, static_cast<quant::BlockQ8_0*>(half) + first / kValues + b);
    }
  } else {
    for (int i = lane; i < a.head_dim; i += kWarpSize) static_cast<uint16_t*>(half)[first + i] = quant::float_to_half(head[i]);
  }
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

bool heads_can_store(const KvLayer& cache, int head_dim) {
  return cache.type != KvFormat::Q8_0 || head_dim % quant::BlockQ8_0::kValues == 0;
}

void norm_and_rope_heads(const HeadRows* rows, int n_rows, int n_tokens, int head_dim, float eps,
                         const int32_t* positions, const RopeConfig* rope, cudaStream_t stream,
                         const HeadStore& store) {
  if (n_rows < 1 || n_rows > kMaxHeadRows || head_dim <= 0) {
    throw Error("norm_and_rope_heads: " + std::to_string(n_rows) + " row sets (1 to " + std::to_string(kMaxHeadRows) +
                ") of heads of " + std::to_string(head_dim));
  }
  if (rope != nullptr && (rope->head_dim != head_dim || rope->n_rot <= 0 || rope->n_rot % 2 != 0 || rope->n_rot > head_dim)) {
    throw Error("rope: n_rot must be even and in 1.." + std::to_string(head_dim) + " (head_dim), got " +
                std::to_string(rope->n_rot));
  }
  HeadsArgs a{};
  int total_heads = 0;
  bool any_norm = false, any_store = false;
  for (int r = 0; r < n_rows; ++r) {
    const HeadRows& h = rows[r];
    if (n_tokens < 0 || h.n_heads < 0 || h.row_stride < static_cast<int64_t>(h.n_heads) * head_dim) {
      throw Error("rope: " + std::to_string(h.n_heads) + " heads of " + std::to_string(head_dim) +
                  " do not fit a row stride of " + std::to_string(h.row_stride));
    }
    if (h.cache != HeadCache::None) {
      if (store.cache == nullptr || store.seq_ids == nullptr) {
        throw Error("norm_and_rope_heads: a set stores into the KV cache, but no cache is given");
      }
      check_kv_layer(*store.cache, "norm_and_rope_heads");
      if (store.cache->kv_dim != h.n_heads * head_dim || !heads_can_store(*store.cache, head_dim)) {
        throw Error("norm_and_rope_heads: " + std::to_string(h.n_heads) + " heads of " + std::to_string(head_dim) +
                    " do not fill the cache's rows of " + std::to_string(store.cache->kv_dim) +
                    " (or a Q8_0 block would straddle two heads)");
      }
    }
    a.rows[r] = h;
    total_heads += h.n_heads;
    any_norm = any_norm || h.norm != nullptr;
    any_store = any_store || h.cache != HeadCache::None;
  }
  if (any_norm && head_dim > kMaxNormedHeadDim) {
    throw Error("norm_and_rope_heads: per-head norms of up to " + std::to_string(kMaxNormedHeadDim) + " values, not " +
                std::to_string(head_dim));
  }
  if (n_tokens == 0 || total_heads == 0 || (!any_norm && rope == nullptr && !any_store)) return;
  a.n_rows = n_rows;
  a.positions = positions;
  if (any_store) {
    a.cache = *store.cache;
    a.seq_ids = store.seq_ids;
  }
  a.head_dim = head_dim;
  a.eps = eps;
  a.rope = rope != nullptr;
  if (rope != nullptr) {
    a.freq_factors = rope->freq_factors;
    a.pairs = rope->n_rot / 2;
    a.theta_scale = std::pow(rope->freq_base, -2.0f / static_cast<float>(rope->n_rot));  // as the CPU
    a.freq_scale = rope->freq_scale;
    a.ext_factor = rope->ext_factor;
    a.corr_low = rope->corr_low;
    a.corr_high = rope->corr_high;
    a.magnitude = rope->magnitude;
    a.neox = rope->neox;
  }
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>((total_heads + kHeadWarps - 1) / kHeadWarps));
  const size_t shared = (2 * static_cast<size_t>(a.pairs) + (any_norm ? kHeadWarps * static_cast<size_t>(head_dim) : 0)) *
                        sizeof(float);
  heads_kernel<<<grid, kHeadThreads, shared, stream>>>(a);
  M40_CUDA_CHECK_LAUNCH();
}

void rope(float* x, int n_tokens, int n_heads, int row_stride, const int32_t* positions, const RopeConfig& config,
          cudaStream_t stream) {
  if (config.head_dim <= 0) throw Error("rope: heads of " + std::to_string(config.head_dim) + " values");
  const HeadRows rows{x, n_heads, row_stride, nullptr};
  norm_and_rope_heads(&rows, 1, n_tokens, config.head_dim, 0.0f, positions, &config, stream);
}

}  // namespace m40::cuda

// RMSNorm: one thread block per row, FP32 sum of squares reduced with warp
// shuffles, then a second pass that scales and multiplies by the weight.
// Rows of up to kNormThreads * kCachedVecs float4s (8192 values: every
// common model's width) keep the row and the weight in registers between
// the passes: the weight's loads are issued with the row's, and the second
// pass reads nothing, so a decode step's norm (one row, one block) waits on
// one round trip to memory instead of three.
// CPU twin: cpu::rms_norm (which sums in double; the FP32 tree sum here is
// within ~1e-7 relative of it for any row length the models use).
#include <cstdint>
#include <string>

#include "backends/cuda/pointer_alignment.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/cuda/rms_scale.cuh"
#include "backends/cuda/warp_reduce.cuh"
#include "common/error.h"

namespace m40::cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int kCachedVecs = 8;  // float4s of the row (and of the weight) a thread keeps

// kVec: rows are read and written as float4 (n % 4 == 0, 16-byte aligned).
// x is read with plain loads (not __ldg) because y may be x (in place).
template <bool kVec>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* x, const float* __restrict__ weight, float* y, int n, float eps) {
  __shared__ float scratch[kWarpSize];
  const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * n;
  const float* xr = x + row_offset;
  float* yr = y + row_offset;

  float sum = 0.0f;
  if (kVec && n / 4 <= kNormThreads * kCachedVecs) {
    // The same sums in the same order as the loop below; x is read before
    // any of it is written (y may be x).
    const auto* x4 = reinterpret_cast<const float4*>(xr);
    const auto* w4 = reinterpret_cast<const float4*>(weight);
    float4 xv[kCachedVecs], wv[kCachedVecs];
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kNormThreads;
      if (i < n / 4) {
        xv[k] = x4[i];
        wv[k] = __ldg(w4 + i);
      }
    }
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kNormThreads;
      if (i < n / 4) sum += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
    }
    sum = block_sum(sum, scratch);
    const float scale = rms_scale(sum, n, eps);
    auto* y4 = reinterpret_cast<float4*>(yr);
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kNormThreads;
      if (i < n / 4) {
        const float4 v = xv[k], w = wv[k];
        y4[i] = make_float4(v.x * scale * w.x, v.y * scale * w.y, v.z * scale * w.z, v.w * scale * w.w);
      }
    }
    return;
  }
  if (kVec) {
    const auto* x4 = reinterpret_cast<const float4*>(xr);
    for (int i = static_cast<int>(threadIdx.x); i < n / 4; i += kNormThreads) {
      const float4 v = x4[i];
      sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int i = static_cast<int>(threadIdx.x); i < n; i += kNormThreads) sum += xr[i] * xr[i];
  }
  sum = block_sum(sum, scratch);
  const float scale = rms_scale(sum, n, eps);

  if (kVec) {
    const auto* x4 = reinterpret_cast<const float4*>(xr);
    const auto* w4 = reinterpret_cast<const float4*>(weight);
    auto* y4 = reinterpret_cast<float4*>(yr);
    for (int i = static_cast<int>(threadIdx.x); i < n / 4; i += kNormThreads) {
      const float4 v = x4[i];
      const float4 w = __ldg(w4 + i);
      y4[i] = make_float4(v.x * scale * w.x, v.y * scale * w.y, v.z * scale * w.z, v.w * scale * w.w);
    }
  } else {
    for (int i = static_cast<int>(threadIdx.x); i < n; i += kNormThreads) yr[i] = xr[i] * scale * __ldg(weight + i);
  }
}


}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int n_rows, int n, float eps, cudaStream_t stream) {
  if (n_rows < 0 || n <= 0) {
    throw Error("rms_norm: bad shape " + std::to_string(n_rows) + " rows of " + std::to_string(n));
  }
  if (n_rows == 0) return;
  const bool vec = n % 4 == 0 && aligned16(x) && aligned16(weight) && aligned16(y);
  if (vec) {
    rms_norm_kernel<true><<<n_rows, kNormThreads, 0, stream>>>(x, weight, y, n, eps);
  } else {
    rms_norm_kernel<false><<<n_rows, kNormThreads, 0, stream>>>(x, weight, y, n, eps);
  }
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda

// A branch's output (attention or FFN) joining the residual stream where the
// matmul epilogue's plain x += W h does not do: x += scale * rms_norm(branch
// + bias), with each step optional (BranchJoin), and optionally the RMSNorm
// of the new x that the next stage reads (the FFN's or the next layer's
// input norm), so that a layer with post-norms runs no more kernels than a
// llama one. One pass over the branch for the sum of squares, one that
// adds, one that normalizes; one 256-thread block per row.
// CPU twin: the add_branch step of cpu::CpuBackend::forward (proj += bo;
// cpu::rms_norm; cpu::scale; cpu::add_in_place), in its order, each step
// rounded (no fused multiply-adds); the sum of squares is FP32 against the
// CPU's double, as in rms_norm (norm.cu).
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

constexpr int kJoinThreads = 256;

struct JoinArgs {
  float* x;
  const float* branch;  // does not overlap x
  const float* bias;
  const float* norm;
  float eps;
  float scale;
  int n;
  const float* next_norm;  // null: no normalized output
  float* normed;           // rms_norm(x) * next_norm; may be the branch (it is read first)
};

__device__ __forceinline__ float branch_value(const JoinArgs& a, const float* row, int i) {
  return a.bias != nullptr ? row[i] + __ldg(a.bias + i) : row[i];
}

__global__ void __launch_bounds__(kJoinThreads) add_branch_kernel(JoinArgs a) {
  __shared__ float scratch[kWarpSize];
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * a.n;
  const float* row = a.branch + offset;
  float* xr = a.x + offset;

  float inv = 1.0f;
  if (a.norm != nullptr) {
    float sum = 0.0f;
    for (int i = static_cast<int>(threadIdx.x); i < a.n; i += kJoinThreads) {
      const float v = branch_value(a, row, i);
      sum += v * v;
    }
    sum = block_sum(sum, scratch);
    inv = rms_scale(sum, a.n, a.eps);
  }
  float sum_x = 0.0f;  // of the new x, for the next norm
  for (int i = static_cast<int>(threadIdx.x); i < a.n; i += kJoinThreads) {
    float v = branch_value(a, row, i);
    if (a.norm != nullptr) v = __fmul_rn(__fmul_rn(v, inv), __ldg(a.norm + i));
    if (a.scale != 1.0f) v = __fmul_rn(v, a.scale);
    const float x_new = __fadd_rn(xr[i], v);
    xr[i] = x_new;
    sum_x += x_new * x_new;
  }
  if (a.next_norm == nullptr) return;
  // Every thread has read its part of the branch before block_sum's barrier,
  // so the normalized row may overwrite it. Each thread reads back the x
  // values it wrote itself.
  sum_x = block_sum(sum_x, scratch);
  const float scale = rms_scale(sum_x, a.n, a.eps);
  float* out = a.normed + offset;
  for (int i = static_cast<int>(threadIdx.x); i < a.n; i += kJoinThreads) {
    out[i] = xr[i] * scale * __ldg(a.next_norm + i);
  }
}

// The same for rows of n % 4 == 0 values, 16-byte aligned, of at most
// kJoinThreads * 4 * kMaxVecPerThread values (16384: any model's n_embd):
// each thread keeps its float4s of the row in registers, so the branch, x
// and the weights are read from memory once and nothing is read back after
// a store (the scalar kernel's three dependent passes made a one-token join
// latency-bound: 11-17 us on an H100 where an RMSNorm takes 7).
constexpr int kMaxVecPerThread = 16;

template <int kVecs>
__global__ void __launch_bounds__(kJoinThreads) add_branch_vec_kernel(JoinArgs a) {
  __shared__ float scratch[kWarpSize];
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * a.n;
  const int n4 = a.n / 4;
  const auto* branch4 = reinterpret_cast<const float4*>(a.branch + offset);
  auto* x4 = reinterpret_cast<float4*>(a.x + offset);
  const auto* bias4 = reinterpret_cast<const float4*>(a.bias);
  const auto* norm4 = reinterpret_cast<const float4*>(a.norm);
  const auto* next4 = reinterpret_cast<const float4*>(a.next_norm);

  float4 v[kVecs];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kJoinThreads;
    if (i >= n4) break;
    v[k] = branch4[i];
    if (a.bias != nullptr) {
      const float4 b = __ldg(bias4 + i);
      v[k] = make_float4(v[k].x + b.x, v[k].y + b.y, v[k].z + b.z, v[k].w + b.w);
    }
    sum += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  float inv = 1.0f;
  if (a.norm != nullptr) {
    sum = block_sum(sum, scratch);
    inv = rms_scale(sum, a.n, a.eps);
  }
  float sum_x = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kJoinThreads;
    if (i >= n4) break;
    float4 b = v[k];
    if (a.norm != nullptr) {
      const float4 w = __ldg(norm4 + i);
      b = make_float4(__fmul_rn(__fmul_rn(b.x, inv), w.x), __fmul_rn(__fmul_rn(b.y, inv), w.y),
                      __fmul_rn(__fmul_rn(b.z, inv), w.z), __fmul_rn(__fmul_rn(b.w, inv), w.w));
    }
    if (a.scale != 1.0f) {
      b = make_float4(__fmul_rn(b.x, a.scale), __fmul_rn(b.y, a.scale), __fmul_rn(b.z, a.scale), __fmul_rn(b.w, a.scale));
    }
    const float4 x = x4[i];
    v[k] = make_float4(__fadd_rn(x.x, b.x), __fadd_rn(x.y, b.y), __fadd_rn(x.z, b.z), __fadd_rn(x.w, b.w));
    x4[i] = v[k];
    sum_x += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  if (a.next_norm == nullptr) return;
  sum_x = block_sum(sum_x, scratch);  // also orders the branch's reads before the writes below
  const float scale = rms_scale(sum_x, a.n, a.eps);
  auto* out4 = reinterpret_cast<float4*>(a.normed + offset);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kJoinThreads;
    if (i >= n4) break;
    const float4 w = __ldg(next4 + i);
    out4[i] = make_float4(v[k].x * scale * w.x, v[k].y * scale * w.y, v[k].z * scale * w.z, v[k].w * scale * w.w);
  }
}


// Launches the register-resident kernel with just enough float4s per thread.
template <int kVecs>
bool launch_vec(const JoinArgs& a, int n_rows, cudaStream_t stream) {
  if (a.n / 4 <= kVecs * kJoinThreads) {
    add_branch_vec_kernel<kVecs><<<n_rows, kJoinThreads, 0, stream>>>(a);
    return true;
  }
  if constexpr (kVecs < kMaxVecPerThread) {
    return launch_vec<kVecs * 2>(a, n_rows, stream);
  } else {
    return false;
  }
}

}  // namespace

void add_branch(float* x, const float* branch, const BranchJoin& join, int n_rows, int n, cudaStream_t stream,
                const NextNorm& next) {
  if (n_rows < 0 || n <= 0) {
    throw Error("add_branch: bad shape " + std::to_string(n_rows) + " rows of " + std::to_string(n));
  }
  if ((next.weight == nullptr) != (next.out == nullptr)) {
    throw Error("add_branch: the next norm needs both its weight and its output");
  }
  if (n_rows == 0) return;
  const JoinArgs a{x, branch, join.bias, join.post_norm, join.eps, join.scale, n, next.weight, next.out};
  const bool vec = n % 4 == 0 && aligned16_or_absent(x) && aligned16_or_absent(branch) && aligned16_or_absent(join.bias) &&
                   aligned16_or_absent(join.post_norm) && aligned16_or_absent(next.weight) && aligned16_or_absent(next.out);
  if (!vec || !launch_vec<1>(a, n_rows, stream)) add_branch_kernel<<<n_rows, kJoinThreads, 0, stream>>>(a);
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda

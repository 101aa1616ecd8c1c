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

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/layer_kernels.h"
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
    inv = 1.0f / sqrtf(sum / static_cast<float>(a.n) + a.eps);  // as rms_norm and the CPU
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
  const float scale = 1.0f / sqrtf(sum_x / static_cast<float>(a.n) + a.eps);  // as rms_norm
  float* out = a.normed + offset;
  for (int i = static_cast<int>(threadIdx.x); i < a.n; i += kJoinThreads) {
    out[i] = xr[i] * scale * __ldg(a.next_norm + i);
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
  add_branch_kernel<<<n_rows, kJoinThreads, 0, stream>>>(a);
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda

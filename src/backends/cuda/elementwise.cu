// Element-wise kernels: SwiGLU's silu(gate) * up and the residual add.
// Bandwidth-bound: float4 loads and stores where the pointers allow it, a
// grid-stride loop over a grid sized to fill the GPU. Each output element
// depends only on the inputs at its index, so out may be gate or up, and no
// pointer is declared __restrict__.
// CPU twin of silu_mul: cpu::silu_mul (same formula and order of operations;
// expf differs from the host's exp by at most a couple of ulp).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/layer_kernels.h"
#include "common/error.h"

namespace m40::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__global__ void __launch_bounds__(kThreads)
    silu_mul_vec4_kernel(const float4* gate, const float4* up, float4* out, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n4; i += stride) {
    const float4 g = gate[i];
    const float4 u = up[i];
    out[i] = make_float4(silu_times(g.x, u.x), silu_times(g.y, u.y), silu_times(g.z, u.z), silu_times(g.w, u.w));
  }
}

__global__ void __launch_bounds__(kThreads) silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    out[i] = silu_times(gate[i], up[i]);
  }
}

__global__ void __launch_bounds__(kThreads) add_vec4_kernel(float4* y, const float4* x, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n4; i += stride) {
    float4 a = y[i];
    const float4 b = x[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    y[i] = a;
  }
}

__global__ void __launch_bounds__(kThreads) add_kernel(float* y, const float* x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) y[i] += x[i];
}

int blocks_for(int64_t items) { return static_cast<int>(std::min((items + kThreads - 1) / kThreads, kMaxBlocks)); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_count(const char* op, int64_t n) {
  if (n < 0) throw Error(std::string(op) + ": negative value count " + std::to_string(n));
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  check_count("silu_mul", n);
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(gate) && aligned16(up) && aligned16(out)) {
    silu_mul_vec4_kernel<<<blocks_for(n / 4), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(gate),
                                                                    reinterpret_cast<const float4*>(up),
                                                                    reinterpret_cast<float4*>(out), n / 4);
  } else {
    silu_mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, out, n);
  }
  M40_CUDA_CHECK_LAUNCH();
}

void add_in_place(float* y, const float* x, int64_t n, cudaStream_t stream) {
  check_count("add_in_place", n);
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(y) && aligned16(x)) {
    add_vec4_kernel<<<blocks_for(n / 4), kThreads, 0, stream>>>(reinterpret_cast<float4*>(y),
                                                               reinterpret_cast<const float4*>(x), n / 4);
  } else {
    add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  }
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda

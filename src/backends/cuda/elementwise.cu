// Element-wise kernels: the gated FFN activations (silu(gate) * up for
// SwiGLU, gelu(gate) * up for GeGLU), the residual add, the broadcast bias
// add, and scale-then-soft-cap (embedding scale, logits).
// Bandwidth-bound: float4 loads and stores where the pointers allow it, a
// grid-stride loop over a grid sized to fill the GPU. Each output element
// depends only on the inputs at its index, so out may be gate or up, and no
// pointer is declared __restrict__.
// CPU twins: cpu::silu_mul, cpu::gelu_mul, cpu::add_in_place, cpu::scale and
// cpu::softcap (same formulas and order of operations, products unfused as
// the CPU's source reads them; expf and tanhf differ from the host's exp and
// tanh by at most a couple of ulp, and a host compiler may fuse a product
// into an add: last-bit differences).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/pointer_alignment.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/gated_activation.cuh"
#include "backends/cuda/grid_size.h"
#include "backends/cuda/layer_kernels.h"
#include "common/error.h"

namespace m40::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;

template <class Act>
__global__ void __launch_bounds__(kThreads)
    gated_vec4_kernel(const float4* gate, const float4* up, float4* out, int64_t n4) {
  const Act act;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n4; i += stride) {
    const float4 g = gate[i];
    const float4 u = up[i];
    out[i] = make_float4(act(g.x, u.x), act(g.y, u.y), act(g.z, u.z), act(g.w, u.w));
  }
}

template <class Act>
__global__ void __launch_bounds__(kThreads) gated_kernel(const float* gate, const float* up, float* out, int64_t n) {
  const Act act;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    out[i] = act(gate[i], up[i]);
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

// Up to kMaxBiasTargets matrices of rows, each with its bias, in one
// launch: the grid walks their values as one range.
struct BiasArgs {
  BiasTarget part[kMaxBiasTargets];
  int64_t end[kMaxBiasTargets];  // where each part's values end in the joint range
  int64_t total;                 // all parts' values
  int n_parts;
};

__global__ void __launch_bounds__(kThreads) add_bias_kernel(BiasArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t n = a.total;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    // The part holding value i, chosen with constant indices so that the
    // arguments stay in the constant bank (no local-memory copy).
    BiasTarget t = a.part[0];
    int64_t j = i;
#pragma unroll
    for (int p = 1; p < kMaxBiasTargets; ++p) {
      if (p < a.n_parts && i >= a.end[p - 1]) {
        t = a.part[p];
        j = i - a.end[p - 1];
      }
    }
    t.y[j] += __ldg(t.bias + j % t.n_cols);
  }
}

// Rows of a fused gate/up product: out[r][j] = act(gate_up[r][j],
// gate_up[r][n_ff + j]).
template <class Act>
__global__ void __launch_bounds__(kThreads)
    gated_rows_kernel(const float* __restrict__ gate_up, int64_t rows, int n_ff, float* __restrict__ out) {
  const int64_t total = rows * n_ff;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride) {
    const float* row = gate_up + i / n_ff * 2 * n_ff;
    const int64_t j = i % n_ff;
    out[i] = Act()(row[j], row[n_ff + j]);
  }
}

__global__ void __launch_bounds__(kThreads) scale_and_cap_kernel(float* x, int64_t n, float scale, float cap) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    float v = x[i] * scale;
    if (cap > 0.0f) v = cap * tanhf(v / cap);
    x[i] = v;
  }
}

int blocks_for(int64_t items) { return grid_blocks(items, kThreads, kMaxBlocks); }


void check_count(const char* op, int64_t n) {
  if (n < 0) throw Error(std::string(op) + ": negative value count " + std::to_string(n));
}

template <class Act>
void gated(const char* op, const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  check_count(op, n);
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(gate) && aligned16(up) && aligned16(out)) {
    gated_vec4_kernel<Act><<<blocks_for(n / 4), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(gate),
                                                                      reinterpret_cast<const float4*>(up),
                                                                      reinterpret_cast<float4*>(out), n / 4);
  } else {
    gated_kernel<Act><<<blocks_for(n), kThreads, 0, stream>>>(gate, up, out, n);
  }
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  gated<Silu>("silu_mul", gate, up, out, n, stream);
}

void silu_mul_rows(const float* gate_up, int64_t rows, int n_ff, float* out, cudaStream_t stream) {
  check_count("silu_mul_rows", rows * n_ff);
  if (rows * n_ff == 0) return;
  gated_rows_kernel<Silu><<<blocks_for(rows * n_ff), kThreads, 0, stream>>>(gate_up, rows, n_ff, out);
  M40_CUDA_CHECK_LAUNCH();
}

void gelu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  gated<GeluTanh>("gelu_mul", gate, up, out, n, stream);
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

void add_biases(const BiasTarget* targets, int n_targets, int n_rows, cudaStream_t stream) {
  if (n_targets < 1 || n_targets > kMaxBiasTargets || n_rows < 0) {
    throw Error("add_biases: " + std::to_string(n_targets) + " targets of " + std::to_string(n_rows) +
                " rows (1 to " + std::to_string(kMaxBiasTargets) + " targets)");
  }
  BiasArgs a{};
  int64_t n = 0;
  for (int p = 0; p < n_targets; ++p) {
    if (targets[p].n_cols <= 0) {
      throw Error("add_biases: bad shape " + std::to_string(n_rows) + " rows of " + std::to_string(targets[p].n_cols));
    }
    a.part[p] = targets[p];
    n += static_cast<int64_t>(n_rows) * targets[p].n_cols;
    a.end[p] = n;
  }
  a.n_parts = n_targets;
  a.total = n;
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a);
  M40_CUDA_CHECK_LAUNCH();
}

void add_bias(float* y, const float* bias, int n_rows, int n_cols, cudaStream_t stream) {
  const BiasTarget one{y, bias, n_cols};
  add_biases(&one, 1, n_rows, stream);
}

void scale_and_cap(float* x, int64_t n, float scale, float cap, cudaStream_t stream) {
  check_count("scale_and_cap", n);
  if (cap < 0.0f) throw Error("scale_and_cap: negative soft-cap " + std::to_string(cap));
  if (n == 0) return;
  scale_and_cap_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, scale, cap);
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda

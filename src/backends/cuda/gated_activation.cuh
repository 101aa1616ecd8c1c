// The gated FFN activations on the device, one definition for the
// element-wise kernels (elementwise.cu) and the gated decode product's
// epilogue (matmul_matvec.cu): silu(gate) * up (SwiGLU) and gelu(gate) * up
// (GeGLU, tanh form). CPU twins: cpu::silu_mul, cpu::gelu_mul (same formulas
// and order of operations; expf and tanhf differ from the host's exp and
// tanh by at most a couple of ulp).
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/matmul.h"

namespace m40::cuda {

struct Silu {
  __device__ __forceinline__ float operator()(float g, float u) const { return g / (1.0f + expf(-g)) * u; }
};

// 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) * up, in cpu::gelu_mul's
// order, each step rounded (no fused multiply-adds).
struct GeluTanh {
  __device__ __forceinline__ float operator()(float x, float u) const {
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    constexpr float kCubic = 0.044715f;
    const float inner = __fadd_rn(1.0f, __fmul_rn(kCubic * x, x));
    const float t = tanhf(__fmul_rn(kSqrt2OverPi * x, inner));
    return 0.5f * x * __fadd_rn(1.0f, t) * u;
  }
};

// act(gate) * up for an activation chosen at run time.
__device__ __forceinline__ float gated_value(GatedActivation act, float gate, float up) {
  return act == GatedActivation::GeluTanh ? GeluTanh()(gate, up) : Silu()(gate, up);
}

}  // namespace m40::cuda

// FP16 bits to FP32 with the conversion instruction that every GPU has
// (sm_52 lacks fp16 arithmetic, not the conversion): exact, so equal to
// quant::half_to_float for every input, one instruction instead of a dozen.
// Used by the weight decoders and the attention kernels' K/V reads. Device
// code (nvcc provides the CUDA headers), or host code for the decoder tests.
#pragma once

#include <cstdint>

#include "quant/fp16.h"

namespace m40::cuda {

// The low 16 bits of `bits` as an IEEE half, widened.
__device__ __forceinline__ float widen_half(uint32_t bits) {
#ifdef __CUDA_ARCH__
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(static_cast<unsigned short>(bits & 0xFFFFu)));
  return value;
#else
  // A host build of the decoders (tests/backends/cuda_on_host): the CPU twin.
  return quant::half_to_float(static_cast<uint16_t>(bits & 0xFFFFu));
#endif
}

}  // namespace m40::cuda

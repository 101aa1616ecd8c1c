// RMSNorm's scale on the device, one definition for every kernel that
// normalizes (rms_norm, the heads kernel's per-head norms, the branch joins,
// the MoE combination's next norm): as cpu::rms_norm, the mean of the
// squares plus eps, then an IEEE square root and division (no rsqrtf).
#pragma once

#include <cuda_runtime.h>

namespace m40::cuda {

__device__ __forceinline__ float rms_scale(float sum_of_squares, int n, float eps) {
  return 1.0f / sqrtf(sum_of_squares / static_cast<float>(n) + eps);
}

}  // namespace m40::cuda

// Warp and block reductions with shuffles (sm_30+, so the M40 has them all).
// Device code only: include from .cu files.
#pragma once

#include <cuda_runtime.h>

namespace m40::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarpMask = 0xffffffffu;

// Sum over the `width` consecutive lanes of each aligned group (width a power
// of two, at most 32); every lane of the group gets the result. All 32 lanes
// of the warp must call it.
__device__ __forceinline__ float group_sum(float value, int width = kWarpSize) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullWarpMask, value, offset);
  }
  return value;
}

__device__ __forceinline__ float group_max(float value, int width = kWarpSize) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(kFullWarpMask, value, offset));
  }
  return value;
}

__device__ __forceinline__ float warp_sum(float value) { return group_sum(value, kWarpSize); }
__device__ __forceinline__ float warp_max(float value) { return group_max(value, kWarpSize); }

// Sum over the whole thread block (blockDim.x a multiple of 32, at most
// 1024); every thread gets the result. `scratch` is shared memory of at least
// 32 floats, free for the call; the function synchronizes the block twice.
__device__ __forceinline__ float block_sum(float value, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  value = warp_sum(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < n_warps ? scratch[lane] : 0.0f;
  value = warp_sum(value);
  __syncthreads();  // scratch may be reused right after
  return value;
}

}  // namespace m40::cuda

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


// Sums N values over the lanes of a group (shuffle offsets O, O/2, .. 1;
// lanes = 2 O) with a transposing butterfly: each step sends half of the
// values a lane still holds to its partner and keeps the other half, so N
// values over 32 lanes take N - 1 shuffles (N >= 32) instead of 5 N.
// Afterwards, with N >= lanes, lane `sub` holds the totals of elements
// sub * (N / lanes) + i in v[i]; with N < lanes, v[0] is the total of
// element sub / (lanes / N).
template <int N, int O>
__device__ __forceinline__ void reduce_lanes_transposing(float* v, int sub) {
  if constexpr (O >= 1) {
    if constexpr (N > 1) {
      constexpr int kHalf = N / 2;
      const bool upper = (sub & O) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(kFullWarpMask, send, O);
      }
      reduce_lanes_transposing<kHalf, O / 2>(v, sub);
    } else {
      v[0] += __shfl_xor_sync(kFullWarpMask, v[0], O);
      reduce_lanes_transposing<1, O / 2>(v, sub);
    }
  }
}

}  // namespace m40::cuda

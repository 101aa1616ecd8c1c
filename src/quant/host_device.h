// Lets one function body serve the host compiler and nvcc: under nvcc the
// function is compiled for both sides, elsewhere it is a plain inline function.
#pragma once

#ifdef __CUDACC__
#define M40_HOST_DEVICE __host__ __device__
#else
#define M40_HOST_DEVICE
#endif

// No-alias promise for pointers into blocks and output rows. Blocks hold
// uint8_t arrays, which may alias anything; without it the host compiler must
// assume every float store can change the block and will not vectorize.
#define M40_RESTRICT __restrict__

// Storing K and V values into the paged FP16 or Q8_0 KV cache, for the
// kernels that write it (kv_cache.cu's kv_append, rope.cu's heads kernel).
// Device code only: include from .cu files. The conversions are the CPU's
// own (quant::float_to_half, quant::quantize_block_q8_0), so the cache bytes
// are identical on both sides.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/layer_kernels.h"
#include "backends/kv_blocks.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::cuda {

// The pool row of (seq, pos) in `cache`, or -1 for a token the cache must
// not take (a position outside 0..n_ctx-1 or no sequence; the engine never
// sends one): it is skipped rather than written out of bounds.
__device__ __forceinline__ int64_t kv_store_row(const KvLayer& cache, int32_t seq, int32_t pos) {
  if (pos < 0 || pos >= cache.n_ctx || seq < 0) return -1;
  return backend::kv_row(cache.block_tables + static_cast<int64_t>(seq) * cache.max_blocks, pos);
}

// 32 values of one row into one Q8_0 block, in registers, then stored as
// 17 16-bit words (a block is 34 bytes: only 2-byte aligned). Plain loads:
// src may have been written by the calling kernel.
__device__ __forceinline__ void quantize_into(const float* src, quant::BlockQ8_0* dst) {
  float x[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) x[j] = src[j];
  quant::BlockQ8_0 block;
  quant::quantize_block_q8_0(x, block);
  uint16_t words[17];
  words[0] = block.d;
#pragma unroll
  for (int w = 0; w < 16; ++w) {
    words[w + 1] = static_cast<uint16_t>(static_cast<uint8_t>(block.qs[2 * w]) |
                                         (static_cast<uint16_t>(static_cast<uint8_t>(block.qs[2 * w + 1])) << 8));
  }
  auto* out = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
  for (int w = 0; w < 17; ++w) out[w] = words[w];
}

}  // namespace m40::cuda

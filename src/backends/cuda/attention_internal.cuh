// What the attention translation units share (attention.cu: the checks and
// the kernel choice; attention_decode.cu, attention_prefill.cu: the two
// kernels): how the kernels read a layer's K/V pool per cache type, and the
// two launchers. Included by those .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/half_widen.cuh"
#include "backends/cuda/layer_kernels.h"
#include "backends/cuda/pointer_alignment.h"
#include "quant/blocks.h"

namespace m40::cuda::attn {

constexpr int kMaxHeadDim = 256;

// ---------------------------------------------------------------------------
// FP16 -> FP32 (widen_half, half_widen.cuh), two at a time.

__device__ __forceinline__ void widen_pair(uint32_t word, float* f) {
  f[0] = widen_half(word & 0xffffu);
  f[1] = widen_half(word >> 16);
}

// C consecutive halves loaded with one 16-byte (C = 8) or 8-byte (C = 4)
// read-only load.
template <int C>
struct HalfVec;

template <>
struct HalfVec<8> {
  uint4 raw;
  __device__ __forceinline__ void load(const uint16_t* p) { raw = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void widen(float* f) const {
    widen_pair(raw.x, f);
    widen_pair(raw.y, f + 2);
    widen_pair(raw.z, f + 4);
    widen_pair(raw.w, f + 6);
  }
};

template <>
struct HalfVec<4> {
  uint2 raw;
  __device__ __forceinline__ void load(const uint16_t* p) { raw = __ldg(reinterpret_cast<const uint2*>(p)); }
  __device__ __forceinline__ void widen(float* f) const {
    widen_pair(raw.x, f);
    widen_pair(raw.y, f + 2);
  }
};

// C consecutive values of a Q8_0 row (C = 8 or 4, starting at a multiple of
// C, so inside one block): the block's scale bits and C int8 quants loaded
// as C / 2 16-bit words, widened as quant::dequantize_value does (q * d).
template <int C>
struct Q8Vec {
  static constexpr int kWords = C / 4;
  uint32_t scale_bits;
  uint32_t quants[kWords];
  // Value e of the flat array of rows (row r's value i is r * kv_dim + i,
  // kv_dim a multiple of 32).
  __device__ __forceinline__ void load(const uint8_t* base, int64_t e) {
    load_block(base + (e >> 5) * static_cast<int64_t>(sizeof(quant::BlockQ8_0)), static_cast<uint32_t>(e & 31));
  }
  // The values from quant `in_block` on of the block at `block`.
  __device__ __forceinline__ void load_block(const uint8_t* block, uint32_t in_block) {
    const auto* words = reinterpret_cast<const unsigned short*>(block);
    scale_bits = __ldg(words);
    const auto* qs = reinterpret_cast<const unsigned short*>(block + 2 + in_block);
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      quants[w] = static_cast<uint32_t>(__ldg(qs + 2 * w)) | (static_cast<uint32_t>(__ldg(qs + 2 * w + 1)) << 16);
    }
  }
  __device__ __forceinline__ void widen(float* f) const {
    const float d = widen_half(scale_bits);
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        f[4 * w + b] = d * static_cast<float>(static_cast<int8_t>(quants[w] >> (8 * b)));
      }
    }
  }
};

// How the kernels address a layer's K or V pool, per cache type: Head is
// one KV head's view of the pool (head(base, offset) from the pool and the
// head's first value in a row) and Vec<C> loads C values of it at
// `e` values past that (e = row * kv_dim + d). Piece is one lane's fixed
// piece of every row (the decode kernel's view): piece(base, offset,
// kv_dim) with `offset` the piece's first value in a row, and
// Vec<C>::load(piece, row) reads it from pool row `row`, addressed with
// one 32 x 32 -> 64-bit multiply-add.
struct F16Rows {
  using Head = const uint16_t*;
  struct Piece {
    const uint8_t* first;  // the piece in row 0
    uint32_t row_bytes;
  };
  template <int C>
  struct Vec : HalfVec<C> {
    __device__ __forceinline__ void load(Head head, int64_t e) { HalfVec<C>::load(head + e); }
    __device__ __forceinline__ void load(const Piece& piece, uint32_t row) {
      HalfVec<C>::load(reinterpret_cast<const uint16_t*>(piece.first + static_cast<uint64_t>(row) * piece.row_bytes));
    }
  };
  __device__ __forceinline__ static Head head(const void* base, int64_t offset) {
    return static_cast<const uint16_t*>(base) + offset;
  }
  __device__ __forceinline__ static Piece piece(const void* base, int64_t offset, int kv_dim) {
    return Piece{static_cast<const uint8_t*>(base) + offset * static_cast<int64_t>(sizeof(uint16_t)),
                 static_cast<uint32_t>(kv_dim) * static_cast<uint32_t>(sizeof(uint16_t))};
  }
};

struct Q8Rows {
  struct Head {
    const uint8_t* base;
    int64_t offset;
  };
  // A piece lies inside one block (its first value a multiple of its size).
  struct Piece {
    const uint8_t* first;  // the block holding the piece in row 0
    uint32_t row_bytes;    // kv_dim / 32 blocks
    uint32_t in_block;     // the piece's first quant in its block
  };
  template <int C>
  struct Vec : Q8Vec<C> {
    __device__ __forceinline__ void load(const Head& head, int64_t e) { Q8Vec<C>::load(head.base, head.offset + e); }
    __device__ __forceinline__ void load(const Piece& piece, uint32_t row) {
      Q8Vec<C>::load_block(piece.first + static_cast<uint64_t>(row) * piece.row_bytes, piece.in_block);
    }
  };
  __device__ __forceinline__ static Head head(const void* base, int64_t offset) {
    return Head{static_cast<const uint8_t*>(base), offset};
  }
  __device__ __forceinline__ static Piece piece(const void* base, int64_t offset, int kv_dim) {
    constexpr int64_t kBlockBytes = sizeof(quant::BlockQ8_0);
    constexpr int kBlockValues = 32;
    return Piece{static_cast<const uint8_t*>(base) + offset / kBlockValues * kBlockBytes,
                 static_cast<uint32_t>(kv_dim / kBlockValues * kBlockBytes),
                 static_cast<uint32_t>(offset % kBlockValues)};
  }
};

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

inline int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Whether a lane reads K/V rows in pieces of 8 values (head_dim a multiple
// of 8, and for FP16 a 16-byte aligned cache), else 4.
inline bool kv_rows_of_8(const KvLayer& cache, int head_dim) {
  return head_dim % 8 == 0 &&
         (cache.type == KvFormat::Q8_0 || (aligned(cache.k, 16) && aligned(cache.v, 16)));
}

// The fields both kernels' arguments (DecodeArgs, PrefillArgs) take from the
// cache, the shape and the call.
template <class Args>
void fill_common_args(Args& a, const KvLayer& cache, const AttentionShape& shape, float scale, const float* q,
                      const int32_t* seq_ids, const int32_t* positions, float* out) {
  a.k = cache.k;
  a.v = cache.v;
  a.q = q;
  a.seq_ids = seq_ids;
  a.positions = positions;
  a.out = out;
  a.block_tables = cache.block_tables;
  a.max_blocks = cache.max_blocks;
  a.n_ctx = cache.n_ctx;
  a.kv_dim = cache.kv_dim;
  a.head_dim = shape.head_dim;
  a.n_head = shape.n_head;
  a.gqa = shape.n_head / shape.n_head_kv;
  a.scale = scale;
  a.softcap = shape.softcap;
  a.window = shape.window;
}

// The decode kernel (attention_decode.cu) for n_tokens tokens seeing up to
// max_positions keys; forced_splits > 0 fixes the number of context parts,
// forced_heads > 0 the query heads a block takes.
void run_decode(const KvLayer& cache, const AttentionShape& shape, float scale, const float* q,
                const int32_t* seq_ids, const int32_t* positions, int n_tokens, int max_positions, float* out,
                cudaStream_t stream, int forced_splits, int forced_heads);

// The prefill kernel (attention_prefill.cu).
void run_prefill(const KvLayer& cache, const AttentionShape& shape, float scale, const float* q,
                 const int32_t* seq_ids, const int32_t* positions, int n_tokens, float* out, cudaStream_t stream);

}  // namespace m40::cuda::attn

// Causal attention over the FP16 or Q8_0 KV cache, all math in FP32, with the scores
// scaled, optionally soft-capped (cap * tanh(s / cap)), and optionally limited
// to a sliding window of the last `window` positions. CPU twin:
// cpu::attention. Two kernels:
//
// Decode (few tokens, any layout): one block of 4 warps per (token, KV head,
// context part). The block holds up to 4 query heads of that KV head (GQA),
// so each K/V row is read from memory once for all of them. Lanes split a
// key row into 16-byte pieces (8 halves; 4 for head dims that are not a
// multiple of 8): head_dim 128 takes 16 lanes, so a warp reads two whole
// 256-byte rows per load instruction, coalesced. Keys are taken 256 at a
// time: their scores go to shared memory, one warp per head takes the max and
// the exponentials, and the running max/sum of an online softmax rescales the
// per-lane V accumulators. A long context is split into parts (flash-decoding):
// each part writes its unnormalized output and its (max, sum) to scratch, and
// a combine kernel merges them, so one sequence still fills the GPU. A
// windowed layer's parts split the window only, starting at its first key.
//
// Prefill (many tokens): one block per (tile of 32 query tokens, query head).
// Q, then K, then V tiles of 32 positions sit in shared memory as FP32 rows
// padded by 16 bytes (conflict-free float4 reads); each thread computes a
// 4x2 block of scores and a 4x8 block of the output with float4 shared loads,
// and the softmax is online over the key tiles. Tokens of one tile that
// belong to different sequences (a mixed batch) are handled one sequence at a
// time ("segments"); each token is masked to its own positions, so any
// positions layout is correct. With a window, a segment starts at the key
// tile of its earliest visible key.
//
// The soft-cap is applied where the scores become softmax statistics (one
// tanhf per visible score, outside the unrolled dot products), in kernels of
// their own (template parameter kCap): tanhf's temporaries beside the live
// accumulators cost 11 to 16 registers, which would cut the uncapped decode
// kernel from 4 to 3 blocks per M40 multiprocessor.
//
// The cache is paged (backends/kv_blocks.h): every K/V read goes through the
// token's sequence's block table. Both kernels map a run of key positions to
// pool rows once, into shared memory (the decode kernel per sub-chunk of 256
// keys, the prefill kernel per key tile), and the loads of K and V then read
// the row from there: one table lookup per key position, not per element.
//
// A Q8_0 cache (KvLayer::type) runs the same kernels instantiated for its
// rows (template parameter Rows): a lane's piece of 8 or 4 values lies in one
// 32-value block, read as 16-bit words (blocks are 34 bytes, so only 2-byte
// aligned) with the block's scale and widened to FP32 as q * d, exactly
// quant::dequantize_value. The FP16 instantiations are the code they were.
//
// Positions outside 0..n_ctx-1 (and negative sequence ids) give NaN outputs
// rather than out-of-bounds reads; the engine never sends them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/pointer_alignment.h"
#include "backends/cuda/attention_variants.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/warp_reduce.cuh"
#include "backends/kv_blocks.h"
#include "common/error.h"
#include "quant/blocks.h"

namespace m40::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

// ---------------------------------------------------------------------------
// FP16 -> FP32: the hardware conversion (cvt.f32.f16 exists on every
// architecture; it is fp16 arithmetic that sm_52 lacks). Exact, like
// quant::half_to_float, but one instruction.

__device__ __forceinline__ float widen_half(uint32_t bits16) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(bits16)));
  return f;
}

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
  __device__ __forceinline__ void zero() { raw = make_uint4(0, 0, 0, 0); }
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
  __device__ __forceinline__ void zero() { raw = make_uint2(0, 0); }
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
    const uint8_t* block = base + (e >> 5) * static_cast<int64_t>(sizeof(quant::BlockQ8_0));
    const auto* words = reinterpret_cast<const unsigned short*>(block);
    scale_bits = __ldg(words);
    const auto* qs = reinterpret_cast<const unsigned short*>(block + 2 + (e & 31));
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      quants[w] = static_cast<uint32_t>(__ldg(qs + 2 * w)) | (static_cast<uint32_t>(__ldg(qs + 2 * w + 1)) << 16);
    }
  }
  __device__ __forceinline__ void zero() {
    scale_bits = 0;
#pragma unroll
    for (int w = 0; w < kWords; ++w) quants[w] = 0;
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
// `e` values past that (e = row * kv_dim + d).
struct F16Rows {
  using Head = const uint16_t*;
  template <int C>
  struct Vec : HalfVec<C> {
    __device__ __forceinline__ void load(Head head, int64_t e) { HalfVec<C>::load(head + e); }
  };
  __device__ __forceinline__ static Head head(const void* base, int64_t offset) {
    return static_cast<const uint16_t*>(base) + offset;
  }
};

struct Q8Rows {
  struct Head {
    const uint8_t* base;
    int64_t offset;
  };
  template <int C>
  struct Vec : Q8Vec<C> {
    __device__ __forceinline__ void load(const Head& head, int64_t e) { Q8Vec<C>::load(head.base, head.offset + e); }
  };
  __device__ __forceinline__ static Head head(const void* base, int64_t offset) {
    return Head{static_cast<const uint8_t*>(base), offset};
  }
};

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// ---------------------------------------------------------------------------
// Decode kernel

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * kWarpSize;
constexpr int kSubChunk = 256;  // key positions whose scores sit in shared memory at once
constexpr int kSplitGranule = 64;  // a context part is a multiple of this many positions
constexpr int kUnroll = 4;      // loads in flight per lane

struct DecodeArgs {
  const void* k;  // FP16 bits or quant::BlockQ8_0 blocks (the kernel's Rows)
  const void* v;
  const float* q;
  const int32_t* seq_ids;
  const int32_t* positions;
  float* out;       // written directly when n_splits == 1
  float* part_acc;  // [n_tokens][n_head][n_splits][head_dim] unnormalized outputs
  float* part_ml;   // [n_tokens][n_head][n_splits][2] running max and sum
  const int32_t* block_tables;  // [n_seq][max_blocks]
  int max_blocks;
  int n_ctx;
  int kv_dim;
  int head_dim;
  int n_head;
  int gqa;              // query heads per KV head
  int groups_per_kv;    // blocks per KV head: ceil(gqa / HB)
  int lanes_per_key;    // power of two >= head_dim / C, at most 32
  int n_splits;
  int positions_per_split;  // the most a part covers (the launch's longest span, cut in n_splits)
  int split_granule;        // parts are whole multiples of this many positions
  float scale;
  float softcap;  // 0: off
  int window;     // 0: none
};

// The positions one part covers for a token that sees `span` keys: the span
// cut into the launch's parts, in whole granules. Sized per token (not from
// the launch's longest span) so that a decode graph captured for the whole
// context still spreads a short context over every part.
__device__ __forceinline__ int part_length(int span, const DecodeArgs& a) {
  int per = (span + a.n_splits - 1) / a.n_splits;
  per = (per + a.split_granule - 1) / a.split_granule * a.split_granule;
  return max(1, min(per, a.positions_per_split));
}

// Rows: the cache type (F16Rows, Q8Rows); C: values per lane load (8 or 4);
// HB: query heads per block (1, 2 or 4);
// kCap: soft-capped scores. Grid: x = split + n_splits * (head group), y =
// token. (The "2 blocks per multiprocessor" bound changes nothing but CUDA
// 11.8's ptxas heuristics, which otherwise spill a few bytes of the HB = 2
// variant at 80 registers.)
template <class Rows, int C, int HB, bool kCap>
__global__ void __launch_bounds__(kDecodeThreads, 2) attention_decode_kernel(DecodeArgs a) {
  static_assert(HB <= kDecodeWarps, "one warp per head for the softmax statistics");
  // Scores [HB][kSubChunk] during the loop, then per-warp partial outputs
  // [kDecodeWarps][HB][head_dim].
  __shared__ float buf[kDecodeWarps * HB * kMaxHeadDim];
  __shared__ float s_m[HB], s_l[HB], s_corr[HB];
  __shared__ int s_row[kSubChunk];  // the pool rows of the sub-chunk's keys

  const int t = static_cast<int>(blockIdx.y);
  const int split = static_cast<int>(blockIdx.x) % a.n_splits;
  const int group = static_cast<int>(blockIdx.x) / a.n_splits;
  const int kvh = group / a.groups_per_kv;
  const int first_in_kv = (group % a.groups_per_kv) * HB;
  const int h0 = kvh * a.gqa + first_in_kv;
  const int nh = min(HB, a.gqa - first_in_kv);
  const int q_dim = a.n_head * a.head_dim;
  const bool direct = a.n_splits == 1;

  const int pos = __ldg(a.positions + t);
  const int seq = __ldg(a.seq_ids + t);
  if (pos < 0 || pos >= a.n_ctx || seq < 0) {
    if (direct) {  // (the combine kernel writes the NaNs otherwise)
      for (int i = static_cast<int>(threadIdx.x); i < nh * a.head_dim; i += kDecodeThreads) {
        a.out[static_cast<int64_t>(t) * q_dim + static_cast<int64_t>(h0) * a.head_dim + i] = quiet_nan();
      }
    }
    return;
  }
  const int n_pos = pos + 1;
  const int first = a.window > 0 ? max(0, n_pos - a.window) : 0;  // the first visible key
  const int per_part = part_length(n_pos - first, a);
  const int begin = first + split * per_part;
  if (begin >= n_pos) return;  // this token's context is shorter; the combine skips the part
  const int end = split == a.n_splits - 1 ? n_pos : min(begin + per_part, n_pos);

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int L = a.lanes_per_key;
  const int sub = lane & (L - 1);  // which piece of the row
  const int slot = lane / L;       // which key of the warp's step
  const int keys_per_warp = kWarpSize / L;
  const int keys_per_step = kDecodeWarps * keys_per_warp;
  const int d0 = sub * C;
  const bool has_dims = d0 < a.head_dim;

  float qr[HB][C];
#pragma unroll
  for (int h = 0; h < HB; ++h) {
    const float* qh = a.q + static_cast<int64_t>(t) * q_dim + static_cast<int64_t>(h0 + h) * a.head_dim + d0;
    const bool load = has_dims && h < nh;
#pragma unroll
    for (int c = 0; c < C; c += 4) {
      const float4 v = load ? __ldg(reinterpret_cast<const float4*>(qh + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
      qr[h][c] = v.x;
      qr[h][c + 1] = v.y;
      qr[h][c + 2] = v.z;
      qr[h][c + 3] = v.w;
    }
  }
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  const int64_t head_offset = static_cast<int64_t>(kvh) * a.head_dim + d0;
  const typename Rows::Head k_rows = Rows::head(a.k, head_offset);
  const typename Rows::Head v_rows = Rows::head(a.v, head_offset);

  float acc[HB][C];
#pragma unroll
  for (int h = 0; h < HB; ++h) {
#pragma unroll
    for (int c = 0; c < C; ++c) acc[h][c] = 0.0f;
  }
  if (threadIdx.x < HB) {
    s_m[threadIdx.x] = -INFINITY;
    s_l[threadIdx.x] = 0.0f;
    s_corr[threadIdx.x] = 1.0f;
  }

  for (int c0 = begin; c0 < end; c0 += kSubChunk) {
    const int len = min(kSubChunk, end - c0);
    // The pool rows of these keys (the previous sub-chunk's readers are
    // past the __syncthreads that ends its loop).
    for (int j = static_cast<int>(threadIdx.x); j < len; j += kDecodeThreads) {
      s_row[j] = static_cast<int>(backend::kv_row(table, c0 + j));
    }
    __syncthreads();
    // Scores. The loop bound is uniform over the warp: the shuffles inside
    // need all 32 lanes.
    for (int jb = warp * keys_per_warp; jb < len; jb += kUnroll * keys_per_step) {
      typename Rows::template Vec<C> kv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = jb + u * keys_per_step + slot;
        if (has_dims && j < len) {
          kv[u].load(k_rows, static_cast<int64_t>(s_row[j]) * a.kv_dim);
        } else {
          kv[u].zero();
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float kf[C];
        kv[u].widen(kf);
        float dot[HB];
#pragma unroll
        for (int h = 0; h < HB; ++h) {
          dot[h] = 0.0f;
#pragma unroll
          for (int c = 0; c < C; ++c) dot[h] += qr[h][c] * kf[c];
          dot[h] = group_sum(dot[h], L);
        }
        const int j = jb + u * keys_per_step + slot;
        if (sub == 0 && j < len) {
#pragma unroll
          for (int h = 0; h < HB; ++h) buf[h * kSubChunk + j] = dot[h] * a.scale;
        }
      }
    }
    __syncthreads();

    // Softmax statistics, one warp per head: new running max, the factor
    // that rescales what was accumulated so far, and the probabilities.
    if (warp < nh) {
      float* s = buf + warp * kSubChunk;
      float mx = -INFINITY;
      for (int j = lane; j < len; j += kWarpSize) {
        float v = s[j];
        if constexpr (kCap) {
          v = a.softcap * tanhf(v / a.softcap);
          s[j] = v;
        }
        mx = fmaxf(mx, v);
      }
      mx = warp_max(mx);
      const float m_old = s_m[warp];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int j = lane; j < len; j += kWarpSize) {
        const float p = expf(s[j] - m_new);
        s[j] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      // Every lane has read s_m[warp] before lane 0 overwrites it (racecheck:
      // the shuffles order the lanes in practice, not by the memory model).
      __syncwarp();
      if (lane == 0) {
        const float corr = expf(m_old - m_new);  // 0 on the first sub-chunk
        s_corr[warp] = corr;
        s_l[warp] = s_l[warp] * corr + sum;
        s_m[warp] = m_new;
      }
    }
    __syncthreads();

    // Weighted V.
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      const float corr = s_corr[h];
#pragma unroll
      for (int c = 0; c < C; ++c) acc[h][c] *= corr;
    }
    for (int jb = warp * keys_per_warp; jb < len; jb += kUnroll * keys_per_step) {
      typename Rows::template Vec<C> vv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = jb + u * keys_per_step + slot;
        if (has_dims && j < len) {
          vv[u].load(v_rows, static_cast<int64_t>(s_row[j]) * a.kv_dim);
        } else {
          vv[u].zero();
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = jb + u * keys_per_step + slot;
        if (j < len) {
          float vf[C];
          vv[u].widen(vf);
#pragma unroll
          for (int h = 0; h < HB; ++h) {
            const float p = buf[h * kSubChunk + j];
#pragma unroll
            for (int c = 0; c < C; ++c) acc[h][c] += p * vf[c];
          }
        }
      }
    }
    __syncthreads();
  }

  // Sum over the key slots of the warp, then over the warps.
#pragma unroll
  for (int h = 0; h < HB; ++h) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      for (int offset = L; offset < kWarpSize; offset *= 2) {
        acc[h][c] += __shfl_xor_sync(kFullWarpMask, acc[h][c], offset);
      }
    }
  }
  if (slot == 0 && has_dims) {
#pragma unroll
    for (int h = 0; h < HB; ++h) {
#pragma unroll
      for (int c = 0; c < C; ++c) buf[(warp * HB + h) * a.head_dim + d0 + c] = acc[h][c];
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < nh * a.head_dim; i += kDecodeThreads) {
    const int h = i / a.head_dim;
    const int d = i % a.head_dim;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) total += buf[(w * HB + h) * a.head_dim + d];
    const int64_t head = h0 + h;
    if (direct) {
      a.out[static_cast<int64_t>(t) * q_dim + head * a.head_dim + d] = total / s_l[h];
    } else {
      a.part_acc[((static_cast<int64_t>(t) * a.n_head + head) * a.n_splits + split) * a.head_dim + d] = total;
    }
  }
  if (!direct && static_cast<int>(threadIdx.x) < nh) {
    const int h = static_cast<int>(threadIdx.x);
    float* ml = a.part_ml + ((static_cast<int64_t>(t) * a.n_head + h0 + h) * a.n_splits + split) * 2;
    ml[0] = s_m[h];
    ml[1] = s_l[h];
  }
}

constexpr int kCombineThreads = 128;

// Merges the parts of one (token, query head): out = sum_s w_s acc_s /
// sum_s w_s l_s with w_s = exp(m_s - max m). Grid: x = head, y = token.
__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(DecodeArgs a) {
  __shared__ float weight[detail::kMaxSplits];
  __shared__ float total;
  const int head = static_cast<int>(blockIdx.x);
  const int t = static_cast<int>(blockIdx.y);
  const int64_t item = static_cast<int64_t>(t) * a.n_head + head;
  float* out = a.out + item * a.head_dim;  // q_dim = n_head * head_dim
  const int pos = __ldg(a.positions + t);
  const int seq = __ldg(a.seq_ids + t);
  if (pos < 0 || pos >= a.n_ctx || seq < 0) {
    for (int d = static_cast<int>(threadIdx.x); d < a.head_dim; d += kCombineThreads) out[d] = quiet_nan();
    return;
  }
  const int n_pos = pos + 1;
  const int first = a.window > 0 ? max(0, n_pos - a.window) : 0;  // as the decode kernel
  const int per_part = part_length(n_pos - first, a);  // as the decode kernel
  const int n_valid = min(a.n_splits, (n_pos - first + per_part - 1) / per_part);
  const float* ml = a.part_ml + item * a.n_splits * 2;
  if (threadIdx.x < kWarpSize) {
    const int lane = static_cast<int>(threadIdx.x);
    float m = -INFINITY;
    for (int s = lane; s < n_valid; s += kWarpSize) m = fmaxf(m, ml[2 * s]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int s = lane; s < n_valid; s += kWarpSize) {
      const float w = expf(ml[2 * s] - m);
      weight[s] = w;
      sum += w * ml[2 * s + 1];
    }
    sum = warp_sum(sum);
    if (lane == 0) total = sum;
  }
  __syncthreads();
  const float* acc = a.part_acc + item * a.n_splits * a.head_dim;
  for (int d = static_cast<int>(threadIdx.x); d < a.head_dim; d += kCombineThreads) {
    float sum = 0.0f;
    for (int s = 0; s < n_valid; ++s) sum += weight[s] * acc[static_cast<int64_t>(s) * a.head_dim + d];
    out[d] = sum / total;
  }
}

// ---------------------------------------------------------------------------
// Prefill kernel

constexpr int kPrefillThreads = 128;

struct PrefillArgs {
  const void* k;  // FP16 bits or quant::BlockQ8_0 blocks (the kernel's Rows)
  const void* v;
  const float* q;
  const int32_t* seq_ids;
  const int32_t* positions;
  float* out;
  const int32_t* block_tables;  // [n_seq][max_blocks]
  int max_blocks;
  int n_ctx;
  int kv_dim;
  int head_dim;
  int n_head;
  int gqa;
  int n_tokens;
  bool rows_of_8;  // head_dim % 8 == 0 (and for FP16 a 16-byte aligned cache): pieces of 8 values
  float scale;
  float softcap;  // 0: off
  int window;     // 0: none
};

// Positions kv0..kv0+BK-1 of one KV head into `tile` as FP32 rows of D
// (zero past head_dim and past kv_end), row stride LD4 float4s; position
// kv0 + r is pool row tile_row[r] of `rows` (the head's view of the pool).
template <class Rows, int D, int BK, int LD4>
__device__ __forceinline__ void load_kv_tile(float4* tile, const typename Rows::Head& rows, const int* tile_row,
                                             int kv0, int kv_end, const PrefillArgs& a) {
  constexpr int kPieces = D / 8;  // 8 values per piece
  for (int i = static_cast<int>(threadIdx.x); i < BK * kPieces; i += kPrefillThreads) {
    const int r = i / kPieces;
    const int d = (i % kPieces) * 8;
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int p = kv0 + r;
    if (p < kv_end && d < a.head_dim) {
      const int64_t e = static_cast<int64_t>(tile_row[r]) * a.kv_dim + d;
      if (a.rows_of_8) {
        typename Rows::template Vec<8> h;
        h.load(rows, e);
        h.widen(f);
      } else {  // head_dim % 4 == 0
        typename Rows::template Vec<4> h;
        h.load(rows, e);
        h.widen(f);
        if (d + 4 < a.head_dim) {
          h.load(rows, e + 4);
          h.widen(f + 4);
        }
      }
    }
    tile[r * LD4 + d / 4] = make_float4(f[0], f[1], f[2], f[3]);
    tile[r * LD4 + d / 4 + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

__device__ __forceinline__ float4 fma4(float s, float4 v, float4 acc) {
  acc.x += s * v.x;
  acc.y += s * v.y;
  acc.z += s * v.z;
  acc.w += s * v.w;
  return acc;
}

__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// D: head_dim rounded up (64, 128, 256); BQ query tokens by BK key positions
// per tile; kCap: soft-capped scores. Grid: x = query tile (last tile first:
// it has the most keys), y = query head. (Shared memory allows two blocks per
// multiprocessor on the M40 anyway; saying so keeps CUDA 13's ptxas from
// spilling at sm_90.)
template <class Rows, int D, int BQ, int BK, bool kCap>
__global__ void __launch_bounds__(kPrefillThreads, 2) attention_prefill_kernel(PrefillArgs a) {
  constexpr int TQ = 8;   // thread rows
  constexpr int TK = 16;  // thread columns
  static_assert(TQ * TK == kPrefillThreads, "thread grid");
  constexpr int SQ = BQ / TQ;        // query rows per thread (scores and output)
  constexpr int SK = BK / TK;        // keys per thread in the score tile
  constexpr int OD4 = D / (4 * TK);  // float4 columns per thread in the output tile
  constexpr int LD4 = D / 4 + 1;     // row stride in float4s: 16 bytes of padding
  constexpr int PLD = BK + 4;        // probability row stride in floats
  constexpr int kRowThreads = kPrefillThreads / BQ;  // threads per row for the statistics
  constexpr int kRowEntries = BK / kRowThreads;
  static_assert(SQ * TQ == BQ && SK * TK == BK && OD4 * 4 * TK == D && kRowEntries * kRowThreads == BK, "tiles");

  __shared__ float4 q_tile[BQ * LD4];
  __shared__ float4 kv_tile[BK * LD4];
  __shared__ float4 p_tile4[BQ * PLD / 4];
  __shared__ float row_m[BQ], row_l[BQ], row_corr[BQ];
  __shared__ int row_seq[BQ], row_pos[BQ], row_limit[BQ];
  __shared__ bool row_pending[BQ];
  __shared__ int seg_seq, seg_kv_begin, seg_kv_end;
  __shared__ int tile_row[BK];  // the pool rows of the key tile's positions
  float* p_tile = reinterpret_cast<float*>(p_tile4);

  const int tid = static_cast<int>(threadIdx.x);
  const int tk = tid % TK;
  const int tq = tid / TK;
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * BQ;
  const int head = static_cast<int>(blockIdx.y);
  const int kvh = head / a.gqa;
  const int q_dim = a.n_head * a.head_dim;

  if (tid < BQ) {
    const int t = q0 + tid;
    int seq = -1;
    int pos = -1;
    if (t < a.n_tokens) {
      seq = __ldg(a.seq_ids + t);
      pos = __ldg(a.positions + t);
    }
    const bool ok = t < a.n_tokens && seq >= 0 && pos >= 0 && pos < a.n_ctx;
    row_seq[tid] = seq;
    row_pos[tid] = ok ? pos : -1;
    row_pending[tid] = ok;
    row_m[tid] = -INFINITY;
    row_l[tid] = 0.0f;
  }
  for (int i = tid; i < BQ * (D / 4); i += kPrefillThreads) {
    const int r = i / (D / 4);
    const int c4 = i % (D / 4);
    const int t = q0 + r;
    float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < a.n_tokens && 4 * c4 < a.head_dim) {
      value = __ldg(reinterpret_cast<const float4*>(a.q + static_cast<int64_t>(t) * q_dim +
                                                    static_cast<int64_t>(head) * a.head_dim + 4 * c4));
    }
    q_tile[r * LD4 + c4] = value;
  }

  float4 acc[SQ][OD4];
#pragma unroll
  for (int i = 0; i < SQ; ++i) {
#pragma unroll
    for (int j = 0; j < OD4; ++j) acc[i][j] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  for (;;) {
    // The next segment: the pending rows of the first pending row's sequence.
    __syncthreads();
    if (tid == 0) {
      int seq = -1;
      int kv_begin = a.n_ctx;
      int kv_end = 0;
      for (int r = 0; r < BQ; ++r) {
        if (row_pending[r] && (seq < 0 || row_seq[r] == seq)) {
          seq = row_seq[r];
          row_pending[r] = false;
          row_limit[r] = row_pos[r];
          kv_begin = min(kv_begin, a.window > 0 ? max(0, row_pos[r] + 1 - a.window) : 0);
          kv_end = max(kv_end, row_pos[r] + 1);
        } else {
          row_limit[r] = -1;
        }
      }
      seg_seq = seq;
      seg_kv_begin = kv_begin;
      seg_kv_end = kv_end;
    }
    __syncthreads();
    const int kv_end = seg_kv_end;
    if (kv_end == 0) break;
    int limit[SQ];
#pragma unroll
    for (int i = 0; i < SQ; ++i) limit[i] = row_limit[tq + TQ * i];
    const int32_t* table = a.block_tables + static_cast<int64_t>(seg_seq) * a.max_blocks;
    const int64_t head_offset = static_cast<int64_t>(kvh) * a.head_dim;
    const typename Rows::Head k_rows = Rows::head(a.k, head_offset);
    const typename Rows::Head v_rows = Rows::head(a.v, head_offset);

    // Tiles wholly before every row's window are skipped; within the others
    // each row sees keys limit - window < key <= limit.
    for (int kv0 = seg_kv_begin / BK * BK; kv0 < kv_end; kv0 += BK) {
      // The tile's pool rows (the previous tile's V load is past the
      // __syncthreads that ends its iteration).
      if (tid < BK) tile_row[tid] = kv0 + tid < kv_end ? static_cast<int>(backend::kv_row(table, kv0 + tid)) : 0;
      __syncthreads();
      load_kv_tile<Rows, D, BK, LD4>(kv_tile, k_rows, tile_row, kv0, kv_end, a);
      __syncthreads();

      float s[SQ][SK];
#pragma unroll
      for (int i = 0; i < SQ; ++i) {
#pragma unroll
        for (int j = 0; j < SK; ++j) s[i][j] = 0.0f;
      }
#pragma unroll 8
      for (int c4 = 0; c4 < D / 4; ++c4) {
        float4 qv[SQ];
        float4 kv[SK];
#pragma unroll
        for (int i = 0; i < SQ; ++i) qv[i] = q_tile[(tq + TQ * i) * LD4 + c4];
#pragma unroll
        for (int j = 0; j < SK; ++j) kv[j] = kv_tile[(tk + TK * j) * LD4 + c4];
#pragma unroll
        for (int i = 0; i < SQ; ++i) {
#pragma unroll
          for (int j = 0; j < SK; ++j) {
            s[i][j] += qv[i].x * kv[j].x;
            s[i][j] += qv[i].y * kv[j].y;
            s[i][j] += qv[i].z * kv[j].z;
            s[i][j] += qv[i].w * kv[j].w;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < SQ; ++i) {
#pragma unroll
        for (int j = 0; j < SK; ++j) {
          const int key = kv0 + tk + TK * j;
          const bool visible = key <= limit[i] && (a.window == 0 || key > limit[i] - a.window);
          p_tile[(tq + TQ * i) * PLD + tk + TK * j] = visible ? s[i][j] * a.scale : -INFINITY;
        }
      }
      __syncthreads();

      // V replaces K in shared memory while the statistics are computed.
      load_kv_tile<Rows, D, BK, LD4>(kv_tile, v_rows, tile_row, kv0, kv_end, a);
      {
        const int r = tid / kRowThreads;
        float* pr = p_tile + r * PLD + (tid % kRowThreads) * kRowEntries;
        if constexpr (kCap) {
#pragma unroll
          for (int e = 0; e < kRowEntries; ++e) {
            if (pr[e] != -INFINITY) pr[e] = a.softcap * tanhf(pr[e] / a.softcap);
          }
        }
        float mx = -INFINITY;
#pragma unroll
        for (int e = 0; e < kRowEntries; ++e) mx = fmaxf(mx, pr[e]);
        mx = group_max(mx, kRowThreads);
        const float m_old = row_m[r];
        const float m_new = fmaxf(m_old, mx);
        float sum = 0.0f;
        if (m_new == -INFINITY) {  // nothing visible to this row yet
#pragma unroll
          for (int e = 0; e < kRowEntries; ++e) pr[e] = 0.0f;
        } else {
#pragma unroll
          for (int e = 0; e < kRowEntries; ++e) {
            const float p = expf(pr[e] - m_new);
            pr[e] = p;
            sum += p;
          }
        }
        sum = group_sum(sum, kRowThreads);
        __syncwarp();  // the row's threads have read row_m[r] before it changes (as in the decode kernel)
        if (tid % kRowThreads == 0) {
          const float corr = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
          row_corr[r] = corr;
          row_l[r] = row_l[r] * corr + sum;
          row_m[r] = m_new;
        }
      }
      __syncthreads();

#pragma unroll
      for (int i = 0; i < SQ; ++i) {
        const float corr = row_corr[tq + TQ * i];
#pragma unroll
        for (int j = 0; j < OD4; ++j) {
          acc[i][j].x *= corr;
          acc[i][j].y *= corr;
          acc[i][j].z *= corr;
          acc[i][j].w *= corr;
        }
      }
#pragma unroll 2
      for (int k4 = 0; k4 < BK / 4; ++k4) {
        float4 pv[SQ];
#pragma unroll
        for (int i = 0; i < SQ; ++i) pv[i] = p_tile4[((tq + TQ * i) * PLD) / 4 + k4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          float4 vv[OD4];
#pragma unroll
          for (int j = 0; j < OD4; ++j) vv[j] = kv_tile[(4 * k4 + kk) * LD4 + tk + TK * j];
#pragma unroll
          for (int i = 0; i < SQ; ++i) {
            const float p = component(pv[i], kk);
#pragma unroll
            for (int j = 0; j < OD4; ++j) acc[i][j] = fma4(p, vv[j], acc[i][j]);
          }
        }
      }
      __syncthreads();
    }
  }

#pragma unroll
  for (int i = 0; i < SQ; ++i) {
    const int r = tq + TQ * i;
    const int t = q0 + r;
    if (t >= a.n_tokens) continue;
    const bool ok = row_pos[r] >= 0;
    const float l = row_l[r];
    float* dst = a.out + static_cast<int64_t>(t) * q_dim + static_cast<int64_t>(head) * a.head_dim;
#pragma unroll
    for (int j = 0; j < OD4; ++j) {
      const int d = 4 * (tk + TK * j);
      if (d >= a.head_dim) continue;
      const float4 v = acc[i][j];
      *reinterpret_cast<float4*>(dst + d) =
          ok ? make_float4(v.x / l, v.y / l, v.z / l, v.w / l)
             : make_float4(quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan());
    }
  }
}

// ---------------------------------------------------------------------------
// Host side

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}



template <class Rows, int C, int HB>
void launch_decode(const DecodeArgs& a, int n_tokens, cudaStream_t stream) {
  const int head_groups = (a.n_head / a.gqa) * a.groups_per_kv;  // KV heads x blocks per KV head
  const dim3 grid(static_cast<unsigned>(a.n_splits * head_groups), static_cast<unsigned>(n_tokens));
  if (a.softcap > 0.0f) {
    attention_decode_kernel<Rows, C, HB, true><<<grid, kDecodeThreads, 0, stream>>>(a);
  } else {
    attention_decode_kernel<Rows, C, HB, false><<<grid, kDecodeThreads, 0, stream>>>(a);
  }
  M40_CUDA_CHECK_LAUNCH();
}

template <class Rows, int C>
void launch_decode_for_heads(const DecodeArgs& a, int heads_per_block, int n_tokens, cudaStream_t stream) {
  switch (heads_per_block) {
    case 1: launch_decode<Rows, C, 1>(a, n_tokens, stream); return;
    case 2: launch_decode<Rows, C, 2>(a, n_tokens, stream); return;
    default: launch_decode<Rows, C, 4>(a, n_tokens, stream); return;
  }
}

void run_decode(const KvLayer& cache, const AttentionShape& shape, float scale, const float* q,
                const int32_t* seq_ids, const int32_t* positions, int n_tokens, int max_positions, float* out,
                cudaStream_t stream, int forced_splits) {
  // The keys a token sees: its whole context, or at most the window.
  const int span = shape.window > 0 ? std::min(max_positions, shape.window) : max_positions;
  if (n_tokens > 65535) {
    throw Error("attention: the decode kernel takes at most 65535 tokens, got " + std::to_string(n_tokens));
  }
  const int gqa = shape.n_head / shape.n_head_kv;
  const int heads_per_block = gqa == 1 ? 1 : gqa == 2 ? 2 : 4;
  const bool q8 = cache.type == KvFormat::Q8_0;
  const bool rows_of_8 = shape.head_dim % 8 == 0 && (q8 || (aligned(cache.k, 16) && aligned(cache.v, 16)));
  const int piece = rows_of_8 ? 8 : 4;
  const int lanes = next_pow2(ceil_div(shape.head_dim, piece));
  if (lanes > kWarpSize) {
    throw Error("attention: head_dim " + std::to_string(shape.head_dim) +
                " needs 16-byte aligned K/V rows (a multiple of 8) beyond 128");
  }

  DecodeArgs a{};
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
  a.gqa = gqa;
  a.groups_per_kv = ceil_div(gqa, heads_per_block);
  a.lanes_per_key = lanes;
  a.scale = scale;
  a.softcap = shape.softcap;
  a.window = shape.window;

  // Parts: enough blocks to fill the GPU (about 8 per multiprocessor: a
  // block keeps only 8 KB of loads in flight, so a single sequence with few
  // KV heads needs its context cut fine), each part a multiple of 64
  // positions, at most kMaxSplits parts.
  const int blocks_per_part = n_tokens * shape.n_head_kv * a.groups_per_kv;
  int splits = 1;
  int per_split = span;
  if (forced_splits > 0) {
    splits = std::min({forced_splits, detail::kMaxSplits, span});
    per_split = ceil_div(span, splits);
  } else {
    const int wanted = ceil_div(int64_t{8} * current_multiprocessor_count(), blocks_per_part);
    const int granules = ceil_div(span, kSplitGranule);
    splits = std::max(1, std::min({wanted, granules, detail::kMaxSplits}));
    per_split = ceil_div(ceil_div(span, splits), kSplitGranule) * kSplitGranule;
  }
  splits = ceil_div(span, per_split);
  if (!scratch_pool_ready(stream)) {
    splits = 1;
    per_split = span;
  }
  a.n_splits = splits;
  a.positions_per_split = per_split;
  a.split_granule = forced_splits > 0 ? 1 : kSplitGranule;

  const auto launch = [&] {
    if (q8) {
      if (rows_of_8) {
        launch_decode_for_heads<Q8Rows, 8>(a, heads_per_block, n_tokens, stream);
      } else {
        launch_decode_for_heads<Q8Rows, 4>(a, heads_per_block, n_tokens, stream);
      }
    } else if (rows_of_8) {
      launch_decode_for_heads<F16Rows, 8>(a, heads_per_block, n_tokens, stream);
    } else {
      launch_decode_for_heads<F16Rows, 4>(a, heads_per_block, n_tokens, stream);
    }
  };
  if (splits == 1) {
    launch();
    return;
  }
  const size_t items = static_cast<size_t>(n_tokens) * shape.n_head * splits;
  StreamScratch scratch(items * (static_cast<size_t>(shape.head_dim) + 2) * sizeof(float), stream);
  a.part_acc = scratch.floats();
  a.part_ml = scratch.floats() + items * shape.head_dim;
  launch();
  attention_combine_kernel<<<dim3(static_cast<unsigned>(shape.n_head), static_cast<unsigned>(n_tokens)),
                             kCombineThreads, 0, stream>>>(a);
  M40_CUDA_CHECK_LAUNCH();
}

template <class Rows, int D, int BQ, int BK>
void launch_prefill(const PrefillArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n_tokens, BQ)), static_cast<unsigned>(a.n_head));
  if (a.softcap > 0.0f) {
    attention_prefill_kernel<Rows, D, BQ, BK, true><<<grid, kPrefillThreads, 0, stream>>>(a);
  } else {
    attention_prefill_kernel<Rows, D, BQ, BK, false><<<grid, kPrefillThreads, 0, stream>>>(a);
  }
  M40_CUDA_CHECK_LAUNCH();
}

template <class Rows>
void launch_prefill_for_head_dim(const PrefillArgs& a, cudaStream_t stream) {
  if (a.head_dim <= 64) {
    launch_prefill<Rows, 64, 32, 32>(a, stream);
  } else if (a.head_dim <= 128) {
    launch_prefill<Rows, 128, 32, 32>(a, stream);
  } else {
    launch_prefill<Rows, 256, 16, 16>(a, stream);
  }
}

void run_prefill(const KvLayer& cache, const AttentionShape& shape, float scale, const float* q,
                 const int32_t* seq_ids, const int32_t* positions, int n_tokens, float* out, cudaStream_t stream) {
  PrefillArgs a{};
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
  a.n_tokens = n_tokens;
  const bool q8 = cache.type == KvFormat::Q8_0;
  a.rows_of_8 = shape.head_dim % 8 == 0 && (q8 || (aligned(cache.k, 16) && aligned(cache.v, 16)));
  a.scale = scale;
  a.softcap = shape.softcap;
  a.window = shape.window;
  if (q8) {
    launch_prefill_for_head_dim<Q8Rows>(a, stream);
  } else {
    launch_prefill_for_head_dim<F16Rows>(a, stream);
  }
}

}  // namespace

namespace detail {

void attention_with_plan(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
                         const int32_t* positions, int n_tokens, int max_positions, float* out,
                         cudaStream_t stream, const AttentionPlan& plan) {
  if (shape.n_head <= 0 || shape.n_head_kv <= 0 || shape.n_head % shape.n_head_kv != 0) {
    throw Error("attention: " + std::to_string(shape.n_head) + " query heads do not divide into " +
                std::to_string(shape.n_head_kv) + " KV heads");
  }
  if (!attention_head_dim_supported(shape.head_dim)) {
    throw Error("attention: head_dim must be a multiple of 4 up to 128, or of 8 up to " +
                std::to_string(kMaxHeadDim) + ", got " + std::to_string(shape.head_dim));
  }
  if (!(shape.softcap >= 0.0f) || shape.window < 0) {
    throw Error("attention: the soft-cap and the window must not be negative (got " + std::to_string(shape.softcap) +
                " and " + std::to_string(shape.window) + ")");
  }
  if (cache.kv_dim != shape.n_head_kv * shape.head_dim || cache.n_ctx <= 0) {
    throw Error("attention: the cache's kv_dim " + std::to_string(cache.kv_dim) + " is not " +
                std::to_string(shape.n_head_kv) + " KV heads x " + std::to_string(shape.head_dim));
  }
  if (cache.block_tables == nullptr || cache.max_blocks < backend::kv_blocks_for(cache.n_ctx)) {
    throw Error("attention: the cache needs block tables of at least " +
                std::to_string(backend::kv_blocks_for(cache.n_ctx)) + " entries per sequence (got " +
                std::to_string(cache.max_blocks) + ")");
  }
  if (cache.type == KvFormat::Q8_0 && cache.kv_dim % 32 != 0) {
    throw Error("attention: a Q8_0 cache needs kv_dim to be a multiple of 32, got " + std::to_string(cache.kv_dim));
  }
  if (!aligned(q, 16) || !aligned(out, 16) || !aligned(cache.k, 8) || !aligned(cache.v, 8)) {
    throw Error("attention: q and out must be 16-byte aligned, the K/V cache 8-byte aligned");
  }
  if (n_tokens < 0) throw Error("attention: negative token count " + std::to_string(n_tokens));
  if (n_tokens == 0) return;
  if (max_positions <= 0) throw Error("attention: max_positions must be at least 1");
  max_positions = std::min(max_positions, cache.n_ctx);
  const float scale = shape.scale != 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));

  AttentionKernel kernel = plan.kernel;
  if (kernel == AttentionKernel::Auto) {
    kernel = n_tokens <= kDecodeMaxTokens ? AttentionKernel::Decode : AttentionKernel::Prefill;
  }
  if (kernel == AttentionKernel::Decode) {
    run_decode(cache, shape, scale, q, seq_ids, positions, n_tokens, max_positions, out, stream, plan.splits);
  } else {
    run_prefill(cache, shape, scale, q, seq_ids, positions, n_tokens, out, stream);
  }
}

}  // namespace detail

bool attention_head_dim_supported(int head_dim) {
  return head_dim > 0 && head_dim <= kMaxHeadDim && head_dim % (head_dim > 128 ? 8 : 4) == 0;
}

void attention(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream) {
  detail::attention_with_plan(cache, shape, q, seq_ids, positions, n_tokens, max_positions, out, stream, {});
}

void attention_decode(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
                      const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream) {
  detail::attention_with_plan(cache, shape, q, seq_ids, positions, n_tokens, max_positions, out, stream,
                              {detail::AttentionKernel::Decode, 0});
}

}  // namespace m40::cuda

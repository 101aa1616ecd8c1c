// The attention decode kernel (attention.cu has the whole design and the
// checks; attention_internal.cuh the K/V reads shared with the prefill kernel).
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
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/attention_internal.cuh"
#include "backends/cuda/attention_variants.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/cuda/pointer_alignment.h"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/warp_reduce.cuh"
#include "backends/kv_blocks.h"
#include "common/error.h"
#include "quant/blocks.h"

namespace m40::cuda::attn {

namespace {

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

}  // namespace

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
  const bool rows_of_8 = kv_rows_of_8(cache, shape.head_dim);
  const int piece = rows_of_8 ? 8 : 4;
  const int lanes = next_pow2(ceil_div(shape.head_dim, piece));
  if (lanes > kWarpSize) {
    throw Error("attention: head_dim " + std::to_string(shape.head_dim) +
                " needs 16-byte aligned K/V rows (a multiple of 8) beyond 128");
  }

  DecodeArgs a{};
  fill_common_args(a, cache, shape, scale, q, seq_ids, positions, out);
  a.groups_per_kv = ceil_div(gqa, heads_per_block);
  a.lanes_per_key = lanes;

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

}  // namespace m40::cuda::attn

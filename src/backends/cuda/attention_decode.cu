// The attention decode kernel (attention.cu has the whole design and the
// checks; attention_internal.cuh the K/V reads shared with the prefill kernel).
//
// Decode (few tokens, any layout): one block of 4 warps per (token, KV head,
// context part). The block holds up to 4 query heads of that KV head (GQA),
// so each K/V row is read from memory once for all of them. Lanes split a
// key row into 16-byte pieces (8 halves; 4 for head dims that are not a
// multiple of 8): head_dim 128 takes 16 lanes, so a warp reads two whole
// 256-byte rows per load instruction, coalesced. Each warp walks its own
// keys with its own online softmax, loading the next keys before this
// step's math; the warps are merged at the end. A long context is split
// into parts (flash-decoding): each part writes its unnormalized output and
// its (max, sum) to scratch, and a combine kernel merges them, so one
// sequence still fills the GPU. A windowed layer's parts split the window
// only, starting at its first key.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

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
// Keys a lane slot takes per iteration (K and V of as many more in flight):
// 4 for blocks of one query head, whose registers allow it, else 2.
template <int HB>
constexpr int kKeysPerSlot = HB == 1 ? 4 : 2;

struct DecodeArgs {
  const void* k;  // FP16 bits or quant::BlockQ8_0 blocks (the kernel's Rows)
  const void* v;
  const float* q;
  const int32_t* seq_ids;
  const int32_t* positions;
  float* out;                   // written directly when n_splits == 1
  float* part_acc;              // [n_tokens][n_head][n_splits][head_dim] unnormalized outputs
  float* part_ml;               // [n_tokens][n_head][n_splits][2] running max and sum
  const int32_t* block_tables;  // [n_seq][max_blocks]
  int max_blocks;
  int n_ctx;
  int kv_dim;
  int head_dim;
  int n_head;
  int gqa;            // query heads per KV head
  int groups_per_kv;  // blocks per KV head: ceil(gqa / HB)
  int lanes_per_key;  // power of two >= head_dim / C, at most 32
  int n_splits;
  int positions_per_split;  // the most a part covers (the launch's longest span,
                            // cut in n_splits)
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

constexpr float kLog2e = 1.4426950408889634f;

// 2^x with the hardware's approximation (relative error about 2^-22;
// 2^-inf = 0), as the scores are already in base-2 units.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The HB query heads' dot products over the L lanes of one key (L >= HB,
// both powers of two), summed by transposing instead of HB separate
// reductions: each halving step keeps half of the heads and sends the other
// half to the partner lane, so after log2(HB) steps every lane holds one
// head's sum (its own head) and the remaining steps are plain sums. HB = 4
// and L = 16: 5 shuffles a key instead of 16. The lanes of a key then trade
// the own head's values (from_head) where every head's is needed.
template <int HB>
struct HeadLanes {
  int own;        // the head whose sums this lane holds after reduce()
  int first;      // the key's first lane
  int high, low;  // lane offsets of the two transposing steps (L/2, L/4)
  int L;

  __device__ __forceinline__ HeadLanes(int lane, int lanes_per_key)
      : first(lane & ~(lanes_per_key - 1)), high(lanes_per_key >> 1), low(lanes_per_key >> 2), L(lanes_per_key) {
    if constexpr (HB == 4) {
      own = ((lane & high) != 0 ? 2 : 0) + ((lane & low) != 0 ? 1 : 0);
    } else if constexpr (HB == 2) {
      own = (lane & high) != 0 ? 1 : 0;
    } else {
      own = 0;
    }
  }

  __device__ __forceinline__ float reduce(const float (&dot)[HB]) const {
    const unsigned lane = threadIdx.x % kWarpSize;
    if constexpr (HB == 4) {
      const bool up = (lane & high) != 0;
      float a = up ? dot[2] : dot[0], b = up ? dot[3] : dot[1];
      a += __shfl_xor_sync(kFullWarpMask, up ? dot[0] : dot[2], high);
      b += __shfl_xor_sync(kFullWarpMask, up ? dot[1] : dot[3], high);
      const bool up2 = (lane & low) != 0;
      float sum = (up2 ? b : a) + __shfl_xor_sync(kFullWarpMask, up2 ? a : b, low);
#pragma unroll
      for (int offset = low >> 1; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullWarpMask, sum, offset);
      return sum;
    } else if constexpr (HB == 2) {
      const bool up = (lane & high) != 0;
      float sum = (up ? dot[1] : dot[0]) + __shfl_xor_sync(kFullWarpMask, up ? dot[0] : dot[1], high);
#pragma unroll
      for (int offset = high >> 1; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullWarpMask, sum, offset);
      return sum;
    } else {
      return group_sum(dot[0], L);
    }
  }

  // Head h's value of `own_value` (from a lane of this key holding head h).
  __device__ __forceinline__ float from_head(float own_value, int h) const {
    if constexpr (HB == 1) return own_value;
    const int src = first + ((h & (HB / 2)) != 0 ? high : 0) + (HB == 4 && (h & 1) != 0 ? low : 0);
    return __shfl_sync(kFullWarpMask, own_value, src);
  }

  // Whether this lane is the first of its key's lanes holding its head.
  __device__ __forceinline__ bool first_of_head() const {
    return ((threadIdx.x % kWarpSize) & (L / HB - 1)) == 0;
  }
};

// Rows: the cache type (F16Rows, Q8Rows); C: values per lane load (8 or 4);
// HB: query heads per block (1, 2 or 4); kCap: soft-capped scores; kLanes:
// lanes per key when known at compile time (16: head dims 72..128 in pieces
// of 8, the common case), else 0 and a.lanes_per_key (the shuffle loops
// then run with run-time bounds and divergence checks). Grid: x = split +
// n_splits * (head group), y = token.
//
// Each warp walks its own keys of the part with its own online softmax, so
// the loop has no block-wide barrier: a lane slot (L lanes, one key) takes
// kKeysPerSlot keys an iteration, and the next iteration's K and V rows are
// loaded before this one's math, so every warp keeps its loads in flight.
// Scores live in base-2 units (score * log2 e), the softmax in exp2f. The
// warps' (max, sum, output) are merged once at the end. At most 128
// registers (4 blocks per multiprocessor): the 4-head variant takes 139 on
// sm_90 uncapped, and 3 blocks; no spills at the cap.
template <class Rows, int C, int HB, bool kCap, int kLanes>
__global__ void __launch_bounds__(kDecodeThreads, 4) attention_decode_kernel(DecodeArgs a) {
  constexpr int U = kKeysPerSlot<HB>;
  using Vec = typename Rows::template Vec<C>;
  __shared__ float s_acc[kDecodeWarps][HB][kMaxHeadDim];
  __shared__ float s_m[kDecodeWarps][HB], s_l[kDecodeWarps][HB];

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
  const int L = kLanes > 0 ? kLanes : a.lanes_per_key;
  const int sub = lane & (L - 1);  // which piece of the row
  const int slot = lane / L;       // which key of the warp's step
  const int slots = kWarpSize / L;
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
  // Lanes past head_dim read the head's first piece (their q is zero and
  // their sums are not stored), so that every lane loads without a branch.
  const int64_t head_offset = static_cast<int64_t>(kvh) * a.head_dim + (has_dims ? d0 : 0);
  const typename Rows::Piece k_piece = Rows::piece(a.k, head_offset, a.kv_dim);
  const typename Rows::Piece v_piece = Rows::piece(a.v, head_offset, a.kv_dim);

  // The warp's keys: iteration base j0 covers j0 + u * slots + slot, u < U;
  // the warps interleave by iteration.
  const int per_iteration = slots * U;
  const int stride = kDecodeWarps * per_iteration;
  // Pool rows in 32-bit unsigned math (positions and block ids are not
  // negative); the table is read through the read-only cache, where a
  // warp's keys share their block's entry. A key past the part's end reads
  // the last key's row again (its score is -inf, its weight 0).
  const auto fetch = [&](int j0, Vec (&k_vec)[U], Vec (&v_vec)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = min(j0 + u * slots + slot, end - 1);
      const uint32_t row = backend::kv_row_in_block(__ldg(table + backend::kv_block_index(j)), j);
      k_vec[u].load(k_piece, row);
      v_vec[u].load(v_piece, row);
    }
  };

  // Softmax statistics of the lane's own head (HeadLanes): its running max
  // in base-2 units (the same on every lane of that head in the warp) and
  // its slot's running sum.
  float m_own = -INFINITY, l_own = 0.0f;
  float acc[HB][C];
#pragma unroll
  for (int h = 0; h < HB; ++h) {
#pragma unroll
    for (int c = 0; c < C; ++c) acc[h][c] = 0.0f;
  }
  const HeadLanes<HB> heads(lane, L);
  // Scores times this are in base-2 units (the cap needs them unscaled).
  const float score_scale = kCap ? a.scale : a.scale * kLog2e;

  // One iteration's math on the keys j0 + u * slots + slot held in k_cur
  // and v_cur.
  const auto attend = [&](int j0, const Vec (&k_cur)[U], const Vec (&v_cur)[U]) {
    float s[U];  // the own head's scores
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[C];
      k_cur[u].widen(kf);
      float dot[HB];
#pragma unroll
      for (int h = 0; h < HB; ++h) {
        dot[h] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) dot[h] = fmaf(qr[h][c], kf[c], dot[h]);
      }
      float score = heads.reduce(dot) * score_scale;
      if constexpr (kCap) score = a.softcap * tanhf(score / a.softcap) * kLog2e;
      s[u] = j0 + u * slots + slot < end ? score : -INFINITY;
    }
    // The running max moves to this iteration's largest score (finite: key
    // j0 is always valid); what was summed so far is rescaled by
    // 2^(old - new), only when some head's max grew.
    float mx = s[0];
#pragma unroll
    for (int u = 1; u < U; ++u) mx = fmaxf(mx, s[u]);
#pragma unroll
    for (int offset = L; offset < kWarpSize; offset *= 2) {
      mx = fmaxf(mx, __shfl_xor_sync(kFullWarpMask, mx, offset));
    }
    const float m_new = fmaxf(m_own, mx);
    if (__any_sync(kFullWarpMask, m_new > m_own)) {
      const float corr_own = fast_exp2(m_own - m_new);  // 0 on the first iteration
      l_own *= corr_own;
#pragma unroll
      for (int h = 0; h < HB; ++h) {
        const float corr = heads.from_head(corr_own, h);
#pragma unroll
        for (int c = 0; c < C; ++c) acc[h][c] *= corr;
      }
    }
    m_own = m_new;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float p_own = fast_exp2(s[u] - m_own);
      l_own += p_own;
      float vf[C];
      v_cur[u].widen(vf);
#pragma unroll
      for (int h = 0; h < HB; ++h) {
        const float p = heads.from_head(p_own, h);
#pragma unroll
        for (int c = 0; c < C; ++c) acc[h][c] = fmaf(p, vf[c], acc[h][c]);
      }
    }
  };

  // The next iteration's keys are in flight while this one's are attended.
  // (Two register sets used in turn, without the copies at the end of the
  // loop, took more registers: spills at the 128 cap.) j0 is uniform over
  // the warp: the shuffles inside need all 32 lanes.
  Vec k_cur[U], v_cur[U];
  int j0 = begin + warp * per_iteration;
  if (j0 < end) fetch(j0, k_cur, v_cur);
  for (; j0 < end; j0 += stride) {
    Vec k_next[U], v_next[U];
    if (j0 + stride < end) fetch(j0 + stride, k_next, v_next);
    attend(j0, k_cur, v_cur);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      k_cur[u] = k_next[u];
      v_cur[u] = v_next[u];
    }
  }

  // The slots of a warp share its maxima: their sums and outputs just add.
#pragma unroll
  for (int offset = L; offset < kWarpSize; offset *= 2) {
    l_own += __shfl_xor_sync(kFullWarpMask, l_own, offset);
#pragma unroll
    for (int h = 0; h < HB; ++h) {
#pragma unroll
      for (int c = 0; c < C; ++c) acc[h][c] += __shfl_xor_sync(kFullWarpMask, acc[h][c], offset);
    }
  }
  if (slot == 0 && has_dims) {
#pragma unroll
    for (int h = 0; h < HB; ++h) {
#pragma unroll
      for (int c = 0; c < C; ++c) s_acc[warp][h][d0 + c] = acc[h][c];
    }
  }
  if (slot == 0 && heads.first_of_head()) {
    s_m[warp][heads.own] = m_own;  // -inf for a warp without keys: its weight is 0
    s_l[warp][heads.own] = l_own;
  }
  __syncthreads();

  // Merge the warps: weights 2^(m_w - max m).
  for (int i = static_cast<int>(threadIdx.x); i < nh * a.head_dim; i += kDecodeThreads) {
    const int h = i / a.head_dim;
    const int d = i % a.head_dim;
    float mx = s_m[0][h];
#pragma unroll
    for (int w = 1; w < kDecodeWarps; ++w) mx = fmaxf(mx, s_m[w][h]);
    float total = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float weight = exp2f(s_m[w][h] - mx);
      total = fmaf(weight, s_acc[w][h][d], total);
      sum = fmaf(weight, s_l[w][h], sum);
    }
    const int64_t head = h0 + h;
    if (direct) {
      a.out[static_cast<int64_t>(t) * q_dim + head * a.head_dim + d] = total / sum;
    } else {
      a.part_acc[((static_cast<int64_t>(t) * a.n_head + head) * a.n_splits + split) * a.head_dim + d] = total;
      if (d == 0) {
        float* ml = a.part_ml + ((static_cast<int64_t>(t) * a.n_head + head) * a.n_splits + split) * 2;
        ml[0] = mx;
        ml[1] = sum;
      }
    }
  }
}

constexpr int kCombineThreads = 128;
constexpr int kCombineBatch = 16;  // parts whose loads a thread issues before adding them

// Merges the parts of one (token, query head): out = sum_s w_s acc_s /
// sum_s w_s l_s with w_s = 2^(m_s - max m) (the maxima are base-2 scores).
// Grid: x = head, y = token. A thread takes one group of four dimensions
// of every G-th part (G = the threads over head_dim / 4: 4 for head_dim
// 128) and issues kCombineBatch parts' loads before it adds them, so a
// split of 64 parts costs one round trip to the L2, not one per part; the
// G sums meet in shared memory in group order (the same result every run).
__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(DecodeArgs a) {
  __shared__ float weight[detail::kMaxSplits];
  __shared__ float total;
  __shared__ float4 group_sums[kCombineThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int head = static_cast<int>(blockIdx.x);
  const int t = static_cast<int>(blockIdx.y);
  const int64_t item = static_cast<int64_t>(t) * a.n_head + head;
  float* out = a.out + item * a.head_dim;  // q_dim = n_head * head_dim
  const int pos = __ldg(a.positions + t);
  const int seq = __ldg(a.seq_ids + t);
  if (pos < 0 || pos >= a.n_ctx || seq < 0) {
    for (int d = tid; d < a.head_dim; d += kCombineThreads) out[d] = quiet_nan();
    return;
  }
  const int n_pos = pos + 1;
  const int first = a.window > 0 ? max(0, n_pos - a.window) : 0;  // as the decode kernel
  const int per_part = part_length(n_pos - first, a);             // as the decode kernel
  const int n_valid = min(a.n_splits, (n_pos - first + per_part - 1) / per_part);
  const float* ml = a.part_ml + item * a.n_splits * 2;
  if (tid < kWarpSize) {
    float m = -INFINITY;
    for (int s = tid; s < n_valid; s += kWarpSize) m = fmaxf(m, ml[2 * s]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int s = tid; s < n_valid; s += kWarpSize) {
      const float w = exp2f(ml[2 * s] - m);
      weight[s] = w;
      sum += w * ml[2 * s + 1];
    }
    sum = warp_sum(sum);
    if (tid == 0) total = sum;
  }

  // head_dim is a multiple of 4 and at most 256: quads <= 64, groups >= 2.
  const int quads = a.head_dim / 4;
  const int groups = kCombineThreads / quads;
  const int quad = tid % quads;
  const int group = tid / quads;
  const float4* acc = reinterpret_cast<const float4*>(a.part_acc + item * a.n_splits * a.head_dim);
  float4 v[kCombineBatch];
  // The loads of parts s0, s0 + groups, ... (kCombineBatch of them; zeros
  // past the valid ones).
  const auto load_batch = [&](int s0) {
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {
      const int s = s0 + i * groups;
      v[i] = s < n_valid ? acc[static_cast<int64_t>(s) * quads + quad] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  if (group < groups) load_batch(group);
  __syncthreads();  // the weights
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (group < groups) {
    for (int s0 = group;; s0 += groups * kCombineBatch) {
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        const int s = s0 + i * groups;
        if (s < n_valid) {
          const float w = weight[s];
          sum.x = fmaf(w, v[i].x, sum.x);
          sum.y = fmaf(w, v[i].y, sum.y);
          sum.z = fmaf(w, v[i].z, sum.z);
          sum.w = fmaf(w, v[i].w, sum.w);
        }
      }
      const int next = s0 + groups * kCombineBatch;
      if (next >= n_valid) break;
      load_batch(next);
    }
  }
  group_sums[tid] = sum;
  __syncthreads();
  if (tid < quads) {
    float4 r = group_sums[tid];
    for (int g = 1; g < groups; ++g) {
      const float4 part = group_sums[g * quads + tid];
      r.x += part.x;
      r.y += part.y;
      r.z += part.z;
      r.w += part.w;
    }
    reinterpret_cast<float4*>(out)[tid] = make_float4(r.x / total, r.y / total, r.z / total, r.w / total);
  }
}

template <class Rows, int C, int HB, int kLanes>
void launch_decode(const DecodeArgs& a, int n_tokens, cudaStream_t stream) {
  const int head_groups = (a.n_head / a.gqa) * a.groups_per_kv;  // KV heads x blocks per KV head
  const dim3 grid(static_cast<unsigned>(a.n_splits * head_groups), static_cast<unsigned>(n_tokens));
  if (a.softcap > 0.0f) {
    attention_decode_kernel<Rows, C, HB, true, kLanes><<<grid, kDecodeThreads, 0, stream>>>(a);
  } else {
    attention_decode_kernel<Rows, C, HB, false, kLanes><<<grid, kDecodeThreads, 0, stream>>>(a);
  }
  M40_CUDA_CHECK_LAUNCH();
}

// Decode blocks of one variant that run at once on the current device (its
// occupancy times the multiprocessors), asked once per device.
template <class Rows, int C, int HB, int kLanes>
int resident_blocks() {
  static std::atomic<int> known[64];
  return once_per_device(known, [](int) {
    int per_sm = 0;
    M40_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, attention_decode_kernel<Rows, C, HB, false, kLanes>, kDecodeThreads, 0));
    return std::max(1, per_sm) * current_multiprocessor_count();
  });
}

// A decode kernel variant: the cache's Rows, values per lane load, query
// heads per block, lanes per key (0: known at run time only).
template <class Rows_, int C_, int HB_, int Lanes_>
struct Variant {
  using Rows = Rows_;
  static constexpr int C = C_;
  static constexpr int HB = HB_;
  static constexpr int Lanes = Lanes_;
};

template <class Rows_, int C_, int Lanes_>
struct RowPieces {
  using Rows = Rows_;
  static constexpr int C = C_;
  static constexpr int Lanes = Lanes_;
};

// The lanes per key compiled in: 16 (head dims 72 to 128 in pieces of 8:
// Llama, Mistral, Qwen, Phi-3), else 0.
constexpr int kCompiledLanes = 16;

// Calls visit(Variant<...>{}) with the variant of a Q8_0 or FP16 cache read
// in pieces of 8 or 4 values by blocks of 1, 2 or 4 heads.
template <class Visit>
void visit_variant(bool q8, bool rows_of_8, int lanes, int heads_per_block, Visit&& visit) {
  const auto with_heads = [&](auto pieces) {
    using P = decltype(pieces);
    switch (heads_per_block) {
      case 1: return visit(Variant<typename P::Rows, P::C, 1, P::Lanes>{});
      case 2: return visit(Variant<typename P::Rows, P::C, 2, P::Lanes>{});
      default: return visit(Variant<typename P::Rows, P::C, 4, P::Lanes>{});
    }
  };
  const bool compiled_lanes = rows_of_8 && lanes == kCompiledLanes;
  if (q8) {
    if (compiled_lanes) return with_heads(RowPieces<Q8Rows, 8, kCompiledLanes>{});
    return rows_of_8 ? with_heads(RowPieces<Q8Rows, 8, 0>{}) : with_heads(RowPieces<Q8Rows, 4, 0>{});
  }
  if (compiled_lanes) return with_heads(RowPieces<F16Rows, 8, kCompiledLanes>{});
  return rows_of_8 ? with_heads(RowPieces<F16Rows, 8, 0>{}) : with_heads(RowPieces<F16Rows, 4, 0>{});
}

}  // namespace

void run_decode(const KvLayer& cache, const AttentionShape& shape, float scale, const float* q, const int32_t* seq_ids,
                const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream,
                int forced_splits, int forced_heads) {
  // The keys a token sees: its whole context, or at most the window.
  const int span = shape.window > 0 ? std::min(max_positions, shape.window) : max_positions;
  if (n_tokens > 65535) {
    throw Error("attention: the decode kernel takes at most 65535 tokens, got " + std::to_string(n_tokens));
  }
  const int gqa = shape.n_head / shape.n_head_kv;
  const bool q8 = cache.type == KvFormat::Q8_0;
  const bool rows_of_8 = kv_rows_of_8(cache, shape.head_dim);
  const int piece = rows_of_8 ? 8 : 4;
  const int lanes = next_pow2(ceil_div(shape.head_dim, piece));
  if (lanes > kWarpSize) {
    throw Error("attention: head_dim " + std::to_string(shape.head_dim) +
                " needs 16-byte aligned K/V rows (a multiple of 8) beyond 128");
  }
  // Query heads per block: the GQA group, up to 4 and up to the lanes of a
  // key (HeadLanes gives each of a key's lanes one head).
  const int wanted_heads = forced_heads > 0 ? forced_heads : gqa == 1 ? 1 : gqa == 2 ? 2 : 4;
  const int heads_per_block = std::min(wanted_heads >= 4 ? 4 : wanted_heads >= 2 ? 2 : 1, lanes);

  DecodeArgs a{};
  fill_common_args(a, cache, shape, scale, q, seq_ids, positions, out);
  a.groups_per_kv = ceil_div(gqa, heads_per_block);
  a.lanes_per_key = lanes;

  // Parts: one wave of blocks, as many as the GPU runs at once (each warp
  // keeps its own loads in flight, so a full wave of whole parts reads at
  // the card's pace and a second, partial wave would only add a tail); each
  // part a multiple of 64 positions, at most kMaxSplits parts.
  const int blocks_per_part = n_tokens * shape.n_head_kv * a.groups_per_kv;
  int resident = 0;
  visit_variant(q8, rows_of_8, lanes, heads_per_block, [&](auto v) {
    using V = decltype(v);
    resident = resident_blocks<typename V::Rows, V::C, V::HB, V::Lanes>();
  });
  int splits = 1;
  int per_split = span;
  if (forced_splits > 0) {
    splits = std::min({forced_splits, detail::kMaxSplits, span});
    per_split = ceil_div(span, splits);
  } else {
    const int wanted = resident / blocks_per_part;
    const int granules = ceil_div(span, kAttentionSplitGranule);
    splits = std::max(1, std::min({wanted, granules, detail::kMaxSplits}));
    per_split = ceil_div(ceil_div(span, splits), kAttentionSplitGranule) * kAttentionSplitGranule;
  }
  splits = ceil_div(span, per_split);
  if (!scratch_pool_ready(stream)) {
    splits = 1;
    per_split = span;
  }
  a.n_splits = splits;
  a.positions_per_split = per_split;
  a.split_granule = forced_splits > 0 ? 1 : kAttentionSplitGranule;

  const auto launch = [&] {
    visit_variant(q8, rows_of_8, lanes, heads_per_block, [&](auto v) {
      using V = decltype(v);
      launch_decode<typename V::Rows, V::C, V::HB, V::Lanes>(a, n_tokens, stream);
    });
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

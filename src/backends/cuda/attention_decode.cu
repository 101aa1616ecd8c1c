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
constexpr int kSplitGranule = 64;  // a context part is a multiple of this many positions
constexpr int kKeysPerSlot = 2;    // keys a lane slot takes per iteration (K and V of two more in flight)

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
      for (int offset = low >> 1; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullWarpMask, sum, offset);
      return sum;
    } else if constexpr (HB == 2) {
      const bool up = (lane & high) != 0;
      float sum = (up ? dot[1] : dot[0]) + __shfl_xor_sync(kFullWarpMask, up ? dot[0] : dot[1], high);
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
// HB: query heads per block (1, 2 or 4); kCap: soft-capped scores. Grid: x =
// split + n_splits * (head group), y = token.
//
// Each warp walks its own keys of the part with its own online softmax, so
// the loop has no block-wide barrier: a lane slot (L lanes, one key) takes
// kKeysPerSlot keys an iteration, and the next iteration's K and V rows are
// loaded before this one's math, so every warp keeps its loads in flight.
// Scores live in base-2 units (score * log2 e), the softmax in exp2f. The
// warps' (max, sum, output) are merged once at the end. At most 128
// registers (4 blocks per multiprocessor): the 4-head variant takes 139 on
// sm_90 uncapped, and 3 blocks; no spills at the cap.
template <class Rows, int C, int HB, bool kCap>
__global__ void __launch_bounds__(kDecodeThreads, 4) attention_decode_kernel(DecodeArgs a) {
  constexpr int U = kKeysPerSlot;
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
  const int L = a.lanes_per_key;
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
  const int64_t head_offset = static_cast<int64_t>(kvh) * a.head_dim + d0;
  const typename Rows::Head k_rows = Rows::head(a.k, head_offset);
  const typename Rows::Head v_rows = Rows::head(a.v, head_offset);

  // The warp's keys: iteration base j0 covers j0 + u * slots + slot, u < U;
  // the warps interleave by iteration.
  const int per_iteration = slots * U;
  const int stride = kDecodeWarps * per_iteration;
  const auto fetch = [&](int j0, Vec* k_vec, Vec* v_vec) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * slots + slot;
      if (has_dims && j < end) {
        const int64_t e = backend::kv_row(table, j) * a.kv_dim;
        k_vec[u].load(k_rows, e);
        v_vec[u].load(v_rows, e);
      } else {
        k_vec[u].zero();
        v_vec[u].zero();
      }
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
  Vec k_cur[U], v_cur[U];
  int j0 = begin + warp * per_iteration;
  if (j0 < end) fetch(j0, k_cur, v_cur);
  // j0 is uniform over the warp: the shuffles inside need all 32 lanes.
  for (; j0 < end; j0 += stride) {
    Vec k_next[U], v_next[U];
    if (j0 + stride < end) fetch(j0 + stride, k_next, v_next);

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
      float score = heads.reduce(dot) * a.scale;
      if constexpr (kCap) score = a.softcap * tanhf(score / a.softcap);
      s[u] = j0 + u * slots + slot < end ? score * kLog2e : -INFINITY;
    }
    // The running max moves to this iteration's largest score (finite: key
    // j0 is always valid); what was summed so far is rescaled by
    // 2^(old - new), only when some head's max grew.
    float mx = s[0];
#pragma unroll
    for (int u = 1; u < U; ++u) mx = fmaxf(mx, s[u]);
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
#pragma unroll
    for (int u = 0; u < U; ++u) {
      k_cur[u] = k_next[u];
      v_cur[u] = v_next[u];
    }
  }

  // The slots of a warp share its maxima: their sums and outputs just add.
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

// Merges the parts of one (token, query head): out = sum_s w_s acc_s /
// sum_s w_s l_s with w_s = 2^(m_s - max m) (the maxima are base-2 scores).
// Grid: x = head, y = token.
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
  const int per_part = part_length(n_pos - first, a);             // as the decode kernel
  const int n_valid = min(a.n_splits, (n_pos - first + per_part - 1) / per_part);
  const float* ml = a.part_ml + item * a.n_splits * 2;
  if (threadIdx.x < kWarpSize) {
    const int lane = static_cast<int>(threadIdx.x);
    float m = -INFINITY;
    for (int s = lane; s < n_valid; s += kWarpSize) m = fmaxf(m, ml[2 * s]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int s = lane; s < n_valid; s += kWarpSize) {
      const float w = exp2f(ml[2 * s] - m);
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

// Decode blocks of one variant that run at once on the current device (its
// occupancy times the multiprocessors), asked once per device.
template <class Rows, int C, int HB>
int resident_blocks() {
  static std::atomic<int> known[64];
  return once_per_device(known, [](int) {
    int per_sm = 0;
    M40_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, attention_decode_kernel<Rows, C, HB, false>, kDecodeThreads, 0));
    return std::max(1, per_sm) * current_multiprocessor_count();
  });
}

// A decode kernel variant: the cache's Rows, values per lane load, query
// heads per block.
template <class Rows_, int C_, int HB_>
struct Variant {
  using Rows = Rows_;
  static constexpr int C = C_;
  static constexpr int HB = HB_;
};

template <class Rows_, int C_>
struct RowPieces {
  using Rows = Rows_;
  static constexpr int C = C_;
};

// Calls visit(Variant<...>{}) with the variant of a Q8_0 or FP16 cache read
// in pieces of 8 or 4 values by blocks of 1, 2 or 4 heads.
template <class Visit>
void visit_variant(bool q8, bool rows_of_8, int heads_per_block, Visit&& visit) {
  const auto with_heads = [&](auto pieces) {
    using P = decltype(pieces);
    switch (heads_per_block) {
      case 1: return visit(Variant<typename P::Rows, P::C, 1>{});
      case 2: return visit(Variant<typename P::Rows, P::C, 2>{});
      default: return visit(Variant<typename P::Rows, P::C, 4>{});
    }
  };
  if (q8) return rows_of_8 ? with_heads(RowPieces<Q8Rows, 8>{}) : with_heads(RowPieces<Q8Rows, 4>{});
  return rows_of_8 ? with_heads(RowPieces<F16Rows, 8>{}) : with_heads(RowPieces<F16Rows, 4>{});
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
  visit_variant(q8, rows_of_8, heads_per_block, [&](auto v) {
    using V = decltype(v);
    resident = resident_blocks<typename V::Rows, V::C, V::HB>();
  });
  int splits = 1;
  int per_split = span;
  if (forced_splits > 0) {
    splits = std::min({forced_splits, detail::kMaxSplits, span});
    per_split = ceil_div(span, splits);
  } else {
    const int wanted = resident / blocks_per_part;
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
    visit_variant(q8, rows_of_8, heads_per_block, [&](auto v) {
      using V = decltype(v);
      launch_decode<typename V::Rows, V::C, V::HB>(a, n_tokens, stream);
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

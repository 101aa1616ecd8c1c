// The attention prefill kernel (attention.cu has the whole design and the
// checks; attention_internal.cuh the K/V reads shared with the decode kernel).
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

}  // namespace

void run_prefill(const KvLayer& cache, const AttentionShape& shape, float scale, const float* q,
                 const int32_t* seq_ids, const int32_t* positions, int n_tokens, float* out, cudaStream_t stream) {
  PrefillArgs a{};
  fill_common_args(a, cache, shape, scale, q, seq_ids, positions, out);
  a.n_tokens = n_tokens;
  a.rows_of_8 = kv_rows_of_8(cache, shape.head_dim);
  if (cache.type == KvFormat::Q8_0) {
    launch_prefill_for_head_dim<Q8Rows>(a, stream);
  } else {
    launch_prefill_for_head_dim<F16Rows>(a, stream);
  }
}

}  // namespace m40::cuda::attn

// Decode products of rows up to 4096 columns, streamed (Q4_K at one and two
// tokens, Q8_0, Q4_0 and IQ4_XS at one): a block's lanes each own one unit
// of every row (Q4_K's wide units of 32 values, matmul_decode_wide.cuh, or
// the 16 of Q8_0 and of Q4_0's and IQ4_XS's wide units), load that
// unit's x into registers once, and then walk a batch of 8 sums (8 rows of
// one token, 4 of two) after another (grid-stride over the product's
// batches, as many blocks as the GPU holds at once). Each batch's sums are
// reduced within the warp (transposing butterfly) and parked in shared
// memory; at the end the block adds its warps' parts in warp order (the
// same order every run) and stores them, plain, with the residual, into
// fused parts or gated (act(gate) * up: half a batch's rows are gate rows,
// half their up rows). Since each block holds all of x, it can also apply
// the layer's RMSNorm to x itself (FoldedNorm, matmul.h): the norm launch
// before the product goes, at the cost of one block-wide sum and one load
// of the norm weight a block.
//
// Why: the matvec kernel gives each block one batch of rows, so each block
// loads x again, and an H100's 4 blocks of 128 threads per SM run in
// lockstep waves (all load, then all compute, then the wave's tail). Kept
// resident, the blocks drift apart and one's loads overlap another's math.
// On an H100 (2026-11-28, CUDA 11.8 sm_90 code from the sm_52 PTX, in a
// graph, us, Q4_K, matvec kernel -> streamed): gate/up 22016x4096 gated
// 26.0 -> 22.1, 12288x4096 16.2 -> 14.1, 11008x4096 15.1 -> 12.9, 4096x4096
// 7.3 -> 6.8. The same blocks given one batch each (x in registers, no
// walk) gained nothing, and the 11008-column down product (344 lanes a
// block) nothing either, so wider rows keep the matvec kernel.
#include <algorithm>
#include <atomic>
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/matmul_internal.cuh"
#include "backends/cuda/rms_scale.cuh"
#include "backends/cuda/warp_reduce.cuh"

namespace m40::cuda::mm {

namespace {

// Rows of up to 4096 columns, one lane per unit: 128 lanes of Q4_K's wide
// units (32 values), 256 of the others' (16).
constexpr int kMaxStreamedCols = 4096;
template <class Dec>
__host__ __device__ constexpr int streamed_threads() {
  return kMaxStreamedCols / Dec::kUnit;
}
// Sums a lane keeps per batch: 8 rows of one token or 4 rows of two; a
// power of two (the butterfly).
constexpr int kStreamSums = 8;
// Q4_K, one token: 5 blocks of 128 threads per SM, a cap of 102 registers,
// which CUDA 11.8 meets without spills for sm_52 (95) and sm_90 (93). (4
// blocks: equal on the large products, 0.2 us faster on 4096x4096; batches
// of 4 and of 16 rows, or loading the next batch before computing this one
// (double the raw registers, 3 blocks per SM), were slower on an H100.) Two
// tokens hold twice the x: 4 blocks, 128 registers. Q8_0, Q4_0 and IQ4_XS
// (256 threads, a 16-value unit's x; one token, launch_streamed_with): 3
// blocks (85 registers; 80 used).
template <class Dec>
__host__ __device__ constexpr int streamed_blocks_per_sm_cap(int tokens) {
  if constexpr (streamed_threads<Dec>() == 128) return tokens == 1 ? 5 : 4;
  return 3;  // one token only
}
// Shared memory for the parked sums past which a product keeps the matvec
// kernel (a vocabulary-sized Q4_K output head on a GPU of few SMs).
constexpr size_t kMaxParkedBytes = 32 * 1024;

// Values 8 p .. 8 p + 7 of the lane's unit from a row of floats (x, a
// norm weight); zeros for a lane past the row's units.
template <class Dec>
__device__ __forceinline__ void load_lane_piece(const float* row, int lane, int unit, int p, bool active,
                                                float (&v)[8]) {
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
  if (active) {
    const float* src = row + Dec::kUnit * lane + piece_offset<Dec>(unit, p);
    a = __ldg(reinterpret_cast<const float4*>(src));
    b = __ldg(reinterpret_cast<const float4*>(src + 4));
  }
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// kTokens (1 or 2) tokens' x a lane; a batch is kStreamSums / kTokens rows
// (8 or 4). kGated: half the batch's rows are gate rows and half their up
// rows (parts.gate_rows apart), and the block stores act(gate) * up. A
// folded norm (one token only) normalizes x first.
template <class Dec, bool kGated, int kTokens>
__global__ void __launch_bounds__(streamed_threads<Dec>(), streamed_blocks_per_sm_cap<Dec>(kTokens))
    streamed_matvec_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int cols,
                           const float* __restrict__ x, float* y, const float* residual, OutputParts parts,
                           int n_batches, FoldedNorm norm) {
  extern __shared__ float parked[];  // [warp][local batch][sum of the batch: token t, row r at t * kRows + r]
  constexpr int kStreamThreads = streamed_threads<Dec>();
  constexpr int kWarps = kStreamThreads / 32;
  constexpr int kRows = kStreamSums / kTokens;
  constexpr int kPieces = Dec::kUnit / 8;
  constexpr int kGroups = Dec::kScaleGroups;
  constexpr int kPiecesPerGroup = kPieces / kGroups;
  static_assert(kRows % 2 == 0, "gated batches pair gate and up rows");
  const int lane = static_cast<int>(threadIdx.x);
  const int stride = static_cast<int>(gridDim.x);
  const bool active = lane < cols / Dec::kUnit;
  const int unit = lane % Dec::kUnitsPerBlock;
  const size_t lane_bytes = static_cast<size_t>(active ? lane / Dec::kUnitsPerBlock : 0) * Dec::kBlockBytes;
  const int warp_slots = (n_batches + stride - 1) / stride * kStreamSums;
  if constexpr (HasSharedTable<Dec>::value) {  // IQ4_XS's levels
    Dec::fill_table();
    __syncthreads();
  }

  // The lane's x of each token (the block's lanes hold all of it).
  float xv[kTokens][kPieces][8];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
      load_lane_piece<Dec>(x + static_cast<size_t>(t) * cols, lane, unit, p, active, xv[t][p]);
    }
  }
  // A folded RMSNorm: x * scale * weight, as the rms_norm kernel computes
  // it, the sum of squares over the whole row added across the block.
  if constexpr (kTokens == 1) {
    if (norm.weight != nullptr) {
      __shared__ float scratch[kWarpSize];
      float squares = 0.0f;
#pragma unroll
      for (int p = 0; p < kPieces; ++p) {
#pragma unroll
        for (int j = 0; j < 8; ++j) squares = fmaf(xv[0][p][j], xv[0][p][j], squares);
      }
      const float scale = rms_scale(block_sum(squares, scratch), cols, norm.eps);
#pragma unroll
      for (int p = 0; p < kPieces; ++p) {
        float g[8];
        load_lane_piece<Dec>(norm.weight, lane, unit, p, active, g);
#pragma unroll
        for (int j = 0; j < 8; ++j) xv[0][p][j] = xv[0][p][j] * scale * g[j];
      }
    }
  }
  // -1/2 of the lane's sum of x per token and scale group (the fraction
  // quants' offset: matvec's accumulate_unit_factored; unused for signed
  // quants).
  float x_half[kTokens][kGroups] = {};
  if constexpr (Dec::kFractionQuants) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
#pragma unroll
      for (int p = 0; p < kPieces; ++p) {
        const float(&v)[8] = xv[t][p];
        x_half[t][p / kPiecesPerGroup] += -0.5f * (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])));
      }
    }
  }

  // The lane's bytes of the batch's first row, stepped by a constant; rows
  // past the last (gate) row read that row instead (their sums are not
  // stored). Gated: each up row is the same distance after its gate row.
  constexpr int kRowsApart = kGated ? kRows / 2 : kRows;
  const int last_row = kGated ? parts.gate_rows - 1 : rows - 1;
  const uint8_t* first = w + static_cast<size_t>(blockIdx.x) * kRowsApart * row_bytes + lane_bytes;
  const uint8_t* const last = w + static_cast<size_t>(last_row) * row_bytes + lane_bytes;
  const size_t batch_step = static_cast<size_t>(stride) * kRowsApart * row_bytes;
  const size_t up_offset = kGated ? static_cast<size_t>(parts.gate_rows) * row_bytes : 0;
  int local = 0;
  for (int batch = static_cast<int>(blockIdx.x); batch < n_batches; batch += stride, ++local, first += batch_step) {
    typename Dec::Raw raw[kRows];
    const uint8_t* row = first;
#pragma unroll
    for (int i = 0; i < kRowsApart; ++i, row += row_bytes) {
      const uint8_t* clamped = row < last ? row : last;
      raw[i] = Dec::load(clamped, unit);
      if constexpr (kGated) raw[i + kRowsApart] = Dec::load(clamped + up_offset, unit);
    }
    float sums[kStreamSums];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float acc[kTokens] = {};
      static_for<kGroups>([&](auto group_index) {
        constexpr int kGroup = decltype(group_index)::value;
        float dot[kTokens] = {};
        static_for<kPiecesPerGroup>([&](auto piece_index) {
          constexpr int kPiece = kGroup * kPiecesPerGroup + decltype(piece_index)::value;
          float q[8];
          Dec::template quants<kPiece>(raw[i], unit, q);
#pragma unroll
          for (int t = 0; t < kTokens; ++t) {
#pragma unroll
            for (int j = 0; j < 8; ++j) dot[t] = fmaf(q[j], xv[t][kPiece][j], dot[t]);
          }
        });
        // Fraction quants: F scale (dot - sum / 2) - offset * sum, as in
        // matvec; signed quants: scale * dot.
        const float2 scale = Dec::unit_scale(raw[i], unit, kGroup);
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          if constexpr (Dec::kFractionQuants) {
            acc[t] = fmaf(FractionScale<Dec>::value * scale.x, dot[t] + x_half[t][kGroup], acc[t]);
            acc[t] = fmaf(2.0f * scale.y, x_half[t][kGroup], acc[t]);
          } else {
            acc[t] = fmaf(scale.x, dot[t], acc[t]);
          }
        }
      });
#pragma unroll
      for (int t = 0; t < kTokens; ++t) sums[t * kRows + i] = active ? acc[t] : 0.0f;
    }
    reduce_lanes_transposing<kStreamSums, 16>(sums, lane % 32);
    constexpr int kShare = 32 / kStreamSums;  // lane s * kShare holds sum s
    if (lane % kShare == 0) parked[lane / 32 * warp_slots + local * kStreamSums + lane % 32 / kShare] = sums[0];
  }

  __syncthreads();
  const int n_local = local * kStreamSums;
  for (int i = lane; i < n_local; i += kStreamThreads) {
    float total = parked[i];
#pragma unroll
    for (int k = 1; k < kWarps; ++k) total += parked[k * warp_slots + i];
    const int batch = static_cast<int>(blockIdx.x) + i / kStreamSums * stride;
    const int t = i % kStreamSums / kRows, r = i % kRows;
    if constexpr (kGated) {
      parked[i] = total;  // read back below, after the barrier
    } else {
      store_product_sum(parts, y, residual, rows, kTokens, batch * kRows + r, t, total);
    }
  }
  if constexpr (kGated) {
    __syncthreads();
    constexpr int kHalf = kRows / 2;
    for (int i = lane; i < local * kTokens * kHalf; i += kStreamThreads) {
      const int local_batch = i / (kTokens * kHalf), t = i / kHalf % kTokens, j = i % kHalf;
      const int slot = local_batch * kStreamSums + t * kRows + j;
      const int batch = static_cast<int>(blockIdx.x) + local_batch * stride;
      store_gated_sum(parts, y, kTokens, batch * kHalf + j, t, parked[slot], parked[slot + kHalf]);
    }
  }
}

template <class Dec, int kTokens>
int streamed_blocks_per_sm() {
  int blocks = 0;
  M40_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, streamed_matvec_kernel<Dec, false, kTokens>, streamed_threads<Dec>(), 0));
  return blocks;
}

template <class Dec, int kTokens>
bool launch_streamed_tokens(const Product& p, const FoldedNorm& norm) {
  constexpr int kRows = kStreamSums / kTokens;
  constexpr int kThreads = streamed_threads<Dec>();
  const bool gated = p.parts.activation != GatedActivation::None;
  const int n_batches = gated ? (p.parts.gate_rows + kRows / 2 - 1) / (kRows / 2) : (p.rows + kRows - 1) / kRows;
  // As many blocks as fit at once (fewer where the product has fewer
  // batches). Their parked sums take shared memory by the batches each
  // walks; where that lowers the blocks that fit, the rest wait their turn.
  static std::atomic<int> known_blocks_per_sm[64];
  const int per_sm = once_per_device(known_blocks_per_sm, [](int) { return streamed_blocks_per_sm<Dec, kTokens>(); });
  const int grid = std::min(n_batches, current_multiprocessor_count() * per_sm);
  const size_t shared_bytes =
      static_cast<size_t>((n_batches + grid - 1) / grid) * kStreamSums * (kThreads / 32) * sizeof(float);
  if (shared_bytes > kMaxParkedBytes) return false;
  auto* kernel = gated ? streamed_matvec_kernel<Dec, true, kTokens> : streamed_matvec_kernel<Dec, false, kTokens>;
  kernel<<<grid, kThreads, shared_bytes, p.stream>>>(p.w, p.row_bytes, p.rows, p.cols, p.x, p.y, p.residual, p.parts,
                                                    n_batches, norm);
  M40_CUDA_CHECK_LAUNCH();
  return true;
}

// kTwoTokens: two-token products too. Q8_0's and Q4_0's were slower than
// the matvec kernel's (H100, 7B tg64@2, t/s: Q8_0 578-581 -> 575-577, Q4_0
// 701-704 -> 686-688; one token 305-306 -> 312-314 and 414-421 -> 439-440
// with the folded norms), so those stream one token only, as does IQ4_XS
// (358 -> 406-409 at one token; two not measured streamed).
template <class Dec, bool kTwoTokens>
bool launch_streamed_with(const Product& p, const FoldedNorm& norm) {
  if (p.cols % Dec::kUnit != 0 || p.cols > kMaxStreamedCols) return false;
  if (p.n_tokens == 1) return launch_streamed_tokens<Dec, 1>(p, norm);
  if constexpr (kTwoTokens) {
    if (p.n_tokens == 2 && norm.weight == nullptr) return launch_streamed_tokens<Dec, 2>(p, norm);
  }
  return false;
}

}  // namespace

bool launch_streamed(const Product& p, const FoldedNorm& norm) {
  if (p.grouping.items != nullptr) return false;
  if (p.type == gguf::TensorType::Q4_K) return launch_streamed_with<DecodeQ4_KWide, true>(p, norm);
  if (p.type == gguf::TensorType::Q8_0) return launch_streamed_with<DecodeQ8_0, false>(p, norm);
  if (p.type == gguf::TensorType::Q4_0) return launch_streamed_with<DecodeQ4_0Wide, false>(p, norm);
  if (p.type == gguf::TensorType::IQ4_XS) return launch_streamed_with<DecodeIQ4_XSWide, false>(p, norm);
  return false;
}

}  // namespace m40::cuda::mm

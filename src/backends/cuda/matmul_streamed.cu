// One-token Q4_K decode products of rows up to 4096 columns, streamed: a
// block's lanes each own one wide unit (32 values, matmul_decode_wide.cuh)
// of every row, load that unit's x into registers once, and then walk a
// batch of 8 rows after another (grid-stride over the product's batches,
// as many blocks as the GPU holds at once). Each batch's sums are reduced
// within the warp (transposing butterfly) and parked in shared memory; at
// the end the block adds its warps' parts in warp order (the same order
// every run) and stores them, plain, with the residual, into fused parts or
// gated (act(gate) * up: a batch is 4 gate rows and their 4 up rows).
// Since each block holds all of x, it can also apply the layer's RMSNorm to
// x itself (FoldedNorm, matmul.h): the norm launch before the product goes,
// at the cost of one block-wide sum and one load of the norm weight a block.
//
// Why: the matvec kernel gives each block one batch of rows, so each block
// loads x again, and an H100's 4 blocks of 128 threads per SM run in
// lockstep waves (all load, then all compute, then the wave's tail). Kept
// resident, the blocks drift apart and one's loads overlap another's math.
// On an H100 (2026-11-28, CUDA 11.8 sm_90 code from the sm_52 PTX, in a
// graph, us, matvec kernel -> streamed): gate/up 22016x4096 gated 26.0 ->
// 22.1, 12288x4096 16.2 -> 14.1, 11008x4096 15.1 -> 12.9, 4096x4096 7.3 ->
// 6.8. The same blocks given one batch each (x in registers, no walk)
// gained nothing, and the 11008-column down product (344 lanes a block)
// nothing either, so wider rows keep the matvec kernel; so do two tokens.
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

using StreamedDecoder = DecodeQ4_KWide;
constexpr int kStreamThreads = 128;  // one lane per unit: rows of up to 128 units
constexpr int kStreamRows = 8;       // a batch; a power of two (the butterfly)
// 5 blocks of 128 threads per SM: a cap of 102 registers, which CUDA 11.8
// meets without spills for sm_52 (95) and sm_90 (93). (4 blocks: equal on
// the large products, 0.2 us faster on 4096x4096; 6 rows and 16 rows, or
// loading the next batch before computing this one (double the raw
// registers, 3 blocks per SM), were slower on an H100.)
constexpr int kStreamBlocksPerSm = 5;
// Shared memory for the parked sums past which a product keeps the matvec
// kernel (a vocabulary-sized Q4_K output head on a GPU of few SMs).
constexpr size_t kMaxParkedBytes = 32 * 1024;

template <class F, int... i>
__device__ __forceinline__ void for_each_index(F&& f, std::integer_sequence<int, i...>) {
  (f(std::integral_constant<int, i>{}), ...);
}

// kGated: a batch is 4 gate rows and their 4 up rows (parts.gate_rows
// apart), and the block stores act(gate) * up.
template <class Dec, bool kGated>
__global__ void __launch_bounds__(kStreamThreads, kStreamBlocksPerSm)
    streamed_matvec_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int cols,
                           const float* __restrict__ x, float* y, const float* residual, OutputParts parts,
                           int n_batches, FoldedNorm norm) {
  extern __shared__ float parked[];  // [warp][local batch][row of the batch]
  constexpr int kWarps = kStreamThreads / 32;
  constexpr int kPieces = Dec::kUnit / 8;
  constexpr int kGroups = Dec::kScaleGroups;
  constexpr int kPiecesPerGroup = kPieces / kGroups;
  static_assert(Dec::kFractionQuants && HasPieceOffset<Dec>::value, "a wide decoder of fraction quants");
  const int lane = static_cast<int>(threadIdx.x);
  const int stride = static_cast<int>(gridDim.x);
  const bool active = lane < cols / Dec::kUnit;
  const int unit = lane % Dec::kUnitsPerBlock;
  const size_t lane_bytes = static_cast<size_t>(active ? lane / Dec::kUnitsPerBlock : 0) * Dec::kBlockBytes;
  const int warp_slots = (n_batches + stride - 1) / stride * kStreamRows;

  // The lane's x (the block's lanes hold all of it).
  float xv[kPieces][8];
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
    if (active) {
      const float* src = x + Dec::kUnit * lane + Dec::piece_offset(unit, p);
      a = __ldg(reinterpret_cast<const float4*>(src));
      b = __ldg(reinterpret_cast<const float4*>(src + 4));
    }
    xv[p][0] = a.x, xv[p][1] = a.y, xv[p][2] = a.z, xv[p][3] = a.w;
    xv[p][4] = b.x, xv[p][5] = b.y, xv[p][6] = b.z, xv[p][7] = b.w;
  }
  // A folded RMSNorm: x * scale * weight, as the rms_norm kernel computes
  // it, the sum of squares over the whole row added across the block.
  if (norm.weight != nullptr) {
    __shared__ float scratch[kWarpSize];
    float squares = 0.0f;
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
#pragma unroll
      for (int j = 0; j < 8; ++j) squares = fmaf(xv[p][j], xv[p][j], squares);
    }
    const float scale = rms_scale(block_sum(squares, scratch), cols, norm.eps);
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
      if (active) {
        const float* src = norm.weight + Dec::kUnit * lane + Dec::piece_offset(unit, p);
        a = __ldg(reinterpret_cast<const float4*>(src));
        b = __ldg(reinterpret_cast<const float4*>(src + 4));
      }
      const float g[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) xv[p][j] = xv[p][j] * scale * g[j];
    }
  }
  // -1/2 of the lane's sum of x per scale group (the fraction quants'
  // offset: matvec's accumulate_unit_factored).
  float x_half[kGroups] = {};
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    x_half[p / kPiecesPerGroup] += -0.5f * (((xv[p][0] + xv[p][1]) + (xv[p][2] + xv[p][3])) +
                                            ((xv[p][4] + xv[p][5]) + (xv[p][6] + xv[p][7])));
  }

  // The lane's bytes of the batch's first row, stepped by a constant; rows
  // past the last (gate) row read that row instead (their sums are not
  // stored). Gated: each up row is the same distance after its gate row.
  constexpr int kRowsApart = kGated ? kStreamRows / 2 : kStreamRows;
  const int last_row = kGated ? parts.gate_rows - 1 : rows - 1;
  const uint8_t* first = w + static_cast<size_t>(blockIdx.x) * kRowsApart * row_bytes + lane_bytes;
  const uint8_t* const last = w + static_cast<size_t>(last_row) * row_bytes + lane_bytes;
  const size_t batch_step = static_cast<size_t>(stride) * kRowsApart * row_bytes;
  const size_t up_offset = kGated ? static_cast<size_t>(parts.gate_rows) * row_bytes : 0;
  int local = 0;
  for (int batch = static_cast<int>(blockIdx.x); batch < n_batches; batch += stride, ++local, first += batch_step) {
    typename Dec::Raw raw[kStreamRows];
    const uint8_t* row = first;
#pragma unroll
    for (int i = 0; i < kRowsApart; ++i, row += row_bytes) {
      const uint8_t* clamped = row < last ? row : last;
      raw[i] = Dec::load(clamped, unit);
      if constexpr (kGated) raw[i + kRowsApart] = Dec::load(clamped + up_offset, unit);
    }
    float sums[kStreamRows];
#pragma unroll
    for (int i = 0; i < kStreamRows; ++i) {
      float acc = 0.0f;
      for_each_index(
          [&](auto group_index) {
            constexpr int kGroup = decltype(group_index)::value;
            float dot = 0.0f;
            for_each_index(
                [&](auto piece_index) {
                  constexpr int kPiece = kGroup * kPiecesPerGroup + decltype(piece_index)::value;
                  float q[8];
                  Dec::template quants<kPiece>(raw[i], unit, q);
#pragma unroll
                  for (int j = 0; j < 8; ++j) dot = fmaf(q[j], xv[kPiece][j], dot);
                },
                std::make_integer_sequence<int, kPiecesPerGroup>{});
            // F scale (dot - sum / 2) - offset * sum, as in matvec.
            const float2 scale = Dec::unit_scale(raw[i], unit, kGroup);
            acc = fmaf(FractionScale<Dec>::value * scale.x, dot + x_half[kGroup], acc);
            acc = fmaf(2.0f * scale.y, x_half[kGroup], acc);
          },
          std::make_integer_sequence<int, kGroups>{});
      sums[i] = active ? acc : 0.0f;
    }
    reduce_lanes_transposing<kStreamRows, 16>(sums, lane % 32);
    constexpr int kShare = 32 / kStreamRows;  // lane s * kShare holds row s
    if (lane % kShare == 0) parked[lane / 32 * warp_slots + local * kStreamRows + lane % 32 / kShare] = sums[0];
  }

  __syncthreads();
  const int n_local = local * kStreamRows;
  for (int i = lane; i < n_local; i += kStreamThreads) {
    float total = parked[i];
#pragma unroll
    for (int k = 1; k < kWarps; ++k) total += parked[k * warp_slots + i];
    const int batch = static_cast<int>(blockIdx.x) + i / kStreamRows * stride;
    if constexpr (kGated) {
      parked[i] = total;  // read back below, after the barrier
    } else {
      store_product_sum(parts, y, residual, rows, 1, batch * kStreamRows + i % kStreamRows, 0, total);
    }
  }
  if constexpr (kGated) {
    __syncthreads();
    constexpr int kHalf = kStreamRows / 2;
    for (int i = lane; i < local * kHalf; i += kStreamThreads) {
      const int slot = i / kHalf * kStreamRows + i % kHalf;
      const int batch = static_cast<int>(blockIdx.x) + i / kHalf * stride;
      store_gated_sum(parts, y, 1, batch * kHalf + i % kHalf, 0, parked[slot], parked[slot + kHalf]);
    }
  }
}

int streamed_blocks_per_sm() {
  int blocks = 0;
  M40_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, streamed_matvec_kernel<StreamedDecoder, false>, kStreamThreads, 0));
  return blocks;
}

}  // namespace

bool launch_streamed(const Product& p, const FoldedNorm& norm) {
  if (p.type != gguf::TensorType::Q4_K || p.n_tokens != 1 || p.grouping.items != nullptr) return false;
  if (p.cols % StreamedDecoder::kUnit != 0 || p.cols / StreamedDecoder::kUnit > kStreamThreads) return false;
  const bool gated = p.parts.activation != GatedActivation::None;
  const int n_batches = gated ? (p.parts.gate_rows + kStreamRows / 2 - 1) / (kStreamRows / 2)
                              : (p.rows + kStreamRows - 1) / kStreamRows;
  // As many blocks as fit at once (fewer where the product has fewer
  // batches). Their parked sums take shared memory by the batches each
  // walks; where that lowers the blocks that fit, the rest wait their turn.
  static std::atomic<int> known_blocks_per_sm[64];
  const int per_sm = once_per_device(known_blocks_per_sm, [](int) { return streamed_blocks_per_sm(); });
  const int grid = std::min(n_batches, current_multiprocessor_count() * per_sm);
  const size_t shared_bytes =
      static_cast<size_t>((n_batches + grid - 1) / grid) * kStreamRows * (kStreamThreads / 32) * sizeof(float);
  if (shared_bytes > kMaxParkedBytes) return false;
  auto* kernel = gated ? streamed_matvec_kernel<StreamedDecoder, true> : streamed_matvec_kernel<StreamedDecoder, false>;
  kernel<<<grid, kStreamThreads, shared_bytes, p.stream>>>(p.w, p.row_bytes, p.rows, p.cols, p.x, p.y, p.residual,
                                                          p.parts, n_batches, norm);
  M40_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace m40::cuda::mm

// Decode products: y[t] = W x[t] for up to 16 tokens, every weight read once
// for the whole batch.
//
// A block of 128 threads owns kRows consecutive rows (4, or 8 at one and two
// tokens for most types; 2 for Q5_K and Q6_K at 3 to 16), or two groups of 64
// lanes own kRows rows each (the wide decoders on narrow rows). Each thread
// walks the rows' units (8 or 16 consecutive values, or 16 to 64 scattered
// ones for the wide decoders, matmul_decode.cuh) with a stride of 128 (or
// 64) units, so a warp's loads of one row are contiguous; a thread keeps a
// pointer to the block it is in and steps it by a constant number of bytes.
// It decodes a unit of each of its rows into registers once and multiplies
// it with every token's x (two 16-byte loads per token and 8 values, from
// L1), so one x load serves all the rows. acc holds kRows x kTokens sums per
// thread (split into 2 or 4 partial sums when there are fewer than 4, so
// that several FMA chains are in flight); each warp reduces them with a
// transposing butterfly (each shuffle step halves the values a lane keeps),
// and the group's warps' parts meet in shared memory, added in a fixed
// order.
//
// kTokens is n_tokens rounded up to a power of two; the extra tokens re-read
// the last token's x and are not stored.
//
// Lane-ordered x (3 to 16 tokens, that is kTokens 4 to 16, the 16-value
// units of the block formats, where the device has a memory pool): lanes
// take consecutive units, so in x as stored a lane's 16-byte load and its
// neighbour's are 64 bytes apart and one warp-wide load touches 16 cache
// lines (Nsight Compute: the L1 pipe 79% busy at 8 tokens, Q4_K). The
// launcher first copies x into lane order (permute_x_kernel): within each
// group of 32 units, value 4 j + i of unit l goes to 128 j + 4 l + i, so a
// warp's load of quarter j of its units reads 512 consecutive bytes. 8-token
// products got 25-35% faster on an H200 (Q8_0, Q4_0, Q4_K at 11008x4096:
// 60/57/68 -> 41/41/47 us); F16 (8-value units) gained nothing.
//
// A lane issues the loads of 1, 2 or 4 units (by the size of the decoder's
// registers) before it computes on them: an H200 needs some 3 MB in flight
// to approach its bandwidth, an M40 about 150 KB.
//
// One and two tokens of Q4_0, IQ4_NL, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K and
// IQ4_XS use the wide decoders (matmul_decode.cuh), whose
// units use (nearly) every byte a lane loads:
// 11-34% fewer instructions per weight, and on an H200 up to 27% faster at
// one token (Q4_K 11008x4096 17.7 -> 16.1 us, Q6_K 26.3 -> 20.7), up to 33%
// at two (but IQ4_NL, whose shared-memory table serves the M40, 8% slower).
// Their units cover scattered columns chosen so that the two lanes of a
// 32-byte chunk still read x within one 128-byte line: a first version with
// 64 consecutive columns per lane made every x load touch 32 lines and was
// 10-30% slower than the old decoders.
//
// Batches of 9 to 16 tokens run as one launch of 16 (two of 8 for the
// K-quants, Q4_1, Q5_0 and Q5_1, each reading the weights: on an H200 still
// cheaper than one gemm tile). 17 to 32 are compute-bound on the M40 (32 FMAs per weight byte at
// F16) and keep more sums than registers allow here; they go to the gemm
// kernel with a single token tile (matmul_gemm.cu), which reads every weight
// once, except for the 2-byte-aligned block formats (Q8_0, Q4_0, IQ4_NL),
// whose tile loads cost more than a second matvec launch (tiles_load_slowly).
// One- and two-token Q4_K and one-token Q8_0, Q4_0 and IQ4_XS products of
// rows up to 4096 columns take the streamed kernel (matmul_streamed.cu);
// Q4_K at 3 to 16 tokens the skinny kernel (matmul_skinny.cu), and a
// grouped product's narrow rows lane groups of their width (launch_wide,
// launch_for_tokens).
#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/matmul_internal.cuh"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/warp_reduce.cuh"
#include "common/error.h"

namespace m40::cuda::mm {

namespace {

constexpr int kMatvecThreads = 128;
#ifndef M40_MAX_FACTORED_TOKENS
#define M40_MAX_FACTORED_TOKENS 2
#endif
constexpr int kMaxFactoredTokens = M40_MAX_FACTORED_TOKENS;
static_assert(kMaxFactoredTokens >= 2, "the wide decoders serve 1 and 2 tokens, in factored form only");


// Units of a lane-ordered group, and the floats between a unit's quarters.
constexpr int kGroupUnits = 32;
constexpr int kQuarterStride = 4 * kGroupUnits;

// Values 8 piece .. 8 piece + 7 of the unit at column `col` of an x row,
// through the read-only path: in x as stored at col + offset (8 piece but
// for units of scattered columns, piece_offset below); in lane order,
// quarters 2 piece and 2 piece + 1 of the unit, whose place is col + delta +
// 128 j with the lane's constant delta (matvec_kernel's `delta`).
template <bool kLaneOrder>
__device__ __forceinline__ void load_x8(const float* __restrict__ x_row, int col, int piece, int offset, int delta,
                                        float (&xv)[8]) {
  const float* p = kLaneOrder ? x_row + col + delta + 2 * kQuarterStride * piece : x_row + col + offset;
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p + (kLaneOrder ? kQuarterStride : 4)));
  xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
}

// acc[split][t * kRows + r] += dot(values 8 * piece .. + 7 of the unit in
// row r, x[t] at the same columns). With kSplit > 1 the eight products go to
// kSplit independent sums, so that a lane has several FMA chains in flight
// when it has few tokens and rows.
template <class Dec, bool kLaneOrder, int piece, int kTokens, int kRows, int kSplit>
__device__ __forceinline__ void accumulate_piece(const typename Dec::Raw* raw, int unit, const float* __restrict__ x,
                                                 int x_stride, int col, int delta, int last_token,
                                                 float (&acc)[kSplit][kTokens * kRows]) {
  float w[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) Dec::template decode<piece>(raw[r], unit, w[r]);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float xv[8];
    load_x8<kLaneOrder>(x + min(t, last_token) * x_stride, col, piece, 8 * piece, delta, xv);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float& s = acc[j % kSplit][t * kRows + r];
        s = fmaf(w[r][j], xv[j], s);
      }
    }
  }
}

template <class Dec, bool kLaneOrder, int kTokens, int kRows, int kSplit>
__device__ __forceinline__ void accumulate_unit(const typename Dec::Raw* raw, int unit, const float* __restrict__ x,
                                                int x_stride, int col, int delta, int last_token,
                                                float (&acc)[kSplit][kTokens * kRows]) {
  accumulate_piece<Dec, kLaneOrder, 0, kTokens, kRows, kSplit>(raw, unit, x, x_stride, col, delta, last_token, acc);
  if constexpr (Dec::kUnit == 16) {
    accumulate_piece<Dec, kLaneOrder, 1, kTokens, kRows, kSplit>(raw, unit, x, x_stride, col, delta, last_token, acc);
  }
}

// The factored form of accumulate_unit (matmul_decode.cuh): per row, token
// and scale group, dot(q, x) over the group's values, then acc += scale *
// dot for the signed quants; for the fraction quants (q' = 1/2 + q / 256),
// acc += F scale (dot(q', x) - sum(x) / 2) - offset * sum(x) (F = 256 or the
// decoder's kFractionScale), the sum of x
// shared by all rows. Two or three instructions per weight (byte permute or
// shared-memory load, FMA; a subtraction for Q8_0) instead of four or five.
template <class Dec, bool kLaneOrder, int kTokens, int kRows>
__device__ __forceinline__ void accumulate_unit_factored(const typename Dec::Raw* raw, int unit,
                                                         const float* __restrict__ x, int x_stride, int col, int delta,
                                                         int last_token, float (&acc)[kTokens * kRows]) {
  constexpr int kPiecesPerGroup = Dec::kUnit / 8 / Dec::kScaleGroups;
  static_assert(!kLaneOrder || !HasPieceOffset<Dec>::value, "lane order: units of consecutive columns");
  static_for<Dec::kScaleGroups>([&](auto group_constant) {
    constexpr int kGroup = decltype(group_constant)::value;
    float dot[kTokens * kRows];
    float x_sum[kTokens];
#pragma unroll
    for (int i = 0; i < kTokens * kRows; ++i) dot[i] = 0.0f;
#pragma unroll
    for (int t = 0; t < kTokens; ++t) x_sum[t] = 0.0f;
    static_for<kPiecesPerGroup>([&](auto index) {
      constexpr int kPiece = kGroup * kPiecesPerGroup + decltype(index)::value;
      // Every token's x first, then one row's quants at a time: 8 registers
      // of quants instead of 8 per row.
      const int offset = piece_offset<Dec>(unit, kPiece);
      float xv[kTokens][8];
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        load_x8<kLaneOrder>(x + min(t, last_token) * x_stride, col, kPiece, offset, delta, xv[t]);
        if constexpr (Dec::kFractionQuants) {
          x_sum[t] += ((xv[t][0] + xv[t][1]) + (xv[t][2] + xv[t][3])) + ((xv[t][4] + xv[t][5]) + (xv[t][6] + xv[t][7]));
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float q[8];
        Dec::template quants<kPiece>(raw[r], unit, q);
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
#pragma unroll
          for (int j = 0; j < 8; ++j) dot[t * kRows + r] = fmaf(q[j], xv[t][j], dot[t * kRows + r]);
        }
      }
    });
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float2 scale = Dec::unit_scale(raw[r], unit, kGroup);
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        float& sum = acc[t * kRows + r];
        if constexpr (Dec::kFractionQuants) {
          sum = fmaf(FractionScale<Dec>::value * scale.x, fmaf(-0.5f, x_sum[t], dot[t * kRows + r]), sum);
          sum = fmaf(-scale.y, x_sum[t], sum);
        } else {
          sum = fmaf(scale.x, dot[t * kRows + r], sum);
        }
      }
    }
  });
}

// Register cap (blocks of 128 threads: 6 blocks per SM cap a thread at 80
// registers, 4 at 128, 3 at 168, 2 at 255), by the sums a thread keeps.
// Uncapped, the compiler hoists the x loads of every token ahead of the math
// and takes registers that occupancy needs. The caps are the smallest at
// which CUDA 11.8 for sm_52 does not spill; CUDA 13 for sm_90 spills a
// little in two kernels (8 bytes in Q4_0 at 8 tokens in lane order, which
// costs less than the next cap's occupancy: 11008x4096 39 us against 45;
// 48 bytes in IQ4_NL at 16 tokens).
template <class Dec>
constexpr int min_blocks_per_sm(int tokens, int rows) {
  const int sums = tokens * rows;
  const bool k_quant = std::is_same_v<Dec, DecodeQ4_K> || std::is_same_v<Dec, DecodeQ5_K> ||
                       std::is_same_v<Dec, DecodeQ6_K> || std::is_same_v<Dec, DecodeQ4_KWide> ||
                       std::is_same_v<Dec, DecodeQ5_KWide> || std::is_same_v<Dec, DecodeQ6_KWide> ||
                       std::is_same_v<Dec, DecodeQ2_KWide> || std::is_same_v<Dec, DecodeQ3_KWide>;
  if (sums <= 4 && rows <= 2 && tokens == 1) return 6;
  if (sums > 32) return 2;
  // Q4_K's wide decoder at one token and 8 rows fits 128 registers without
  // spills, and a 4096-row product then fills one wave of 4 blocks per SM
  // on an H200 instead of 1.3 of 3 (rows_for_few_tokens).
  if (std::is_same_v<Dec, DecodeQ4_KWide> && tokens == 1) return 4;
  if (k_quant) return sums <= 4 ? 4 : sums <= 8 ? 3 : 2;
  return sums <= 16 ? 4 : 3;
}

// Units a lane loads before it computes on them: enough bytes in flight per
// lane (a large GPU needs megabytes in flight to reach its bandwidth) within
// the register cap.
template <class Dec, int kTokens, int kRows>
constexpr int units_per_round() {
  // Eight rows of a block format: one unit a round. At two tokens, 16 sums
  // beside two units' bytes spill on sm_52; at one, Q8_0 and IQ4_NL are 2-4%
  // faster on an H200 with one (Q8_0 11008x4096 17.9 -> 17.5 us) and Q4_0
  // 7% slower (13.5 -> 14.5). More blocks per SM instead (a cap of 5 or 6)
  // made all three 5-35% slower.
  if (Dec::kFactored && kTokens <= 2 && kRows >= 8 && !(std::is_same_v<Dec, DecodeQ4_0Wide> && kTokens == 1)) return 1;
  constexpr size_t kRaw = sizeof(typename Dec::Raw);
  if (HasPieceOffset<Dec>::value) return kRaw <= 16 ? 2 : 1;  // the wide decoders: more sums per unit
  if (kRaw <= 16) return kTokens <= 2 ? 4 : kTokens == 4 ? 2 : 1;
  return kTokens <= 2 && kRaw <= 32 ? 2 : 1;
}

// x_stride: floats from one token's x to the next (cols, or the padded row of
// lane-ordered x).
// kGrouped: a grouped product (matmul.h, grouped_matmul), its own
// instantiation: moving w, x and y to the block's work item keeps them in
// registers, which the plain products' register caps have no room for
// (sm_52 spilled up to 100 bytes in 26 of them when one kernel did both);
// the grouped kernels that spilled at their plain cap take one block per SM
// less (a cap for all of them cost 4-5% at 8 and 32 sequences of a
// Qwen3-30B-A3B Q4_K_M on an H100).
// The narrow lane groups of a grouped product (launch_wide: 16 or 32 lanes)
// spilled at one token for Q4_K and Q6_K too.
template <class Dec>
constexpr int grouped_blocks_per_sm(int plain, bool grouped, int tokens, int lanes) {
  const bool spills = (std::is_same_v<Dec, DecodeQ2_KWide> && tokens == 1) ||
                      (std::is_same_v<Dec, DecodeQ4_0Wide> && tokens == 1) ||
                      (std::is_same_v<Dec, DecodeQ3_KWide> && tokens == 2) || (lanes < 64 && tokens == 1);
  return grouped && spills ? plain - 1 : plain;
}

// Whether a kernel computes gated products (OutputParts): whole warps to a
// lane group and whole pairs of gate and up rows, at one and two tokens, of
// the block formats. (The float types' two-token kernels spilled on sm_52
// with the gated rows' addressing; their FFNs keep the activation kernel.)
template <class Dec>
__host__ __device__ constexpr bool gatable(int tokens, int rows, int lanes, bool grouped) {
  constexpr bool float_type =
      std::is_same_v<Dec, DecodeF32> || std::is_same_v<Dec, DecodeF16> || std::is_same_v<Dec, DecodeBF16>;
  return !float_type && tokens <= kMaxGatedTokens && !grouped && rows % 2 == 0 && lanes >= 64;
}

// Block `block` of a matvec_kernel launch (its index among the product's
// blocks: matvec_pair_kernel runs two products' blocks in one grid).
template <class Dec, int kTokens, int kRows, int kLanes, int kUnitsPerRound, bool kLaneOrder, bool kGrouped>
__device__ __forceinline__ void matvec_block(int block_index, const uint8_t* __restrict__ w, size_t row_bytes, int rows,
                                             int cols, const float* __restrict__ x, int x_stride, int n_tokens,
                                             float* y, const float* residual, OutputParts parts,
                                             ExpertGrouping grouping) {
  static_assert(kLanes <= 32 ? 32 % kLanes == 0 : kLanes % 32 == 0 && kMatvecThreads % kLanes == 0,
                "groups tile the warp, or whole warps tile the group");
  static_assert(kLanes % Dec::kUnitsPerBlock == 0, "a lane keeps its unit within the block");
  constexpr int kGroups = kMatvecThreads / kLanes;
  constexpr int kWarpLanes = kLanes < 32 ? kLanes : 32;  // lanes of a group within one warp
  constexpr int kWarpsPerGroup = kLanes / kWarpLanes;
  constexpr int kSums = kTokens * kRows;
  // Factored decoding (one and two tokens: with more, the FMAs with x
  // dominate and the extra sums cost registers).
  constexpr bool kFactored = Dec::kFactored && kTokens <= kMaxFactoredTokens;
  static_assert(kFactored || !HasPieceOffset<Dec>::value, "a wide decoder has quants() only");
  constexpr int kSplit = kSums >= 4 || kFactored ? 1 : 4 / kSums;
  // From one unit of a lane to its next: this many columns and bytes.
  constexpr int kColumnStep = kLanes * Dec::kUnit;
  constexpr int kByteStep = kLanes / Dec::kUnitsPerBlock * Dec::kBlockBytes;

  // A grouped product's blocks of item blockIdx.y (the whole block leaves
  // together, before any barrier).
  if constexpr (kGrouped) M40_SELECT_EXPERT_ITEM(grouping, static_cast<int>(blockIdx.y), w, x, x_stride, y, rows, n_tokens);
  const int thread = static_cast<int>(threadIdx.x);
  const int sub = thread % kLanes;           // the lane's place in its group
  const int warp_sub = thread % kWarpLanes;  // ... within its warp's part of the group
  const int row0 = (block_index * kGroups + thread / kLanes) * kRows;
  const int unit = sub % Dec::kUnitsPerBlock;  // the lane's unit within each block it visits
  // A gated product (gatable kernels only): the group's rows are kRows / 2
  // gate rows from gate0 = row0 / 2 on and the same up rows, so that each
  // gate sum meets its up sum in the group. (The epilogue reads the flag
  // and gate0 again from the arguments: live through the loop they cost
  // registers.)
  constexpr bool kGatable = gatable<Dec>(kTokens, kRows, kLanes, kGrouped);
  constexpr int kHalf = kRows / 2;
  // Groups past the last row compute on the last row (shuffles need the
  // whole warp) and store nothing.
  const uint8_t* block[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    block[r] = w + static_cast<size_t>(min(row0 + r, rows - 1)) * row_bytes +
               static_cast<size_t>(sub / Dec::kUnitsPerBlock) * Dec::kBlockBytes;
  }
  if constexpr (kGatable) {
    if (parts.activation != GatedActivation::None) {
      const int gate0 = row0 / 2;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = (r < kHalf ? 0 : parts.gate_rows) + min(gate0 + r % kHalf, parts.gate_rows - 1);
        block[r] = w + static_cast<size_t>(row) * row_bytes +
                   static_cast<size_t>(sub / Dec::kUnitsPerBlock) * Dec::kBlockBytes;
      }
    }
  }

  if constexpr (HasSharedTable<Dec>::value) {
    Dec::fill_table();
    __syncthreads();
  }
  const int last_token = n_tokens - 1;
  // Lane order: a unit's quarter j is at col + delta + 128 j; the lane's
  // units are all unit number sub % 32 of their group.
  static_assert(!kLaneOrder || (kLanes % kGroupUnits == 0 && Dec::kUnit == 16), "lane order: warps of whole groups");
  const int delta = kLaneOrder ? (4 - Dec::kUnit) * (sub % kGroupUnits) : 0;
  float acc[kSplit][kSums];
#pragma unroll
  for (int s = 0; s < kSplit; ++s) {
#pragma unroll
    for (int i = 0; i < kSums; ++i) acc[s][i] = 0.0f;
  }

  // Each round loads kUnitsPerRound units of every row, then computes on
  // them; a unit past the row's end loads the lane's first unit instead (an
  // L1 hit) and is skipped. A lane with no unit at all (a group wider than
  // the row) loads nothing. (Staging the round's x in shared memory with
  // coalesced loads was tried: 1.3 to 2x slower at batch 1 on an H200.)
#pragma unroll 1
  for (int col = Dec::kUnit * sub; col < cols; col += kUnitsPerRound * kColumnStep) {
    typename Dec::Raw raw[kUnitsPerRound][kRows];
#pragma unroll
    for (int u = 0; u < kUnitsPerRound; ++u) {
      const int offset = col + u * kColumnStep < cols ? u * kByteStep : 0;
#pragma unroll
      for (int r = 0; r < kRows; ++r) raw[u][r] = Dec::load(block[r] + offset, unit);
    }
#pragma unroll
    for (int u = 0; u < kUnitsPerRound; ++u) {
      if (u == 0 || col + u * kColumnStep < cols) {
        if constexpr (kFactored) {
          accumulate_unit_factored<Dec, kLaneOrder, kTokens, kRows>(raw[u], unit, x, x_stride, col + u * kColumnStep,
                                                                    delta, last_token, acc[0]);
        } else {
          accumulate_unit<Dec, kLaneOrder, kTokens, kRows, kSplit>(raw[u], unit, x, x_stride, col + u * kColumnStep,
                                                                   delta, last_token, acc);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) block[r] += kUnitsPerRound * kByteStep;
  }

#pragma unroll
  for (int s = 1; s < kSplit; ++s) {
#pragma unroll
    for (int i = 0; i < kSums; ++i) acc[0][i] += acc[s][i];
  }
  reduce_lanes_transposing<kSums, kWarpLanes / 2>(acc[0], warp_sub);

  auto store = [&](int element, float sum) {
    store_product_sum(parts, y, residual, rows, n_tokens, row0 + element % kRows, element / kRows, sum);
  };
  // Element e of the warp's totals: which lane holds it after the butterfly.
  constexpr int kPerLane = kSums >= kWarpLanes ? kSums / kWarpLanes : 1;
  constexpr int kShare = kSums >= kWarpLanes ? 1 : kWarpLanes / kSums;
  if constexpr (kWarpsPerGroup == 1) {  // (never gated: kGatable)
    if (warp_sub % kShare == 0) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) store(warp_sub / kShare * kPerLane + i, acc[0][i]);
    }
  } else {
    // The group's warps each hold a part of every sum: they meet in shared
    // memory and the group's first lanes add the parts in warp order (the
    // same order every run).
    __shared__ float warp_sums[kMatvecThreads / 32][kSums];
    const int warp = thread / 32;
    if (warp_sub % kShare == 0) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) warp_sums[warp][warp_sub / kShare * kPerLane + i] = acc[0][i];
    }
    __syncthreads();
    const bool gated = kGatable && parts.activation != GatedActivation::None;
    if (sub < kSums) {
      const int first_warp = thread / kLanes * kWarpsPerGroup;
      float sum = warp_sums[first_warp][sub];
#pragma unroll
      for (int k = 1; k < kWarpsPerGroup; ++k) sum += warp_sums[first_warp + k][sub];
      if (!gated) store(sub, sum);
      if constexpr (kGatable) warp_sums[first_warp][sub] = sum;  // (read above by this thread only)
    }
    if constexpr (kGatable) {
      if (gated) {
        const int first_warp = thread / kLanes * kWarpsPerGroup;
        const int gate0 = (block_index * kGroups + thread / kLanes) * kHalf;
        // Sum t * kRows + r is token t's gate row r, t * kRows + kHalf + r
        // its up row.
        __syncthreads();
        if (sub < kTokens * kHalf) {
          const int t = sub / kHalf;
          const int r = sub % kHalf;
          store_gated_sum(parts, y, n_tokens, gate0 + r, t, warp_sums[first_warp][t * kRows + r],
                          warp_sums[first_warp][t * kRows + kHalf + r]);
        }
      }
    }
  }
}

template <class Dec, int kTokens, int kRows, int kLanes, int kUnitsPerRound, bool kLaneOrder, bool kGrouped>
__global__ void __launch_bounds__(kMatvecThreads,
                                  grouped_blocks_per_sm<Dec>(min_blocks_per_sm<Dec>(kTokens, kRows), kGrouped, kTokens, kLanes))
    matvec_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int cols, const float* __restrict__ x,
                  int x_stride, int n_tokens, float* y, const float* residual, OutputParts parts,
                  ExpertGrouping grouping) {
  matvec_block<Dec, kTokens, kRows, kLanes, kUnitsPerRound, kLaneOrder, kGrouped>(
      static_cast<int>(blockIdx.x), w, row_bytes, rows, cols, x, x_stride, n_tokens, y, residual, parts, grouping);
}

// One product of a matvec_pair_kernel launch: one token, no residual, y or
// the fused parts.
struct PairedProduct {
  const uint8_t* w;
  size_t row_bytes;
  int rows;
  int cols;
  const float* x;
  float* y;
  OutputParts parts;
};

// Two products of one token in one launch: blocks [0, a_blocks) compute A
// (decoder DecA), the rest B, each as its own matvec_kernel would. A layer
// whose Q and K are of one type and V of another (Q4_K and Q6_K in Q4_K_M
// files) then takes one launch for the three instead of two.
template <class DecA, int kRowsA, int kLanesA, int kRoundA, class DecB, int kRowsB, int kLanesB, int kRoundB>
__global__ void __launch_bounds__(kMatvecThreads,
                                  std::min(min_blocks_per_sm<DecA>(1, kRowsA), min_blocks_per_sm<DecB>(1, kRowsB)))
    matvec_pair_kernel(PairedProduct a, PairedProduct b, int a_blocks) {
  const int block = static_cast<int>(blockIdx.x);
  if (block < a_blocks) {
    matvec_block<DecA, 1, kRowsA, kLanesA, kRoundA, false, false>(block, a.w, a.row_bytes, a.rows, a.cols, a.x, a.cols,
                                                                  1, a.y, nullptr, a.parts, ExpertGrouping{});
  } else {
    matvec_block<DecB, 1, kRowsB, kLanesB, kRoundB, false, false>(block - a_blocks, b.w, b.row_bytes, b.rows, b.cols,
                                                                  b.x, b.cols, 1, b.y, nullptr, b.parts,
                                                                  ExpertGrouping{});
  }
}

// x in lane order (the comment at the top): float4 c of a row of `cols`
// goes to its place in a row of `stride` (cols rounded up to whole groups).
__global__ void permute_x_kernel(const float* __restrict__ x, int n_tokens, int cols, int stride, int unit,
                                 float* __restrict__ out) {
  const int quads = cols / 4;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n_tokens * quads;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    const int t = i / quads;
    const int c = 4 * (i % quads);
    const int u = c / unit;
    const int j = c % unit / 4;
    const int place = u / kGroupUnits * kGroupUnits * unit + j * kQuarterStride + 4 * (u % kGroupUnits);
    const float4 v = __ldg(reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * cols) + c / 4);
    *reinterpret_cast<float4*>(out + static_cast<size_t>(t) * stride + place) = v;
  }
}

// A grouped product only (no plain instantiation): launch's grouped
// branch, and the narrow lane groups of launch_wide and launch_few_tokens.
template <class Dec, int kTokens, int kRows, int kLanes>
void launch_grouped(const Product& p) {
  static_assert(kTokens <= kMaxExpertMatvecTokens, "grouped products take the decode kernel up to 4 tokens");
  constexpr int kRowsPerBlock = kMatvecThreads / kLanes * kRows;
  const dim3 blocks((p.rows + kRowsPerBlock - 1) / kRowsPerBlock, p.grouping.n_items);
  constexpr int kRound = units_per_round<Dec, kTokens, kRows>();
  matvec_kernel<Dec, kTokens, kRows, kLanes, kRound, false, true><<<blocks, kMatvecThreads, 0, p.stream>>>(
      p.w, p.row_bytes, p.rows, p.cols, p.x, p.cols, p.n_tokens, p.y, p.residual, p.parts, p.grouping);
  M40_CUDA_CHECK_LAUNCH();
}

template <class Dec, int kTokens, int kRows, int kLanes>
void launch(const Product& p) {
  if (p.parts.activation != GatedActivation::None && !gatable<Dec>(kTokens, kRows, kLanes, false)) {
    throw Error("matvec: no gated kernel for " + std::to_string(p.n_tokens) + " tokens of this type");
  }
  constexpr int kRowsPerBlock = kMatvecThreads / kLanes * kRows;
  // grid.y: a grouped product's work items.
  const dim3 blocks((p.rows + kRowsPerBlock - 1) / kRowsPerBlock, p.grouping.items != nullptr ? p.grouping.n_items : 1);
  constexpr int kRound = units_per_round<Dec, kTokens, kRows>();
  // Lane order pays for its extra launch from 4 tokens on (at 1 token it
  // saved under 1 us of 10-20).
  constexpr bool kLaneOrderable = kTokens >= 4 && kLanes == kMatvecThreads && Dec::kUnit == 16 &&
                                  !HasPieceOffset<Dec>::value;
  if constexpr (kLaneOrderable) {
    if (p.grouping.items == nullptr && scratch_pool_ready(p.stream)) {
      constexpr int kGroupCols = kGroupUnits * Dec::kUnit;
      const int stride = (p.cols + kGroupCols - 1) / kGroupCols * kGroupCols;
      StreamScratch ordered(static_cast<size_t>(p.n_tokens) * static_cast<size_t>(stride) * sizeof(float), p.stream);
      const int quads = p.n_tokens * (p.cols / 4);
      permute_x_kernel<<<std::min((quads + 255) / 256, 1024), 256, 0, p.stream>>>(p.x, p.n_tokens, p.cols, stride,
                                                                                    Dec::kUnit, ordered.floats());
      M40_CUDA_CHECK_LAUNCH();
      matvec_kernel<Dec, kTokens, kRows, kLanes, kRound, true, false><<<blocks, kMatvecThreads, 0, p.stream>>>(
          p.w, p.row_bytes, p.rows, p.cols, ordered.floats(), stride, p.n_tokens, p.y, p.residual, p.parts, p.grouping);
      M40_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  if (p.grouping.items != nullptr) {
    if constexpr (kTokens <= kMaxExpertMatvecTokens) return launch_grouped<Dec, kTokens, kRows, kLanes>(p);
    throw Error("grouped products take the decode kernel up to " + std::to_string(kMaxExpertMatvecTokens) + " tokens");
  }
  matvec_kernel<Dec, kTokens, kRows, kLanes, kRound, false, false><<<blocks, kMatvecThreads, 0, p.stream>>>(
      p.w, p.row_bytes, p.rows, p.cols, p.x, p.cols, p.n_tokens, p.y, p.residual, p.parts, p.grouping);
  M40_CUDA_CHECK_LAUNCH();
}

// Rows a block computes together: each x load serves all of them. Four
// halve the x traffic of two (1.6x faster at 8 tokens on an H200, a little
// at 1); Q5_K and Q6_K keep two, whose decoders need the registers (their
// wide decoders, at 1 and 2 tokens, take four).
template <class Dec>
constexpr int rows_per_block() {
  if (std::is_same_v<Dec, DecodeQ5_K> || std::is_same_v<Dec, DecodeQ6_K>) return 2;
  return 4;
}

// Rows a block computes together at one and two tokens: eight, which halve
// the x loads per weight of four. Batch 1 is bound by the L1 pipe's
// wavefronts on an H200 (Q8_0: some 46 per 512 weights, a third of them x
// loads whose lanes are 64 bytes apart), and x loads are instructions the
// M40 must issue. On an H200 (11008x4096, in a graph, us): Q8_0 19.2 ->
// 18.1 at one token and 25.7 -> 19.4 at two, Q4_0 15.9 -> 13.5, IQ4_NL
// 20.3 -> 17.4; at two tokens F16 27.2 -> 24.6 (4096x11008), Q4_K 21.0 ->
// 18.2; Q4_K at one token too, at 4 blocks per SM
// (min_blocks_per_sm; with 3, its 4096-row products filled only 1.3 waves
// and were slower, 13.7 -> 15.9 us): 15.4 -> 14.2 us at 11008x4096, 14.0 ->
// 13.3 at 4096x11008, 7.3 -> 7.1 at 4096x4096, 3.97 -> 3.78 sm_52
// instructions per weight. Four stay where eight lost or spilled: the float
// types at one token (F16 1-3% slower), Q5_K and Q3_K (spill on sm_52) and
// Q6_K (19.9 -> 24.2 us, spills). IQ4_XS, with IQ4_NL's units, takes eight.
template <class Dec, int kTokens>
constexpr int rows_for_few_tokens() {
  if (std::is_same_v<Dec, DecodeQ5_KWide> || std::is_same_v<Dec, DecodeQ6_KWide> || std::is_same_v<Dec, DecodeQ3_KWide>) {
    return 4;
  }
  if (!Dec::kFactored) return kTokens == 1 ? 4 : 8;
  return 8;
}

// Rows a block computes together at 9 to 16 tokens, in one launch that
// decodes each weight once for all of them; 0: two launches of 8 instead.
// One launch of 16 x 4 sums beats two of 8 on an H200 (11008x4096: Q8_0
// 81 -> 73 us, F16 79 -> 77; 4096x4096: Q8_0 39 -> 31, F16 35 -> 30). The
// K-quants' 16 x 4 spill on sm_52 (as do Q3_K's, Q5_0's and Q5_1's; Q2_K's
// and Q4_1's on sm_90), and
// Q4_K's 16 x 2 was slower than two launches of 8 (96 against 89 us), so
// they keep two launches.
template <class Dec>
constexpr int rows_for_16_tokens() {
  if (std::is_same_v<Dec, DecodeQ4_K> || std::is_same_v<Dec, DecodeQ5_K> || std::is_same_v<Dec, DecodeQ6_K> ||
      std::is_same_v<Dec, DecodeQ2_K> || std::is_same_v<Dec, DecodeQ3_K> || std::is_same_v<Dec, DecodeQ4_1> ||
      std::is_same_v<Dec, DecodeQ5_0> || std::is_same_v<Dec, DecodeQ5_1>) {
    return 0;
  }
  return rows_per_block<Dec>();
}

// The wide decoder of a type (matmul_decode.cuh), for one and two tokens;
// the type's own decoder where it has none.
template <class Dec>
struct WideDecoder {
  using type = Dec;
};
template <>
struct WideDecoder<DecodeQ4_0> {
  using type = DecodeQ4_0Wide;
};
template <>
struct WideDecoder<DecodeIQ4_NL> {
  using type = DecodeIQ4_NLWide;
};
template <>
struct WideDecoder<DecodeQ4_K> {
  using type = DecodeQ4_KWide;
};
template <>
struct WideDecoder<DecodeQ5_K> {
  using type = DecodeQ5_KWide;
};
template <>
struct WideDecoder<DecodeQ6_K> {
  using type = DecodeQ6_KWide;
};
template <>
struct WideDecoder<DecodeQ2_K> {
  using type = DecodeQ2_KWide;
};
template <>
struct WideDecoder<DecodeQ3_K> {
  using type = DecodeQ3_KWide;
};
template <>
struct WideDecoder<DecodeIQ4_XS> {
  using type = DecodeIQ4_XSWide;
};

// A wide decoder's product: groups of 64 lanes when a row has at most 64
// units (a 4096-wide Q6_K row has 64 units of 64 values: 128 lanes would
// leave half idle), else the whole block. A grouped product's rows of at
// most 64 units take groups of 32 lanes (16 up to 16 units): an expert's
// down product (768 columns of Qwen3-30B-A3B: 24 Q4_K or 12 Q6_K wide
// units) left most of 64 lanes idle, and its gate/up (2048 columns, 64 Q4_K
// units) runs in one wave of blocks of 32 rows instead of 1.45 of 16 (on an
// H100, Qwen3-30B-A3B Q4_K_M: 32 sequences +23% and +7%, one +3% and +3%).
// (Whether a plain product of a wide decoder takes groups of 64 lanes: also
// matvec_pair_kernel's choice for each of its products.)
template <class Wide>
bool wide_takes_64_lanes(int cols) {
  return cols / Wide::kUnit <= 64;
}

template <class Wide, int kTokens>
void launch_wide(const Product& p) {
  constexpr int kRows = rows_for_few_tokens<Wide, kTokens>();
  const int units = p.cols / Wide::kUnit;
  if (p.grouping.items != nullptr && units <= 16) return launch_grouped<Wide, kTokens, kRows, 16>(p);
  if (p.grouping.items != nullptr && units <= 64) return launch_grouped<Wide, kTokens, kRows, 32>(p);
  if (wide_takes_64_lanes<Wide>(p.cols)) return launch<Wide, kTokens, kRows, 64>(p);
  launch<Wide, kTokens, kRows, kMatvecThreads>(p);
}

// One or two tokens of a decoder without a wide form: the whole block's
// lanes, or for a grouped product lane groups of half the rows' units, as
// launch_wide does: 32 lanes up to 64 units (an expert's down product: 768
// columns of Qwen3-30B-A3B are 48 Q8_0 units), 64 up to 128 (its gate/up,
// 2048 columns). Qwen3-30B-A3B Q8_0 on an H100 against 64 lanes up to 64
// units and 128 above: 8 sequences +5%, 32 +10%.
template <class Dec, int kTokens>
void launch_few_tokens(const Product& p) {
  constexpr int kRows = rows_for_few_tokens<Dec, kTokens>();
  const int units = p.cols / Dec::kUnit;
  if (p.grouping.items != nullptr && units <= 64) return launch_grouped<Dec, kTokens, kRows, 32>(p);
  if (p.grouping.items != nullptr && units <= 128) return launch_grouped<Dec, kTokens, kRows, 64>(p);
  launch<Dec, kTokens, kRows, kMatvecThreads>(p);
}

// The whole block (4 warps) shares its rows, every lane taking a few units
// of each: a lane has one or two rounds of loads, so the product takes about
// one memory latency plus its bytes over the bandwidth, instead of the
// rounds of one warp walking a whole row one latency at a time (a 4096-row
// matrix is a single wave on a large GPU, where nothing else hides those
// latencies; F16 4096x4096 went from 57% to 68% of the copy bandwidth on an
// H200).
template <class Dec>
void launch_for_tokens(const Product& p) {
  constexpr int kRows = rows_per_block<Dec>();
  constexpr int kLanes = kMatvecThreads;
  using Wide = typename WideDecoder<Dec>::type;
  if (p.n_tokens <= 2 && launch_streamed(p)) return;
  if constexpr (!std::is_same_v<Wide, Dec>) {
    if (p.n_tokens <= 1) return launch_wide<Wide, 1>(p);
    if (p.n_tokens <= 2) return launch_wide<Wide, 2>(p);
  } else {
    if (p.n_tokens <= 1) return launch_few_tokens<Dec, 1>(p);
    if (p.n_tokens <= 2) return launch_few_tokens<Dec, 2>(p);
  }
  if (p.n_tokens <= 4) return launch<Dec, 4, kRows, kLanes>(p);
  if (p.n_tokens <= 8) return launch<Dec, 8, kRows, kLanes>(p);
  constexpr int kRows16 = rows_for_16_tokens<Dec>();
  if constexpr (kRows16 == 0) {
    launch<Dec, 8, kRows, kLanes>(p.token_slice(0, 8));
    return launch<Dec, 8, kRows, kLanes>(p.token_slice(8, p.n_tokens - 8));
  } else {
    return launch<Dec, 16, kRows16, kLanes>(p);
  }
}

// matvec_pair_kernel with the lane groups each product's kernel takes alone
// (wide_takes_64_lanes).
template <class WideA, int kLanesA, class WideB, int kLanesB>
void launch_pair_with_lanes(const Product& a, const Product& b) {
  constexpr int kRowsA = rows_for_few_tokens<WideA, 1>();
  constexpr int kRowsB = rows_for_few_tokens<WideB, 1>();
  constexpr int kBlockRowsA = kMatvecThreads / kLanesA * kRowsA;
  constexpr int kBlockRowsB = kMatvecThreads / kLanesB * kRowsB;
  const int a_blocks = (a.rows + kBlockRowsA - 1) / kBlockRowsA;
  const int b_blocks = (b.rows + kBlockRowsB - 1) / kBlockRowsB;
  const PairedProduct pa{a.w, a.row_bytes, a.rows, a.cols, a.x, a.y, a.parts};
  const PairedProduct pb{b.w, b.row_bytes, b.rows, b.cols, b.x, b.y, b.parts};
  constexpr int kRoundA = units_per_round<WideA, 1, kRowsA>();
  constexpr int kRoundB = units_per_round<WideB, 1, kRowsB>();
  matvec_pair_kernel<WideA, kRowsA, kLanesA, kRoundA, WideB, kRowsB, kLanesB, kRoundB>
      <<<a_blocks + b_blocks, kMatvecThreads, 0, a.stream>>>(pa, pb, a_blocks);
  M40_CUDA_CHECK_LAUNCH();
}

template <class WideA, class WideB>
void launch_pair(const Product& a, const Product& b) {
  const bool narrow_a = wide_takes_64_lanes<WideA>(a.cols);
  const bool narrow_b = wide_takes_64_lanes<WideB>(b.cols);
  if (narrow_a && narrow_b) return launch_pair_with_lanes<WideA, 64, WideB, 64>(a, b);
  if (narrow_a) return launch_pair_with_lanes<WideA, 64, WideB, kMatvecThreads>(a, b);
  if (narrow_b) return launch_pair_with_lanes<WideA, kMatvecThreads, WideB, 64>(a, b);
  launch_pair_with_lanes<WideA, kMatvecThreads, WideB, kMatvecThreads>(a, b);
}

}  // namespace

bool launch_matvec_pair(const Product& a, const Product& b) {
  using gguf::TensorType;
  if (a.n_tokens != 1 || b.n_tokens != 1 || a.stream != b.stream) return false;
  if (a.type == TensorType::Q4_K && b.type == TensorType::Q6_K) {
    launch_pair<DecodeQ4_KWide, DecodeQ6_KWide>(a, b);
    return true;
  }
  return false;
}

bool launch_matvec_gated(const Product& p) {
  bool launched = false;
  visit_decoder(p.type, [&](auto tag) {
    using Wide = typename WideDecoder<typename decltype(tag)::type>::type;
    // The kernels launch_wide and launch_few_tokens pick for a plain product:
    // 64 or 128 lanes, rows_for_few_tokens rows.
    constexpr bool kGates = gatable<Wide>(1, rows_for_few_tokens<Wide, 1>(), 64, false) &&
                            gatable<Wide>(2, rows_for_few_tokens<Wide, 2>(), 64, false);
    if constexpr (kGates) {
      launch_for_tokens<typename decltype(tag)::type>(p);
      launched = true;
    }
  });
  return launched;
}

void launch_matvec_kernel(const Product& p) {
  visit_decoder(p.type, [&](auto tag) { launch_for_tokens<typename decltype(tag)::type>(p); });
}

void launch_matvec(const Product& p) {
  if (skinny_takes(p)) {  // in launches of up to kMaxSkinnyTokens
    for (int t = 0; t < p.n_tokens; t += kMaxSkinnyTokens) {
      launch_skinny(p.token_slice(t, std::min(kMaxSkinnyTokens, p.n_tokens - t)));
    }
    return;
  }
  visit_decoder(p.type, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    if (p.n_tokens <= kMaxMatvecKernelTokens) return launch_for_tokens<Dec>(p);
    if (!tiles_load_slowly(p.type)) return launch_gemm_decode(p);
    launch_for_tokens<Dec>(p.token_slice(0, kMaxMatvecKernelTokens));
    launch_for_tokens<Dec>(p.token_slice(kMaxMatvecKernelTokens, p.n_tokens - kMaxMatvecKernelTokens));
  });
}

}  // namespace m40::cuda::mm

// Decode products: y[t] = W x[t] for up to 8 tokens, every weight read once
// for the whole batch.
//
// A warp owns two consecutive rows (kRows; one for the generic decoders).
// Each lane walks the rows' units (8 or 16 consecutive values,
// matmul_decode.cuh) with a stride of 32 units, so the warp's loads of one row
// are contiguous; a lane keeps a pointer to the block it is in and steps it by
// a constant number of bytes. It decodes a unit of each of its rows into
// registers once and multiplies it with every token's x (two 16-byte loads per
// token and 8 values, from L1), so one x load serves both rows. acc holds
// kRows x kTokens sums per lane (split into 2 or 4 partial sums when there are
// fewer than 4, so that several FMA chains are in flight); the warp then
// reduces them with a transposing butterfly (each shuffle step halves the
// values a lane keeps) and each lane stores the sums it ends with.
//
// kTokens is n_tokens rounded up to a power of two; the extra tokens re-read
// the last token's x and are not stored. A lane issues the loads of 1, 2 or 4
// units (by the size of the decoder's registers) before it computes on them:
// an H200 needs some 3 MB in flight to approach its bandwidth, an M40 about
// 150 KB.
//
// Batches of 9 to 32 tokens are compute-bound on the M40 (32 FMAs per weight
// byte at F16) and keep more sums than registers allow here; they go to the
// gemm kernel with a single token tile (matmul_gemm.cu), which also reads
// every weight once.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/matmul_internal.cuh"

namespace m40::cuda::mm {

namespace {

constexpr int kMatvecThreads = 128;

// Sums N values over the lanes of a group (shuffle offsets O, O/2, .. 1;
// lanes = 2 O): each step sends half of the values a lane still holds to its
// partner and keeps the other half. Afterwards, with N >= lanes, lane `sub`
// holds the totals of elements sub * (N / lanes) + i in v[i]; with N < lanes,
// v[0] is the total of element sub / (lanes / N).
template <int N, int O>
__device__ __forceinline__ void reduce_lanes(float* v, int sub) {
  if constexpr (O >= 1) {
    if constexpr (N > 1) {
      constexpr int kHalf = N / 2;
      const bool upper = (sub & O) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, O);
      }
      reduce_lanes<kHalf, O / 2>(v, sub);
    } else {
      v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], O);
      reduce_lanes<1, O / 2>(v, sub);
    }
  }
}

// acc[split][t * kRows + r] += dot(values 8 * piece .. + 7 of the unit in
// row r, x[t] at the same columns). With kSplit > 1 the eight products go to
// kSplit independent sums, so that a lane has several FMA chains in flight
// when it has few tokens and rows.
template <class Dec, int piece, int kTokens, int kRows, int kSplit>
__device__ __forceinline__ void accumulate_piece(const typename Dec::Raw* raw, int unit, const float* __restrict__ x,
                                                 int cols, int col, int last_token,
                                                 float (&acc)[kSplit][kTokens * kRows]) {
  float w[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) Dec::template decode<piece>(raw[r], unit, w[r]);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    const float4* xp = reinterpret_cast<const float4*>(x + min(t, last_token) * cols + col + 8 * piece);
    const float4 a = __ldg(xp);
    const float4 b = __ldg(xp + 1);
    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
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

template <class Dec, int kTokens, int kRows, int kSplit>
__device__ __forceinline__ void accumulate_unit(const typename Dec::Raw* raw, int unit, const float* __restrict__ x,
                                                int cols, int col, int last_token,
                                                float (&acc)[kSplit][kTokens * kRows]) {
  accumulate_piece<Dec, 0, kTokens, kRows, kSplit>(raw, unit, x, cols, col, last_token, acc);
  if constexpr (Dec::kUnit == 16) {
    accumulate_piece<Dec, 1, kTokens, kRows, kSplit>(raw, unit, x, cols, col, last_token, acc);
  }
}

// Register cap (blocks of 128 threads: 6 blocks per SM cap a thread at 80
// registers, 4 at 128, 2 at 255). Uncapped, the compiler hoists the x loads of
// every token ahead of the math and takes registers that occupancy needs. The
// generic decoders and Q6_K get more, so that CUDA 11.8 for sm_52 does not
// spill. (CUDA 13 for sm_90 spills 4 bytes in the 8-token Q4_K and Q5_K
// kernels at 128; a cap of 168 avoids that but costs 20% there.)
template <class Dec>
constexpr int min_blocks_per_sm(int tokens) {
  if (kGenericDecoder<Dec>) return 2;
  if (tokens <= 4) return 6;
  return std::is_same_v<Dec, DecodeQ6_K> ? 2 : 4;
}

// Units a lane loads before it computes on them: enough bytes in flight per
// lane (a large GPU needs megabytes in flight to reach its bandwidth) within
// the register cap. The generic decoders load inside decode().
template <class Dec, int kTokens>
constexpr int units_per_round() {
  if (kGenericDecoder<Dec>) return 1;
  constexpr size_t kRaw = sizeof(typename Dec::Raw);
  if (kRaw <= 16) return 4;
  return kTokens <= 2 && kRaw <= 32 ? 2 : 1;
}

template <class Dec, int kTokens, int kRows, int kLanes, int kUnitsPerRound>
__global__ void __launch_bounds__(kMatvecThreads, min_blocks_per_sm<Dec>(kTokens))
    matvec_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int cols,
                  const float* __restrict__ x, int n_tokens, float* y, const float* residual) {
  static_assert(32 % kLanes == 0, "groups tile the warp");
  static_assert(kLanes % Dec::kUnitsPerBlock == 0, "a lane keeps its unit within the block");
  constexpr int kGroups = 32 / kLanes;
  constexpr int kSums = kTokens * kRows;
  constexpr int kSplit = kSums >= 4 ? 1 : 4 / kSums;
  // From one unit of a lane to its next: this many columns and bytes.
  constexpr int kColumnStep = kLanes * Dec::kUnit;
  constexpr int kByteStep = kLanes / Dec::kUnitsPerBlock * Dec::kBlockBytes;

  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int sub = lane % kLanes;
  const int warp = static_cast<int>((blockIdx.x * kMatvecThreads + threadIdx.x) >> 5);
  const int row0 = (warp * kGroups + lane / kLanes) * kRows;
  const int unit = sub % Dec::kUnitsPerBlock;  // the lane's unit within each block it visits
  // Groups past the last row compute on the last row (shuffles need the
  // whole warp) and store nothing.
  const uint8_t* block[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    block[r] = w + static_cast<size_t>(min(row0 + r, rows - 1)) * row_bytes +
               static_cast<size_t>(sub / Dec::kUnitsPerBlock) * Dec::kBlockBytes;
  }

  const int last_token = n_tokens - 1;
  float acc[kSplit][kSums];
#pragma unroll
  for (int s = 0; s < kSplit; ++s) {
#pragma unroll
    for (int i = 0; i < kSums; ++i) acc[s][i] = 0.0f;
  }

  // Each round loads kUnitsPerRound units of every row, then computes on
  // them; a unit past the row's end loads the round's first unit instead (an
  // L1 hit) and is skipped.
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
        accumulate_unit<Dec, kTokens, kRows, kSplit>(raw[u], unit, x, cols, col + u * kColumnStep, last_token, acc);
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
  reduce_lanes<kSums, kLanes / 2>(acc[0], sub);

  auto store = [&](int element, float sum) {
    const int t = element / kRows;
    const int row = row0 + element % kRows;
    if (t < n_tokens && row < rows) {
      const size_t index = static_cast<size_t>(t) * static_cast<size_t>(rows) + static_cast<size_t>(row);
      y[index] = residual != nullptr ? residual[index] + sum : sum;
    }
  };
  if constexpr (kSums >= kLanes) {
    constexpr int kPerLane = kSums / kLanes;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) store(sub * kPerLane + i, acc[0][i]);
  } else {
    constexpr int kShare = kLanes / kSums;
    if (sub % kShare == 0) store(sub / kShare, acc[0][0]);
  }
}

template <class Dec, int kTokens, int kRows, int kLanes>
void launch(const Product& p) {
  constexpr int kRowsPerBlock = kMatvecThreads / kLanes * kRows;
  const int blocks = (p.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  matvec_kernel<Dec, kTokens, kRows, kLanes, units_per_round<Dec, kTokens>()><<<blocks, kMatvecThreads, 0, p.stream>>>(
      p.w, p.row_bytes, p.rows, p.cols, p.x, p.n_tokens, p.y, p.residual);
  M40_CUDA_CHECK_LAUNCH();
}

// A warp per two rows keeps enough warps in flight for a 4096-row matrix on a
// large GPU while each x load serves two rows. The generic decoders need the
// registers of a second row for themselves.
template <class Dec>
void launch_for_tokens(const Product& p) {
  constexpr int kRows = kGenericDecoder<Dec> ? 1 : 2;
  if (p.n_tokens <= 1) return launch<Dec, 1, kRows, 32>(p);
  if (p.n_tokens <= 2) return launch<Dec, 2, kRows, 32>(p);
  if (p.n_tokens <= 4) return launch<Dec, 4, kRows, 32>(p);
  return launch<Dec, 8, kRows, 32>(p);
}

}  // namespace

void launch_matvec(const Product& p) {
  if (p.n_tokens > kMaxMatvecKernelTokens) return launch_gemm_decode(p);
  visit_decoder(p.type, [&](auto tag) { launch_for_tokens<typename decltype(tag)::type>(p); });
}

}  // namespace m40::cuda::mm

// Decode products of a few tokens (3 to 8 a launch) for Q4_K: eight rows a
// lane, so that every x value a lane loads feeds eight rows' FMAs.
//
// Why a kernel of its own: at 8 tokens every weight feeds 8 FMAs and the
// products are bound by instructions and loads, not by the weights' bytes.
// In the matvec kernel (matmul_matvec.cu) a block of 128 lanes shares 4
// rows and each lane loads x for its own columns: one x value loaded per 4
// FMAs, the L1 pipe's ceiling (a warp-wide 16-byte load costs about one
// wavefront per float, and an SM serves one wavefront for every four FMA
// instructions), and each lane decodes the scales of its unit for every row.
//
// Here a block of 4 warps owns 32 rows and walks K one Q4_K block (256
// columns) a step; each warp owns 8 of the rows. Lane l takes quant bytes
// 4l..4l+3 of each row's block, that is columns 64g + 4j .. + 3 (low
// nibbles, sub-block 2g) and 64g + 32 + 4j .. + 3 (high nibbles, sub-block
// 2g + 1) for g = l / 8, j = l % 8, loads x at those columns (two float4 a
// token) once a step and uses each value for 8 rows. The block stages the
// next step's quants and its sub-blocks' decoded factors in shared memory
// (StageBuffer below), so a lane spends 12 instructions on 4 values of a row
// (two shared loads, nibble mask, 4 byte permutes, 4 FMAs) besides the
// 4 x kTokens FMAs with x.
//
// Values: the quant q as the float 1/2 + q / 256 (one byte permute,
// matmul_decode_bits.cuh), then w = fma(256 scale, that, -(128 scale +
// offset)): two instructions a value instead of the exact form's three; the
// rounding of the folded offset is 2^-17 of a quantization step.
//
// Each lane's 8 x kTokens sums are reduced over the warp by the transposing
// butterfly. Where the row tiles alone leave SMs idle, K is split over
// blocks (grid.y) that write partial sums, added in split order by
// launch_splitk_reduce (the same result every run).
//
// On an H100 (bench_cuda_matmul --skinny, in a graph) against the matvec
// kernel at 8 tokens: 4096x4096 20.6 -> 17.6 us, 11008x4096 49.0 -> 36.5,
// 4096x11008 49.9 -> 38.9 (31% of the FMA peak); 16 tokens as two launches
// 90.9 -> 70.4 at 11008x4096. At 32 tokens the decode tile (matmul_gemm.cu)
// stays faster (52 against 65 us at 4096x4096).
#include <algorithm>
#include <cstddef>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/matmul_internal.cuh"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/warp_reduce.cuh"
#include "common/error.h"

namespace m40::cuda::mm {

namespace {

constexpr int kSkinnyThreads = 128;
constexpr int kRowsPerWarp = 8;
constexpr int kSkinnyRows = kSkinnyThreads / 32 * kRowsPerWarp;  // rows a block
// Blocks an SM keeps resident (the launch bounds: 170 registers a thread).
constexpr int kSkinnyBlocksPerSm = 3;

using quant::BlockQ4_K;

// A block stages its rows' Q4_K blocks of the next K step in shared memory,
// double-buffered (one barrier a step): the quants as they are (coalesced
// 16-byte loads), and each sub-block's scale and offset already in the form
// the values need ({256 scale, 128 scale + offset}), decoded once by the
// thread that loads the header instead of by every lane for every row. The
// next step's loads wait in 12 registers; a lane then reads a row's two
// factors (a broadcast among the 8 lanes of its g) and its 4 quant bytes
// (32 consecutive words a warp).
constexpr int kQuantPieces = kSkinnyRows * sizeof(BlockQ4_K::qs) / 16;  // 16-byte pieces a step: 256
constexpr int kQuantLoads = kQuantPieces / kSkinnyThreads;              // 2 a thread
static_assert(kSkinnyRows * 4 == kSkinnyThreads, "a thread decodes one pair of sub-blocks of one row a step");

struct StageBuffer {
  uint4 quants[kSkinnyRows][sizeof(BlockQ4_K::qs) / 16];
  float4 factors[kSkinnyRows][4];  // pair g: {256 scale, bias} of sub-blocks 2g and 2g + 1
};

// The 6-bit scales (bytes 0 and 1 of .x) and offsets (of .y) of sub-blocks
// 2g and 2g + 1, from header words 1..3 (scales[0..11]); as
// quant::k_quant_scale_min, two sub-blocks at once in the bytes of a word.
// (The decoders' k_unit_scale, once for each sub-block, made the whole
// kernel 2-4% slower on an H100: its branch on the sub-block runs both ways
// in a warp whose lanes hold different pairs.)
__device__ __forceinline__ uint2 q4k_pair_scales(const uint4& header, int g) {
  const uint32_t shift = 16u * static_cast<uint32_t>(g & 1);
  const uint32_t a = header.y >> shift, b = header.z >> shift, c = header.w >> shift;
  if (g < 2) return make_uint2(a & 0x3F3Fu, b & 0x3F3Fu);
  return make_uint2((c & 0x0F0Fu) | ((a >> 2) & 0x3030u), ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u));
}

// value = scale * q - offset = 256 scale * (1/2 + q / 256) - (128 scale +
// offset): the factors of sub-blocks 2g and 2g + 1.
__device__ __forceinline__ float4 q4k_pair_factors(const uint4& header, int g) {
  const uint2 bytes = q4k_pair_scales(header, g);
  const float d = widen_half(header.x), dmin = widen_half(header.x >> 16);
  const float scale_lo = d * (magic_byte<0>(bytes.x) - kTwo23), scale_hi = d * (magic_byte<1>(bytes.x) - kTwo23);
  const float offset_lo = dmin * (magic_byte<0>(bytes.y) - kTwo23), offset_hi = dmin * (magic_byte<1>(bytes.y) - kTwo23);
  return make_float4(256.0f * scale_lo, fmaf(128.0f, scale_lo, offset_lo), 256.0f * scale_hi,
                     fmaf(128.0f, scale_hi, offset_hi));
}

struct Stage {
  uint4 quants[kQuantLoads];
  uint4 header;

  // Issues the loads of K step b (Q4_K block b of each row of the tile).
  __device__ void fetch(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int row_tile, int b) {
    const size_t block_offset = static_cast<size_t>(b) * sizeof(BlockQ4_K);
#pragma unroll
    for (int i = 0; i < kQuantLoads; ++i) {
      const int piece = static_cast<int>(threadIdx.x) + i * kSkinnyThreads;
      const int row = min(row_tile + piece / 8, rows - 1);
      quants[i] = load_16(w + static_cast<size_t>(row) * row_bytes + block_offset + offsetof(BlockQ4_K, qs) +
                          16 * (piece % 8));
    }
    const int row = min(row_tile + static_cast<int>(threadIdx.x) / 4, rows - 1);
    header = load_16(w + static_cast<size_t>(row) * row_bytes + block_offset);
  }
  __device__ void store(StageBuffer& buffer) const {
#pragma unroll
    for (int i = 0; i < kQuantLoads; ++i) {
      const int piece = static_cast<int>(threadIdx.x) + i * kSkinnyThreads;
      buffer.quants[piece / 8][piece % 8] = quants[i];
    }
    const int pair = static_cast<int>(threadIdx.x) % 4;
    buffer.factors[threadIdx.x / 4][pair] = q4k_pair_factors(header, pair);
  }
};

// The four values of nibble bytes `quants` from their sub-block's factors.
__device__ __forceinline__ void q4k_values(uint32_t quants, float2 factors, float* w) {
  float fraction[4];
  bytes_to_fractions(quants, fraction);
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = fmaf(factors.x, fraction[i], -factors.y);
}

// acc[t * kRowsPerWarp + r] += the lane's part of row r . x[t] over blocks
// [first, end) of the row; then the warp's sums.
template <int kTokens>
__global__ void __launch_bounds__(kSkinnyThreads, kSkinnyBlocksPerSm)
    skinny_q4k_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int cols,
                      const float* __restrict__ x, int n_tokens, float* y, const float* residual, OutputParts parts,
                      float* partial) {
  constexpr int kSums = kTokens * kRowsPerWarp;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int row_tile = static_cast<int>(blockIdx.x) * kSkinnyRows;
  const int row0 = row_tile + warp * kRowsPerWarp;  // the warp's rows
  const int g = lane / 8;
  const int col_low = 64 * g + 4 * (lane % 8);  // the lane's low-nibble columns in a block; high: + 32

  const int blocks_per_row = cols / BlockQ4_K::kValues;
  const int split = static_cast<int>(blockIdx.y);
  const int splits = static_cast<int>(gridDim.y);
  const int first = blocks_per_row * split / splits;
  const int end = blocks_per_row * (split + 1) / splits;

  const float* x_lane = x + static_cast<size_t>(first) * BlockQ4_K::kValues + col_low;
  const size_t x_stride = static_cast<size_t>(cols);
  const int last_token = n_tokens - 1;

  float acc[kSums];
#pragma unroll
  for (int i = 0; i < kSums; ++i) acc[i] = 0.0f;

  // Rows past the last are staged from the last row and store nothing.
  __shared__ StageBuffer stage[2];
  Stage next;
  if (first < end) {
    next.fetch(w, row_bytes, rows, row_tile, first);
    next.store(stage[0]);
  }
  __syncthreads();

#pragma unroll 1
  for (int b = first; b < end; ++b) {
    const int buffer = (b - first) & 1;
    if (b + 1 < end) next.fetch(w, row_bytes, rows, row_tile, b + 1);
    const StageBuffer& staged = stage[buffer];
    const float* x_block = x_lane + (b - first) * BlockQ4_K::kValues;
    // Low nibbles (sub-block 2g), then high nibbles (2g + 1): half of x in
    // registers at a time (a loop the compiler may not unroll: unrolled, it
    // hoists the second half's x loads and spills).
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      float4 xv[kTokens];
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        xv[t] = __ldg(reinterpret_cast<const float4*>(x_block + static_cast<size_t>(min(t, last_token)) * x_stride +
                                                      32 * half));
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int row = warp * kRowsPerWarp + r;
        const float2 factors = reinterpret_cast<const float2*>(&staged.factors[row][g])[half];
        const uint32_t quants = reinterpret_cast<const uint32_t*>(staged.quants[row])[lane];
        float wv[4];
        q4k_values((quants >> (4 * half)) & 0x0F0F0F0Fu, factors, wv);
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          float& s = acc[t * kRowsPerWarp + r];
          s = fmaf(wv[0], xv[t].x, s);
          s = fmaf(wv[1], xv[t].y, s);
          s = fmaf(wv[2], xv[t].z, s);
          s = fmaf(wv[3], xv[t].w, s);
        }
      }
    }
    if (b + 1 < end) next.store(stage[buffer ^ 1]);
    __syncthreads();
  }

  reduce_lanes_transposing<kSums, 16>(acc, lane);
  constexpr int kPerLane = kSums >= 32 ? kSums / 32 : 1;
  constexpr int kShare = kSums >= 32 ? 1 : 32 / kSums;
  if (lane % kShare != 0) return;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int element = lane / kShare * kPerLane + i;
    const int t = element / kRowsPerWarp;
    const int row = row0 + element % kRowsPerWarp;
    if (partial != nullptr) {
      if (t < n_tokens && row < rows) {
        partial[(static_cast<size_t>(split) * static_cast<size_t>(n_tokens) + static_cast<size_t>(t)) *
                    static_cast<size_t>(rows) +
                static_cast<size_t>(row)] = acc[i];
      }
    } else {
      store_product_sum(parts, y, residual, rows, n_tokens, row, t, acc[i]);
    }
  }
}

// K splits: enough blocks for the resident ones of every SM (rounded to the
// nearest whole number of row-tile sets), each split at least 2 Q4_K blocks
// of K; none without a stream-ordered pool for the partial sums.
int skinny_splits(const Product& p) {
  const int row_tiles = (p.rows + kSkinnyRows - 1) / kSkinnyRows;
  const int resident = kSkinnyBlocksPerSm * current_multiprocessor_count();
  const int wanted = (resident + row_tiles / 2) / row_tiles;
  const int splits = std::min({wanted, 16, p.cols / BlockQ4_K::kValues / 2});
  if (splits <= 1 || !scratch_pool_ready(p.stream)) return 1;
  return splits;
}

template <int kTokens>
void launch_skinny_tokens(const Product& p) {
  const int splits = skinny_splits(p);
  const dim3 grid((p.rows + kSkinnyRows - 1) / kSkinnyRows, splits);
  if (splits == 1) {
    skinny_q4k_kernel<kTokens><<<grid, kSkinnyThreads, 0, p.stream>>>(p.w, p.row_bytes, p.rows, p.cols, p.x,
                                                                      p.n_tokens, p.y, p.residual, p.parts, nullptr);
    M40_CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t count = static_cast<size_t>(p.n_tokens) * static_cast<size_t>(p.rows);
  StreamScratch scratch(static_cast<size_t>(splits) * count * sizeof(float), p.stream);
  skinny_q4k_kernel<kTokens><<<grid, kSkinnyThreads, 0, p.stream>>>(p.w, p.row_bytes, p.rows, p.cols, p.x, p.n_tokens,
                                                                    p.y, p.residual, p.parts, scratch.floats());
  M40_CUDA_CHECK_LAUNCH();
  launch_splitk_reduce(p, scratch.floats(), splits);
}

}  // namespace

bool skinny_takes(const Product& p) {
  return p.type == gguf::TensorType::Q4_K && p.grouping.items == nullptr && p.n_tokens >= kMinSkinnyTokens &&
         p.n_tokens <= kMaxSkinnyProductTokens;
}

void launch_skinny(const Product& p) {
  // (One or two tokens arrive as the rest of a product of 9 or 10.)
  if (p.type != gguf::TensorType::Q4_K || p.grouping.items != nullptr || p.n_tokens < 1 ||
      p.n_tokens > kMaxSkinnyTokens) {
    throw Error("the skinny kernel takes plain Q4_K products of 1 to " + std::to_string(kMaxSkinnyTokens) + " tokens");
  }
  if (p.n_tokens <= 4) return launch_skinny_tokens<4>(p);
  launch_skinny_tokens<8>(p);
}

}  // namespace m40::cuda::mm

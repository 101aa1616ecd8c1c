// Tiled FP32 GEMM that dequantizes W on the fly: prefill products (any
// number of tokens), and decode batches of 17 to 32 tokens (but Q8_0, Q4_0
// and IQ4_NL: matmul_matvec.cu).
//
// A block computes a tile of rows x tokens, walking K in steps of kTileK
// columns (32 for prefill, 16 for the decode tiles). Per step each thread
// decodes 16 consecutive weights of one row (one or two decoder units,
// matmul_decode.cuh) and loads a few float4s of one token's x (one float2 in
// the 16-token decode tile), and stores both K-major into shared memory
// (w_tile[k][row], x_tile[k][token]; consecutive lanes write consecutive
// words). Each thread then accumulates a register tile: per k, float4 loads
// of 4 or 8 rows (a broadcast within the warp) and of 4 or 8 tokens feed 16,
// 32 or 64 FMAs. The next
// step's global loads are issued before the current step's math, so they
// overlap it. Shapes (TileShape below): prefill 128 rows x 128 tokens with
// an 8 x 8 register tile (128 x 64 with 8 x 4 where those would make ragged
// waves); decode 128 rows x 16 or 32 tokens with 4 x 4 or 8 x 4 register
// tiles and K steps of 16, so that one token tile covers the batch
// and every weight is read once, with K split over several blocks where the
// row tiles alone do not fill the GPU.
//
// Rows and tokens past the edges are clamped for loading and not stored.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/matmul_internal.cuh"
#include "backends/cuda/prefill_plan.h"
#include "backends/cuda/stream_scratch.h"
#include "common/error.h"

namespace m40::cuda::mm {

namespace {

// The tile shapes. Each thread decodes 16 weights and loads kXPerThread x
// values per K step, and accumulates kRowChunks x 4 rows by kTokenChunks x
// kTokensPerThread tokens; rows of chunk c are c * kTileRows / kRowChunks +
// 4 * ty + i (tokens likewise with tx), so that the float4 loads of a warp
// read contiguous shared memory.
template <int TileRows, int TileTokens, int TileK, int Threads, int RowChunks, int TokensPerThread,
          int TokenChunks = 1>
struct TileShape {
  static constexpr int kTileRows = TileRows;
  static constexpr int kTileTokens = TileTokens;
  static constexpr int kTileK = TileK;
  static constexpr int kThreads = Threads;
  static constexpr int kRowChunks = RowChunks;
  static constexpr int kTokensPerThread = TokensPerThread;  // per token chunk
  static constexpr int kTokenChunks = TokenChunks;
  static constexpr int kRowGroups = kTileRows / (4 * kRowChunks);
  static constexpr int kTokenGroups = kTileTokens / (kTokensPerThread * kTokenChunks);
  static constexpr int kXPerThread = kTileTokens * kTileK / kThreads;
  static_assert(kTileRows * kTileK / 16 == kThreads, "each thread decodes 16 weights a step");
  static_assert(kRowGroups * kTokenGroups == kThreads, "the register tiles cover the block tile");
  static_assert(kThreads % kTileTokens == 0 && (kXPerThread % 4 == 0 || kXPerThread == 2),
                "x loads are whole float4s (or one float2)");
  static_assert(kTokensPerThread == 4, "x fragments are a float4");
};

// Prefill: 128 rows x 128 tokens with an 8 x 8 register tile per thread,
// four shared float4 loads per 64 FMAs, one block of 256 threads per SM (255
// registers: the tile, the next step's loads, no spills). Against the
// 128 x 64 tile with 8 x 4 (three loads per 32 FMAs, two blocks per SM), an
// H200 runs 512-token products 10-24% faster (F16 11008x4096 1.55 -> 1.32
// ms, Q8_0 1.93 -> 1.56, Q4_K 1.61 -> 1.38; docs/benchmarks.md). Products
// whose 128 x 128 tiles would not fill the GPU keep the 128 x 64 tile, and
// either tile is split over K where its waves are short or ragged
// (plan_prefill, prefill_plan.h).
using PrefillShape = TileShape<128, 128, 32, 256, 2, 4, 2>;
using ShortPrefillShape = TileShape<128, 64, 32, 256, 2, 4>;
static_assert(ShortPrefillShape::kTileTokens == kGroupedGemmTileTokens && kGroupedGemmTileTokens == kMaxExpertGemmTokens,
              "a grouped product's item fits one token tile");
// Decode batches of up to 16 (launch_matvec sends those to the matvec kernel;
// the bench still times this tile) and 17..32 tokens: one token tile covers
// the batch (every weight is read once). A thread's 4 x 4 or 8 x 4 register
// tile takes
// two or three shared loads per 16 or 32 FMAs; the 32-row tiles with 4 x 1
// and 4 x 2 that came before were bound by those loads (ncu: L1/shared pipe
// 92% busy) and took 1.3-1.65x longer on an H200 (bench_cuda_matmul
// --choice, docs/cuda-kernels.md). K steps of 16 keep one step's tiles
// small; the split over K (decode_splits) supplies the blocks.
using Decode16Shape = TileShape<128, 16, 16, 128, 1, 4>;
using Decode32Shape = TileShape<128, 32, 16, 128, 2, 4>;

template <class Dec>
struct WeightLoader {
  static constexpr int kUnits = 16 / Dec::kUnit;  // units a thread decodes per step
  typename Dec::Raw raw[kUnits];

  __device__ void fetch(const uint8_t* row, int unit0) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int unit = unit0 + u;
      raw[u] = Dec::load(row + (unit / Dec::kUnitsPerBlock) * Dec::kBlockBytes, unit % Dec::kUnitsPerBlock);
    }
  }

  // Decodes the fetched units into tile[k0 + j * stride], j < 16.
  __device__ void stash(int unit0, float* tile, int stride) const {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      float v[8];
      const int unit = (unit0 + u) % Dec::kUnitsPerBlock;
      Dec::template decode<0>(raw[u], unit, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) tile[(Dec::kUnit * u + j) * stride] = v[j];
      if constexpr (Dec::kUnit == 16) {
        Dec::template decode<1>(raw[u], unit, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) tile[(Dec::kUnit * u + 8 + j) * stride] = v[j];
      }
    }
  }
};

template <int kCount>
struct Floats;
template <>
struct Floats<4> {
  __device__ static void load(const float* p, float* v) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  }
};

// Register caps: the 8 x 8 prefill tile needs a whole SM's registers for one
// block (two blocks spilled on sm_90 and were 5-15% slower); the 8 x 4
// prefill tile two blocks; the decode tiles three or four.
template <class Dec, class Shape>
constexpr int min_gemm_blocks_per_sm() {
  if (Shape::kThreads == 256) return Shape::kTokenChunks == 2 ? 1 : 2;
  return 4;
}

// plan_prefill (prefill_plan.h) plans with these shapes.
template <class Shape>
constexpr bool matches(const PrefillTile& tile) {
  return Shape::kTileRows == tile.rows && Shape::kTileTokens == tile.tokens && Shape::kTileK == tile.k_step &&
         min_gemm_blocks_per_sm<DecodeF32, Shape>() == tile.blocks_per_sm;
}
static_assert(matches<PrefillShape>(kWidePrefillTile) && matches<ShortPrefillShape>(kShortPrefillTile),
              "prefill_plan.h describes the prefill tiles");

template <class Dec, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, min_gemm_blocks_per_sm<Dec, Shape>())
    gemm_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int cols, const float* __restrict__ x,
                int n_tokens, float* y, const float* residual, float* partial, ExpertGrouping grouping) {
  constexpr int kTileRows = Shape::kTileRows;
  constexpr int kTileTokens = Shape::kTileTokens;
  constexpr int kTileK = Shape::kTileK;
  constexpr int kXPerThread = Shape::kXPerThread;
  constexpr int kRowsPerThread = 4 * Shape::kRowChunks;
  constexpr int kTokensPerChunk = Shape::kTokensPerThread;
  constexpr int kTokensPerThread = kTokensPerChunk * Shape::kTokenChunks;
  __shared__ __align__(16) float w_tile[kTileK][kTileRows];
  __shared__ __align__(16) float x_tile[kTileK][kTileTokens];

  // A grouped product: blockIdx.y is the work item (at most one token tile).
  M40_SELECT_EXPERT_ITEM(grouping, static_cast<int>(blockIdx.y), w, x, cols, y, rows, n_tokens);
  const int tid = static_cast<int>(threadIdx.x);
  const int row_base = static_cast<int>(blockIdx.x) * kTileRows;
  const int token_base = grouping.items != nullptr ? 0 : static_cast<int>(blockIdx.y) * kTileTokens;

  // Loading: W values 16 * load_part .. + 15 of row load_row, x values
  // kXPerThread * x_part .. of token load_token, of each K step.
  const int load_row = tid % kTileRows;
  const int load_part = tid / kTileRows;
  const int load_token = tid % kTileTokens;
  const int x_part = tid / kTileTokens;
  const uint8_t* w_row = w + static_cast<size_t>(min(row_base + load_row, rows - 1)) * row_bytes;
  const float* x_row =
      x + static_cast<size_t>(min(token_base + load_token, n_tokens - 1)) * static_cast<size_t>(cols) +
      kXPerThread * x_part;
  using Loader = WeightLoader<Dec>;
  constexpr int kUnitsPerStep = kTileK / Dec::kUnit;
  const int unit_in_step = 16 * load_part / Dec::kUnit;

  const int ty = tid / Shape::kTokenGroups;
  const int tx = tid % Shape::kTokenGroups;
  float acc[kRowsPerThread][kTokensPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
    for (int j = 0; j < kTokensPerThread; ++j) acc[i][j] = 0.0f;
  }

  // Split K (gridDim.z > 1): this block adds up steps [first_step,
  // end_step) of K and writes its partial sums; splitk_reduce_kernel adds
  // the parts.
  const int all_steps = cols / kTileK;
  const int split = static_cast<int>(blockIdx.z);
  const int splits = static_cast<int>(gridDim.z);
  const int first_step = all_steps * split / splits;
  const int end_step = all_steps * (split + 1) / splits;

  Loader loader;
  // x arrives in float4s (a float2 when a thread loads only two values).
  using XVec = std::conditional_t<kXPerThread == 2, float2, float4>;
  constexpr int kXVecs = kXPerThread == 2 ? 1 : kXPerThread / 4;
  constexpr int kXWidth = kXPerThread == 2 ? 2 : 4;
  XVec xv[kXVecs];
  loader.fetch(w_row, first_step * kUnitsPerStep + unit_in_step);
#pragma unroll
  for (int i = 0; i < kXVecs; ++i) xv[i] = __ldg(reinterpret_cast<const XVec*>(x_row + first_step * kTileK) + i);

  const int steps = end_step;
  for (int step = first_step; step < steps; ++step) {
    loader.stash(step * kUnitsPerStep + unit_in_step, &w_tile[16 * load_part][load_row], kTileRows);
#pragma unroll
    for (int i = 0; i < kXVecs; ++i) {
      float* xt = &x_tile[kXPerThread * x_part + kXWidth * i][load_token];
      xt[0 * kTileTokens] = xv[i].x;
      xt[1 * kTileTokens] = xv[i].y;
      if constexpr (kXWidth == 4) {
        xt[2 * kTileTokens] = xv[i].z;
        xt[3 * kTileTokens] = xv[i].w;
      }
    }
    __syncthreads();

    if (step + 1 < steps) {
      loader.fetch(w_row, (step + 1) * kUnitsPerStep + unit_in_step);
      const XVec* xp = reinterpret_cast<const XVec*>(x_row + (step + 1) * kTileK);
#pragma unroll
      for (int i = 0; i < kXVecs; ++i) xv[i] = __ldg(xp + i);
    }

#pragma unroll
    for (int k = 0; k < kTileK; ++k) {
      float wr[kRowsPerThread];
#pragma unroll
      for (int c = 0; c < Shape::kRowChunks; ++c) {
        Floats<4>::load(&w_tile[k][c * (kTileRows / Shape::kRowChunks) + 4 * ty], wr + 4 * c);
      }
      float xr[kTokensPerThread];
#pragma unroll
      for (int c = 0; c < Shape::kTokenChunks; ++c) {
        Floats<kTokensPerChunk>::load(&x_tile[k][c * (kTileTokens / Shape::kTokenChunks) + kTokensPerChunk * tx],
                                      xr + kTokensPerChunk * c);
      }
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
        for (int j = 0; j < kTokensPerThread; ++j) acc[i][j] = fmaf(wr[i], xr[j], acc[i][j]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int row = row_base + (i / 4) * (kTileRows / Shape::kRowChunks) + 4 * ty + i % 4;
#pragma unroll
    for (int j = 0; j < kTokensPerThread; ++j) {
      const int token = token_base + (j / kTokensPerChunk) * (kTileTokens / Shape::kTokenChunks) +
                        kTokensPerChunk * tx + j % kTokensPerChunk;
      if (row < rows && token < n_tokens) {
        const size_t index = static_cast<size_t>(token) * static_cast<size_t>(rows) + static_cast<size_t>(row);
        if (partial != nullptr) {
          partial[static_cast<size_t>(split) * static_cast<size_t>(n_tokens) * static_cast<size_t>(rows) + index] =
              acc[i][j];
        } else {
          y[index] = residual != nullptr ? residual[index] + acc[i][j] : acc[i][j];
        }
      }
    }
  }
}

// splits: parts of K, each its own blocks (1: no split).
template <class Dec, class Shape>
void launch_shape(const Product& p, int splits = 1) {
  const bool grouped = p.grouping.items != nullptr;
  const dim3 grid((p.rows + Shape::kTileRows - 1) / Shape::kTileRows,
                  grouped ? p.grouping.n_items : (p.n_tokens + Shape::kTileTokens - 1) / Shape::kTileTokens, splits);
  if (splits == 1) {
    gemm_kernel<Dec, Shape><<<grid, Shape::kThreads, 0, p.stream>>>(p.w, p.row_bytes, p.rows, p.cols, p.x,
                                                                    p.n_tokens, p.y, p.residual, nullptr, p.grouping);
    M40_CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t count = static_cast<size_t>(p.n_tokens) * static_cast<size_t>(p.rows);
  StreamScratch scratch(static_cast<size_t>(splits) * count * sizeof(float), p.stream);
  gemm_kernel<Dec, Shape><<<grid, Shape::kThreads, 0, p.stream>>>(p.w, p.row_bytes, p.rows, p.cols, p.x, p.n_tokens,
                                                                  p.y, p.residual, scratch.floats(), p.grouping);
  M40_CUDA_CHECK_LAUNCH();
  launch_splitk_reduce(p, scratch.floats(), splits);
}

// K splits for a decode-tile product: enough blocks for four per SM (a
// 4096-row matrix makes 32 tiles of 128 rows: an M40's 24 SMs get three
// splits, an H200's 132 sixteen), at most 16 and at least 4 K steps each;
// none where the device has no stream-ordered pool for the partial sums.
// (Two blocks per SM and at most 8 splits measured 3-8% slower on an H200.)
template <class Shape>
int decode_splits(const Product& p) {
  const int tiles = (p.rows + Shape::kTileRows - 1) / Shape::kTileRows *
                    ((p.n_tokens + Shape::kTileTokens - 1) / Shape::kTileTokens);
  const int wanted = (4 * current_multiprocessor_count() + tiles - 1) / tiles;
  const int splits = std::min({wanted, 16, p.cols / Shape::kTileK / 4});
  if (splits <= 1 || !scratch_pool_ready(p.stream)) return 1;
  return splits;
}

// The splits' partial sums added in split order (the same result every
// run), stored as the product's kernel would (store_product_sum: y plus the
// residual, or the fused parts).
// (count < 2^32, checked by the launcher: 32-bit division.)
__global__ void splitk_reduce_kernel(const float* __restrict__ partial, int splits, int rows, int n_tokens, float* y,
                                     const float* residual, OutputParts parts) {
  const uint32_t count = static_cast<uint32_t>(rows) * static_cast<uint32_t>(n_tokens);
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    float sum = partial[i];
    for (int s = 1; s < splits; ++s) sum += partial[static_cast<size_t>(s) * count + i];
    store_product_sum(parts, y, residual, rows, n_tokens, static_cast<int>(i % static_cast<uint32_t>(rows)),
                      static_cast<int>(i / static_cast<uint32_t>(rows)), sum);
  }
}

}  // namespace

void launch_splitk_reduce(const Product& p, const float* partial, int splits) {
  const size_t count = static_cast<size_t>(p.n_tokens) * static_cast<size_t>(p.rows);
  if (count > UINT32_MAX) throw Error("split-K product of " + std::to_string(count) + " outputs (at most 2^32 - 1)");
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((count + threads - 1) / threads, 4096));
  splitk_reduce_kernel<<<blocks, threads, 0, p.stream>>>(partial, splits, p.rows, p.n_tokens, p.y, p.residual,
                                                         p.parts);
  M40_CUDA_CHECK_LAUNCH();
}

void launch_gemm(const Product& p) {
  visit_decoder(p.type, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    const PrefillPlan plan = plan_prefill(p.rows, p.cols, p.n_tokens, current_multiprocessor_count(),
                                          scratch_pool_ready(p.stream));
    if (plan.wide) return launch_shape<Dec, PrefillShape>(p, plan.splits);
    launch_shape<Dec, ShortPrefillShape>(p, plan.splits);
  });
}

void launch_gemm_grouped(const Product& p) {
  // The smallest tile that holds an item (expert_item_tokens, moe.h).
  visit_decoder(p.type, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    if (p.n_tokens <= Decode16Shape::kTileTokens) return launch_shape<Dec, Decode16Shape>(p);
    if (p.n_tokens <= Decode32Shape::kTileTokens) return launch_shape<Dec, Decode32Shape>(p);
    launch_shape<Dec, ShortPrefillShape>(p);
  });
}

void launch_gemm_decode(const Product& p) {
  visit_decoder(p.type, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    if (p.n_tokens <= Decode16Shape::kTileTokens) {
      launch_shape<Dec, Decode16Shape>(p, decode_splits<Decode16Shape>(p));
    } else {
      launch_shape<Dec, Decode32Shape>(p, decode_splits<Decode32Shape>(p));
    }
  });
}

}  // namespace m40::cuda::mm

// How the prefill gemm (matmul_gemm.cu) covers a product: which of its two
// tiles, and into how many parts K is split. Host code only, so that the
// choice is tested without a GPU (tests/backends/cuda/test_matmul.cpp).
#pragma once

namespace m40::cuda::mm {

// A prefill tile's shape and how many of its blocks an SM holds (the
// kernel's register cap); matmul_gemm.cu checks its shapes against these.
struct PrefillTile {
  int rows;
  int tokens;
  int k_step;
  int blocks_per_sm;
};
inline constexpr PrefillTile kWidePrefillTile{128, 128, 32, 1};
inline constexpr PrefillTile kShortPrefillTile{128, 64, 32, 2};

struct PrefillPlan {
  bool wide = false;  // kWidePrefillTile, else kShortPrefillTile
  int splits = 1;     // parts of K, each its own blocks (1: no split)
};

// The plan for rows x cols times n_tokens on a GPU of `sms` SMs; can_split
// false where the partial sums have no stream-ordered scratch.
PrefillPlan plan_prefill(int rows, int cols, int n_tokens, int sms, bool can_split);

// The K splits of `tile` alone (plan_prefill's second half).
int prefill_splits(const PrefillTile& tile, int rows, int cols, int n_tokens, int sms);

// On a GPU of many SMs, whether n_tokens (33 to kMaxChunkedDecodeTokens)
// cost less as chunks of 32 through the decode products, each reading the
// weights, than as one prefill product, whose 64-token tiles pad the batch
// (matmul() asks; an M40's 24 SMs keep the prefill tiles).
inline constexpr int kMaxChunkedDecodeTokens = 96;
bool decode_chunks_beat_prefill(int n_tokens);

}  // namespace m40::cuda::mm

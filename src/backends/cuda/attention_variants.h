// The attention launcher with its kernel choice exposed, for the tests (to run
// both kernels on the same batches and force the split path) and the bench.
// The forward pass calls m40::cuda::attention (layer_kernels.h), which picks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/layer_kernels.h"

namespace m40::cuda::detail {

enum class AttentionKernel {
  Auto,     // decode for n_tokens <= kDecodeMaxTokens, else prefill
  Decode,   // per (token, KV head) blocks, split over the context, then a combine
  Prefill,  // tiles of query tokens x key positions with an online softmax
};

// Batches up to this many tokens take the decode kernel under Auto.
inline constexpr int kDecodeMaxTokens = 32;
// The decode kernel splits a context into at most this many parts.
inline constexpr int kMaxSplits = 64;

struct AttentionPlan {
  AttentionKernel kernel = AttentionKernel::Auto;
  // Decode only: how many parts to split the context into (1: no split, the
  // kernel writes the output itself). 0: chosen from the batch and the GPU's
  // size. Clamped to 1..kMaxSplits and to max_positions.
  int splits = 0;
  // Decode only: query heads a block takes (1, 2 or 4; at most the lanes of
  // a key). 0: the GQA group, up to 4.
  int heads_per_block = 0;
};

void attention_with_plan(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
                         const int32_t* positions, int n_tokens, int max_positions, float* out,
                         cudaStream_t stream, const AttentionPlan& plan);

}  // namespace m40::cuda::detail

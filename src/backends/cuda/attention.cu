// Causal attention over the FP16 or Q8_0 KV cache, all math in FP32, with the scores
// scaled, optionally soft-capped (cap * tanh(s / cap)), and optionally limited
// to a sliding window of the last `window` positions. CPU twin:
// cpu::attention. Two kernels:
//
// Decode (few tokens, any layout; attention_decode.cu): one block of 4 warps
// per (token, KV head, context part), GQA heads sharing each K/V read, the
// context split into parts and combined (flash-decoding). Prefill (many
// tokens; attention_prefill.cu): one block per (tile of 32 query tokens,
// query head) with K/V tiles in shared memory and an online softmax. Each
// file describes its kernel; this one checks the arguments and picks.
//
// The soft-cap is applied where the scores become softmax statistics (one
// tanhf per visible score, outside the unrolled dot products), in kernels of
// their own (template parameter kCap): tanhf's temporaries beside the live
// accumulators cost 11 to 16 registers, which would cut the uncapped decode
// kernel from 4 to 3 blocks per M40 multiprocessor.
//
// The cache is paged (backends/kv_blocks.h): every K/V read goes through the
// token's sequence's block table. Both kernels map a run of key positions to
// pool rows once, into shared memory (the decode kernel per sub-chunk of 256
// keys, the prefill kernel per key tile), and the loads of K and V then read
// the row from there: one table lookup per key position, not per element.
//
// A Q8_0 cache (KvLayer::type) runs the same kernels instantiated for its
// rows (template parameter Rows): a lane's piece of 8 or 4 values lies in one
// 32-value block, read as 16-bit words (blocks are 34 bytes, so only 2-byte
// aligned) with the block's scale and widened to FP32 as q * d, exactly
// quant::dequantize_value. The FP16 instantiations are the code they were.
//
// Positions outside 0..n_ctx-1 (and negative sequence ids) give NaN outputs
// rather than out-of-bounds reads; the engine never sends them.
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

namespace m40::cuda {

namespace detail {

void attention_with_plan(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
                         const int32_t* positions, int n_tokens, int max_positions, float* out,
                         cudaStream_t stream, const AttentionPlan& plan) {
  if (shape.n_head <= 0 || shape.n_head_kv <= 0 || shape.n_head % shape.n_head_kv != 0) {
    throw Error("attention: " + std::to_string(shape.n_head) + " query heads do not divide into " +
                std::to_string(shape.n_head_kv) + " KV heads");
  }
  if (!attention_head_dim_supported(shape.head_dim)) {
    throw Error("attention: head_dim must be a multiple of 4 up to 128, or of 8 up to " +
                std::to_string(attn::kMaxHeadDim) + ", got " + std::to_string(shape.head_dim));
  }
  if (!(shape.softcap >= 0.0f) || shape.window < 0) {
    throw Error("attention: the soft-cap and the window must not be negative (got " + std::to_string(shape.softcap) +
                " and " + std::to_string(shape.window) + ")");
  }
  if (cache.kv_dim != shape.n_head_kv * shape.head_dim || cache.n_ctx <= 0) {
    throw Error("attention: the cache's kv_dim " + std::to_string(cache.kv_dim) + " is not " +
                std::to_string(shape.n_head_kv) + " KV heads x " + std::to_string(shape.head_dim));
  }
  if (cache.block_tables == nullptr || cache.max_blocks < backend::kv_blocks_for(cache.n_ctx)) {
    throw Error("attention: the cache needs block tables of at least " +
                std::to_string(backend::kv_blocks_for(cache.n_ctx)) + " entries per sequence (got " +
                std::to_string(cache.max_blocks) + ")");
  }
  if (cache.type == KvFormat::Q8_0 && cache.kv_dim % 32 != 0) {
    throw Error("attention: a Q8_0 cache needs kv_dim to be a multiple of 32, got " + std::to_string(cache.kv_dim));
  }
  if (!aligned(q, 16) || !aligned(out, 16) || !aligned(cache.k, 8) || !aligned(cache.v, 8)) {
    throw Error("attention: q and out must be 16-byte aligned, the K/V cache 8-byte aligned");
  }
  if (n_tokens < 0) throw Error("attention: negative token count " + std::to_string(n_tokens));
  if (n_tokens == 0) return;
  if (max_positions <= 0) throw Error("attention: max_positions must be at least 1");
  max_positions = std::min(max_positions, cache.n_ctx);
  const float scale = shape.scale != 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));

  AttentionKernel kernel = plan.kernel;
  if (kernel == AttentionKernel::Auto) {
    kernel = n_tokens <= kDecodeMaxTokens ? AttentionKernel::Decode : AttentionKernel::Prefill;
  }
  if (kernel == AttentionKernel::Decode) {
    attn::run_decode(cache, shape, scale, q, seq_ids, positions, n_tokens, max_positions, out, stream, plan.splits,
                     plan.heads_per_block);
  } else {
    attn::run_prefill(cache, shape, scale, q, seq_ids, positions, n_tokens, out, stream);
  }
}

}  // namespace detail

bool attention_head_dim_supported(int head_dim) {
  return head_dim > 0 && head_dim <= attn::kMaxHeadDim && head_dim % (head_dim > 128 ? 8 : 4) == 0;
}

void attention(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream) {
  detail::attention_with_plan(cache, shape, q, seq_ids, positions, n_tokens, max_positions, out, stream, {});
}

void attention_decode(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
                      const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream) {
  detail::attention_with_plan(cache, shape, q, seq_ids, positions, n_tokens, max_positions, out, stream,
                              {detail::AttentionKernel::Decode, 0});
}

}  // namespace m40::cuda

// The mixture-of-experts FFN on the GPU, as cpu::moe_ffn computes it (the
// reference, src/backends/cpu/moe.h): the router's logits (a plain product)
// → route_experts (softmax, top k, weights renormalized where the
// architecture says) → group_by_expert
// (the step's (token, slot) pairs in expert order, cut into work items) →
// gather_expert_rows (unless each item is one token, which the products
// then read in place) → grouped products of the chosen experts only
// (matmul.h, grouped_matmul: gate and up, silu, down) → combine_experts
// (each token's weighted sum of its slots, plus a shared expert's gated
// output where the layer has one, plus the residual). Every launch
// has a grid fixed by the step's token count, so a decode step stays one
// CUDA graph with the routing on the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/layer_kernels.h"
#include "backends/cuda/matmul.h"

namespace m40::cuda {

// The most experts a router may have (a warp holds a token's probabilities
// in registers, at most 32 a lane).
inline constexpr int kMaxExperts = 1024;

// Per token t: the k experts of highest softmax probability over the
// n_expert logits[t], in descending order (ties to the lower index), to
// ids[t * k + s], and their probabilities to weights[t * k + s], with
// `renormalize` divided by their sum (at least 6.103515625e-5). CPU twin:
// cpu::route_experts.
void route_experts(const float* logits, int n_tokens, int n_expert, int k, bool renormalize, int32_t* ids,
                   float* weights, cudaStream_t stream);

// Tokens per work item for a step of n_tokens (matmul.h, grouped_matmul):
// the tokens an expert gets when the n_tokens * k choices spread evenly over
// the experts (its even share) as a power of two up to
// kMaxExpertMatvecTokens (the decode kernel, re-reading a busy expert's
// weights) while that share is at most tile_share; past it the gemm tile
// that holds the share: 16 or 32 tokens (the decode tiles) or
// kMaxExpertGemmTokens (the prefill tile), so that padding stays under half.
int expert_item_tokens(int n_tokens, int k, int n_expert, int tile_share);

// The even share past which a step's experts take gemm tiles: 4 x
// kMaxExpertMatvecTokens on a GPU of few SMs (an M40, where 8 tokens of
// Q4_K are already FP32-bound and a tile's padding costs FMAs); on one of
// kManyMultiprocessors or more kMaxExpertMatvecTokens, or twice that for
// the formats whose tile loads are slow (tiles_load_slowly). Measured on an
// H100, a 4-layer Qwen3-30B-A3B shape (docs/benchmarks.md): Q4_K_M pp128
// 1.85x and pp256 2.2x, Q8_0 pp256 +19% (at shares of 8 it lost 3%).
int expert_tile_share(gguf::TensorType type, int multiprocessors);

// The most work items a step can make: (slots + chosen (item_tokens - 1)) /
// item_tokens for n_tokens * k slots over at most min(n_expert, slots)
// chosen experts (each chosen expert's last item may be partly empty).
int max_expert_items(int n_tokens, int k, int n_expert, int item_tokens);

// Orders the n_slots = n_tokens * k choices (ids, slot s = t * k + i) by
// expert, slots in their order within an expert: sorted_slots[r] is the slot
// at sorted row r, slot_rows[s] the sorted row of slot s. Expert e's rows are
// cut into work items of at most item_tokens rows, items[0 .. n_items) in
// expert order, each naming the token of its first row; items past the
// step's last have expert -1. One block.
void group_by_expert(const int32_t* ids, int n_slots, int n_expert, int k, int item_tokens, int n_items,
                     int32_t* sorted_slots, int32_t* slot_rows, ExpertItem* items, cudaStream_t stream);

// route_experts then group_by_expert; one launch (one block) for steps of
// up to kMaxFusedRouteTokens tokens, where each kernel is a few
// microseconds on the critical path of every layer.
inline constexpr int kMaxFusedRouteTokens = 32;
void route_and_group(const float* logits, int n_tokens, int n_expert, int k, bool renormalize, int item_tokens,
                     int n_items, int32_t* ids, float* weights, int32_t* sorted_slots, int32_t* slot_rows,
                     ExpertItem* items, cudaStream_t stream);

// out[r] = x[sorted_slots[r] / k] for the n_slots rows of n_embd values.
void gather_expert_rows(const float* x, const int32_t* sorted_slots, int k, int n_slots, int n_embd, float* out,
                        cudaStream_t stream);

// A shared expert's output rows ([n_tokens][n_embd]) and gate logit per
// token (qwen2moe); both null where the layer has none.
struct SharedExpertOutput {
  const float* out = nullptr;
  const float* gate_logit = nullptr;
};

// y[t] = residual[t] + (Σ_s weights[t k + s] · expert_out[slot_rows[t k + s]]
// for s in slot order + sigmoid(shared.gate_logit[t]) · shared.out[t])
// (residual may be null or y); where `next` names a norm, also
// next.out[t] = rms_norm(y[t]) * next.weight (eps): the next layer's input,
// one launch fewer a layer. CPU twin: the end of cpu::moe_ffn (then
// cpu::rms_norm).
void combine_experts(const float* expert_out, const int32_t* slot_rows, const float* weights, int n_tokens, int k,
                     int n_embd, SharedExpertOutput shared, float* y, const float* residual, cudaStream_t stream,
                     const NextNorm& next = {}, float eps = 0.0f);

}  // namespace m40::cuda

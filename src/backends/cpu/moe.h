// The mixture-of-experts FFN on the CPU, as llama.cpp @ 3f545be's
// build_moe_ffn computes it for qwen3moe, qwen2moe and llama with experts
// (Mixtral): softmax over all router logits, the top k experts, their
// probabilities (renormalized to sum 1 but for qwen2moe), and the weighted
// sum of the chosen experts' down(silu(gate · x) ⊙ up · x); qwen2moe adds
// its shared expert's output times sigmoid(gate_inp_shexp · x).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "model/weights.h"

namespace m40::cpu {

struct ExpertChoice {
  int32_t expert = 0;
  float weight = 0.0f;
};

// Routes one token: `logits` (n_expert router outputs) → the k chosen experts
// in descending probability, written to `out[0..k)`. Ties go to the lower
// expert index, as ggml's CPU argsort (libstdc++'s std::sort: a stable
// insertion sort up to 16 values) orders them; with more experts ggml leaves
// the order of exactly equal probabilities unspecified. The weights are the
// softmax probabilities of the chosen experts, with `renormalize` divided by
// their sum (clamped below at 6.103515625e-5, the smallest normal FP16, as
// llama.cpp does).
void route_experts(const float* logits, int n_expert, int k, bool renormalize, ExpertChoice* out);

// proj[t] = Σ_slot weight · down_e(silu(gate_e · xn[t]) ⊙ up_e · xn[t]) over
// the experts chosen for each of the n tokens, plus the shared expert's
// sigmoid(gate_inp_shexp · xn[t]) · down_s(silu(gate_s · xn[t]) ⊙ up_s ·
// xn[t]) where the layer has one. xn, proj: [n][n_embd]. Each expert's
// matrices are read once for all the tokens routed to it.
void moe_ffn(const model::LayerWeights& w, int n_expert_used, bool renormalize, const float* xn, int64_t n,
             int64_t n_embd, float* proj, ThreadPool& pool);

}  // namespace m40::cpu

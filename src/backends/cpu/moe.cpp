#include "backends/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/ops.h"
#include "common/error.h"

namespace m40::cpu {

void route_experts(const float* logits, int n_expert, int k, bool renormalize, ExpertChoice* out) {
  if (k <= 0 || k > n_expert) throw Error("expert routing: k must be between 1 and the expert count");
  std::vector<float> probs(logits, logits + n_expert);
  softmax(probs.data(), n_expert);
  std::vector<int32_t> order(n_expert);
  std::iota(order.begin(), order.end(), 0);
  // Descending probability; equal ones keep index order (stable).
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  if (!renormalize) {
    for (int i = 0; i < k; ++i) out[i] = {order[i], probs[order[i]]};
    return;
  }
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) sum += probs[order[i]];
  sum = std::max(sum, 6.103515625e-5f);
  for (int i = 0; i < k; ++i) out[i] = {order[i], probs[order[i]] / sum};
}

namespace {

// proj[t] += sigmoid(gate_inp_shexp · xn[t]) · down_s(silu(gate_s · xn[t]) ⊙
// up_s · xn[t]), after the routed experts' sum (llama.cpp's qwen2moe graph:
// the sigmoid as silu(g) / g, which is the same function).
void add_shared_expert(const model::LayerWeights& w, const float* xn, int64_t n, int64_t n_embd, float* proj,
                       ThreadPool& pool) {
  const int64_t n_ff = static_cast<int64_t>(w.gate_shexp.rows);
  std::vector<float> gate(n * n_ff), up(n * n_ff), down(n * n_embd), g(n);
  matmul(w.gate_inp_shexp, xn, n, g.data(), pool);
  matmul(w.gate_shexp, xn, n, gate.data(), pool);
  matmul(w.up_shexp, xn, n, up.data(), pool);
  silu_mul(gate.data(), up.data(), gate.data(), n * n_ff);
  matmul(w.down_shexp, gate.data(), n, down.data(), pool);
  for (int64_t t = 0; t < n; ++t) {
    const float scale = 1.0f / (1.0f + std::exp(-g[t]));
    float* dst = proj + t * n_embd;
    const float* src = down.data() + t * n_embd;
    for (int64_t j = 0; j < n_embd; ++j) dst[j] += src[j] * scale;
  }
}

}  // namespace

void moe_ffn(const model::LayerWeights& w, int n_expert_used, bool renormalize, const float* xn, int64_t n,
             int64_t n_embd, float* proj, ThreadPool& pool) {
  const int n_expert = static_cast<int>(w.ffn_gate_inp.rows);
  const int k = n_expert_used;
  std::vector<float> logits(n * n_expert);
  matmul(w.ffn_gate_inp, xn, n, logits.data(), pool);
  std::vector<ExpertChoice> choice(n * k);
  for (int64_t t = 0; t < n; ++t) {
    route_experts(logits.data() + t * n_expert, n_expert, k, renormalize, choice.data() + t * k);
  }

  // Each slot's weighted expert output, summed in slot order afterwards (as
  // llama.cpp adds the slots' views one after the other).
  std::vector<float> slot_out(n * k * n_embd, 0.0f);
  std::vector<int64_t> rows;  // (token * k + slot) of the tokens routed to the expert
  std::vector<float> xs, gate, up, down;
  for (int e = 0; e < n_expert; ++e) {
    rows.clear();
    for (int64_t i = 0; i < n * k; ++i) {
      if (choice[i].expert == e) rows.push_back(i);
    }
    if (rows.empty()) continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    const int64_t n_ff = static_cast<int64_t>(w.gate_exps[e].rows);
    xs.resize(m * n_embd);
    for (int64_t r = 0; r < m; ++r) std::copy_n(xn + (rows[r] / k) * n_embd, n_embd, xs.data() + r * n_embd);
    gate.resize(m * n_ff);
    up.resize(m * n_ff);
    down.resize(m * n_embd);
    matmul(w.gate_exps[e], xs.data(), m, gate.data(), pool);
    matmul(w.up_exps[e], xs.data(), m, up.data(), pool);
    silu_mul(gate.data(), up.data(), gate.data(), m * n_ff);
    matmul(w.down_exps[e], gate.data(), m, down.data(), pool);
    for (int64_t r = 0; r < m; ++r) {
      const float weight = choice[rows[r]].weight;
      float* dst = slot_out.data() + rows[r] * n_embd;
      const float* src = down.data() + r * n_embd;
      for (int64_t j = 0; j < n_embd; ++j) dst[j] = src[j] * weight;
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    float* dst = proj + t * n_embd;
    std::copy_n(slot_out.data() + t * k * n_embd, n_embd, dst);
    for (int s = 1; s < k; ++s) add_in_place(dst, slot_out.data() + (t * k + s) * n_embd, n_embd);
  }
  if (w.has_shared_expert()) add_shared_expert(w, xn, n, n_embd, proj, pool);
}

}  // namespace m40::cpu

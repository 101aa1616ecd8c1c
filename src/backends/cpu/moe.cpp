#include "backends/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/ops.h"
#include "common/error.h"

namespace m40::cpu {

void route_experts(const float* logits, int n_expert, int k, ExpertChoice* out) {
  if (k <= 0 || k > n_expert) throw Error("expert routing: k must be between 1 and the expert count");
  std::vector<float> probs(logits, logits + n_expert);
  softmax(probs.data(), n_expert);
  std::vector<int32_t> order(n_expert);
  std::iota(order.begin(), order.end(), 0);
  // Descending probability; equal ones keep index order (stable).
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) sum += probs[order[i]];
  sum = std::max(sum, 6.103515625e-5f);
  for (int i = 0; i < k; ++i) out[i] = {order[i], probs[order[i]] / sum};
}

void moe_ffn(const model::LayerWeights& w, int n_expert_used, const float* xn, int64_t n, int64_t n_embd,
             float* proj, ThreadPool& pool) {
  const int n_expert = static_cast<int>(w.ffn_gate_inp.rows);
  const int k = n_expert_used;
  std::vector<float> logits(n * n_expert);
  matmul(w.ffn_gate_inp, xn, n, logits.data(), pool);
  std::vector<ExpertChoice> choice(n * k);
  for (int64_t t = 0; t < n; ++t) route_experts(logits.data() + t * n_expert, n_expert, k, choice.data() + t * k);

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
}

}  // namespace m40::cpu

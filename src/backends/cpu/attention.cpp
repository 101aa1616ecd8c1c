#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/ops.h"

namespace m40::cpu {

namespace {

template <class T>
void attention_typed(const KvCache& kv, int layer, const AttentionShape& shape, const float* q,
                     const int32_t* seq_ids, const int32_t* positions, int n_tokens,
                     const backend::BlockTables& tables, float* out, ThreadPool& pool) {
  const int head_dim = shape.head_dim;
  const int kv_dim = shape.n_head_kv * head_dim;
  const int q_dim = shape.n_head * head_dim;
  const int gqa = shape.n_head / shape.n_head_kv;
  const float scale = shape.scale;
  const float cap = shape.softcap;
  const int64_t work = static_cast<int64_t>(n_tokens) * shape.n_head;
  pool.parallel_for(work, [&](int64_t begin, int64_t end, unsigned) {
    std::vector<float> scores;
    std::vector<float> acc(head_dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / shape.n_head;
      const int h = static_cast<int>(item % shape.n_head);
      const int n_pos = positions[t] + 1;
      // A sliding window sees the last `window` positions only.
      const int first = shape.window > 0 ? std::max(0, n_pos - shape.window) : 0;
      const int kv_head = h / gqa;
      const float* qh = q + t * q_dim + h * head_dim;
      const int32_t* table = tables.table(seq_ids[t]);
      const T* keys = kv.keys<T>(layer) + kv_head * head_dim;
      const T* values = kv.values<T>(layer) + kv_head * head_dim;
      const int n_seen = n_pos - first;
      scores.resize(n_seen);
      for (int j = first; j < n_pos; ++j) {
        const T* k = keys + backend::kv_row(table, j) * kv_dim;
        float s = 0.0f;
        for (int d = 0; d < head_dim; ++d) s += qh[d] * kv_to_float(k[d]);
        s *= scale;
        if (cap > 0.0f) s = cap * std::tanh(s / cap);
        scores[j - first] = s;
      }
      softmax(scores.data(), n_seen);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = first; j < n_pos; ++j) {
        const T* v = values + backend::kv_row(table, j) * kv_dim;
        const float p = scores[j - first];
        for (int d = 0; d < head_dim; ++d) acc[d] += p * kv_to_float(v[d]);
      }
      std::memcpy(out + t * q_dim + h * head_dim, acc.data(), head_dim * sizeof(float));
    }
  });
}

}  // namespace

void attention(const KvCache& kv, int layer, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, const backend::BlockTables& tables, float* out, ThreadPool& pool) {
  if (kv.type() == backend::KvType::F16) {
    attention_typed<uint16_t>(kv, layer, shape, q, seq_ids, positions, n_tokens, tables, out, pool);
  } else {
    attention_typed<float>(kv, layer, shape, q, seq_ids, positions, n_tokens, tables, out, pool);
  }
}

}  // namespace m40::cpu

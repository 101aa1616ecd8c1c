#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backends/cpu/ops.h"

namespace m40::cpu {

namespace {

// A Q8_0 pool read element by element (blocks of 32 values, one fp16 scale
// each) through quant::dequantize_value, the decoding the CUDA kernels share.
struct Q8Rows {
  const quant::BlockQ8_0* base;
  int64_t stride;  // blocks per row
  float at(int64_t row, int e) const {
    return quant::dequantize_value(base[row * stride + e / quant::BlockQ8_0::kValues], e % quant::BlockQ8_0::kValues);
  }
};

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
      const int n_seen = n_pos - first;
      scores.resize(n_seen);
      for (int j = first; j < n_pos; ++j) {
        float s = 0.0f;
        if constexpr (std::is_same_v<T, quant::BlockQ8_0>) {
          const Q8Rows keys{kv.keys<T>(layer), kv_dim / quant::BlockQ8_0::kValues};
          const int64_t row = backend::kv_row(table, j);
          for (int d = 0; d < head_dim; ++d) s += qh[d] * keys.at(row, kv_head * head_dim + d);
        } else {
          const T* k = kv.keys<T>(layer) + kv_head * head_dim + backend::kv_row(table, j) * kv_dim;
          for (int d = 0; d < head_dim; ++d) s += qh[d] * kv_to_float(k[d]);
        }
        s *= scale;
        if (cap > 0.0f) s = cap * std::tanh(s / cap);
        scores[j - first] = s;
      }
      softmax(scores.data(), n_seen);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = first; j < n_pos; ++j) {
        const float p = scores[j - first];
        if constexpr (std::is_same_v<T, quant::BlockQ8_0>) {
          const Q8Rows values{kv.values<T>(layer), kv_dim / quant::BlockQ8_0::kValues};
          const int64_t row = backend::kv_row(table, j);
          for (int d = 0; d < head_dim; ++d) acc[d] += p * values.at(row, kv_head * head_dim + d);
        } else {
          const T* v = kv.values<T>(layer) + kv_head * head_dim + backend::kv_row(table, j) * kv_dim;
          for (int d = 0; d < head_dim; ++d) acc[d] += p * kv_to_float(v[d]);
        }
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
  } else if (kv.type() == backend::KvType::Q8_0) {
    attention_typed<quant::BlockQ8_0>(kv, layer, shape, q, seq_ids, positions, n_tokens, tables, out, pool);
  } else {
    attention_typed<float>(kv, layer, shape, q, seq_ids, positions, n_tokens, tables, out, pool);
  }
}

}  // namespace m40::cpu

#include "engine/embedding_pooling.h"

#include <cmath>
#include <string>

#include "common/error.h"

namespace m40::engine {

using model::PoolingType;

PoolingType embedding_pooling(const model::ModelHparams& hparams) {
  if (!hparams.pooling || *hparams.pooling == PoolingType::None) return PoolingType::Last;
  if (*hparams.pooling == PoolingType::Rank) {
    throw Error("this model is a reranker (" + model::arch_key(hparams.architecture, "pooling_type") +
                " = rank): ranking is not supported, and its embeddings would be meaningless");
  }
  return *hparams.pooling;
}

EmbeddingPooler::EmbeddingPooler(PoolingType pooling, int n_embd, int n_tokens)
    : pooling_(pooling), n_embd_(n_embd), n_tokens_(n_tokens) {
  if (pooling != PoolingType::Mean && pooling != PoolingType::Cls && pooling != PoolingType::Last) {
    throw Error("embeddings pool by mean, cls or last, not " + std::string(model::pooling_type_name(pooling)));
  }
  if (n_embd <= 0 || n_tokens <= 0) throw Error("an embedding needs a text of at least one token");
  sum_.assign(static_cast<size_t>(n_embd), 0.0);
}

bool EmbeddingPooler::wants(int position) const {
  switch (pooling_) {
    case PoolingType::Mean: return position >= 0 && position < n_tokens_;
    case PoolingType::Cls: return position == 0;
    default: return position == n_tokens_ - 1;
  }
}

void EmbeddingPooler::add(int position, std::span<const float> hidden) {
  if (!wants(position) || complete()) throw Error("hidden state at position " + std::to_string(position) + " not wanted");
  if (hidden.size() != static_cast<size_t>(n_embd_)) throw Error("a hidden state has the wrong width");
  for (size_t i = 0; i < hidden.size(); ++i) sum_[i] += hidden[i];
  ++added_;
}

std::vector<float> EmbeddingPooler::pooled() const {
  if (!complete()) throw Error("the embedding's hidden states are incomplete");
  std::vector<float> out(sum_.size());
  const double count = needed();
  for (size_t i = 0; i < sum_.size(); ++i) out[i] = static_cast<float>(sum_[i] / count);
  return out;
}

void l2_normalize(std::span<float> v) {
  double sum = 0.0;
  for (float x : v) {
    if (!std::isfinite(x)) throw Error("the embedding holds a NaN or an infinity");
    sum += static_cast<double>(x) * x;
  }
  if (sum == 0.0) return;
  const double scale = 1.0 / std::sqrt(sum);
  for (float& x : v) x = static_cast<float>(x * scale);
}

std::vector<float> truncate_embedding(std::span<const float> v, size_t dimensions) {
  if (dimensions == 0 || dimensions > v.size()) {
    throw Error("dimensions must be between 1 and " + std::to_string(v.size()) + ", got " + std::to_string(dimensions));
  }
  std::vector<float> out(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(dimensions));
  l2_normalize(out);
  return out;
}

}  // namespace m40::engine

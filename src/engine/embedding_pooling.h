// Embeddings from a decoder's hidden states: the pooling a model declares
// (`{arch}.pooling_type`: mean, CLS, last token) over the final hidden
// states of one text's tokens (Backend::forward with
// Batch::output_embeddings), then L2 normalization, as llama.cpp's server
// (embd_normalize 2, its default) and Ollama's /api/embed return them.
// The scheduler pools chunk by chunk as a long text is read; the server
// truncates to `dimensions`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/hparams.h"

namespace m40::engine {

// The pooling an embedding of this model uses: the one its file declares
// (mean, CLS, last); last-token for a model that declares none, or none
// (a generative model), as Ollama does: the last token's hidden state is
// the one that has seen the whole text. Throws m40::Error for rank (a
// reranker, whose classification head is not built).
model::PoolingType embedding_pooling(const model::ModelHparams& hparams);

// Pools one text's hidden states as they come, in any chunks, in order of
// position. Mean: the average of every token's; CLS: the first token's
// (position 0); last: the last token's (position n_tokens - 1).
class EmbeddingPooler {
 public:
  // Throws m40::Error for a pooling other than mean, CLS or last, or an
  // empty text.
  EmbeddingPooler(model::PoolingType pooling, int n_embd, int n_tokens);

  // Whether the hidden state at `position` is needed (the batch asks the
  // backend for it).
  bool wants(int position) const;
  // Adds the hidden state (n_embd values) at `position`, one it wants.
  void add(int position, std::span<const float> hidden);
  // Whether every needed hidden state was added.
  bool complete() const { return added_ == needed(); }
  // The pooled vector (not normalized); complete() must hold.
  std::vector<float> pooled() const;

  model::PoolingType pooling() const { return pooling_; }
  int n_embd() const { return n_embd_; }

 private:
  int needed() const { return pooling_ == model::PoolingType::Mean ? n_tokens_ : 1; }

  model::PoolingType pooling_;
  int n_embd_;
  int n_tokens_;
  int added_ = 0;
  std::vector<double> sum_;  // mean: summed in double, so a long text loses nothing to rounding
};

// Scales `v` to unit Euclidean length in place; a zero vector stays zero.
// Throws m40::Error when it holds a NaN or an infinity.
void l2_normalize(std::span<float> v);

// The first `dimensions` values of an embedding, normalized again: the
// truncation Matryoshka-trained models (Qwen3-Embedding, OpenAI's
// text-embedding-3) are made for, as OpenAI's and Ollama's `dimensions`
// apply it. `dimensions` must be in [1, v.size()].
std::vector<float> truncate_embedding(std::span<const float> v, size_t dimensions);

}  // namespace m40::engine

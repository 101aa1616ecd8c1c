// The checks every backend makes on a batch before any work, so a bad token,
// position or sequence is a clear error and never an out-of-bounds access.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "common/error.h"

namespace m40::backend {

// Throws m40::Error for an empty or inconsistent batch, a token outside the
// vocabulary, a sequence without a KV slot, a position outside the context or
// one that skips uncached positions. `cached` holds each sequence's cached
// positions; it is not changed (see advance_cached).
inline void check_batch(const Batch& batch, size_t logits_size, int n_vocab, int n_ctx,
                        const std::vector<int>& cached) {
  if (batch.size() == 0) throw Error("empty batch");
  if (batch.positions.size() != batch.size() || batch.seq_ids.size() != batch.size() ||
      batch.want_logits.size() != batch.size()) {
    throw Error("batch fields have different lengths");
  }
  if (logits_size < batch.logits_count() * static_cast<size_t>(n_vocab)) {
    throw Error("logits buffer too small for the batch");
  }
  std::vector<int> filled = cached;
  const int n_seq = static_cast<int>(cached.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const int32_t token = batch.tokens[i], pos = batch.positions[i], seq = batch.seq_ids[i];
    if (token < 0 || token >= n_vocab) {
      throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(n_vocab));
    }
    if (seq < 0 || seq >= n_seq) throw Error("sequence " + std::to_string(seq) + " has no KV slot");
    if (pos < 0 || pos >= n_ctx) {
      throw Error("position " + std::to_string(pos) + " is outside the context of " + std::to_string(n_ctx) +
                  " tokens");
    }
    if (pos > filled[seq]) {
      throw Error("position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                  " skips uncached positions (cached: " + std::to_string(filled[seq]) + ")");
    }
    filled[seq] = std::max(filled[seq], pos + 1);
  }
}

// Records the positions a batch has cached.
inline void advance_cached(const Batch& batch, std::vector<int>& cached) {
  for (size_t i = 0; i < batch.size(); ++i) {
    cached[batch.seq_ids[i]] = std::max(cached[batch.seq_ids[i]], batch.positions[i] + 1);
  }
}

}  // namespace m40::backend

// What a backend knows of its sequences' pages: each sequence's block table
// (kv_blocks.h) and how many of its positions hold K and V. Both backends
// keep one and check every batch against it, so a bad token, position or
// sequence is a clear error and never an out-of-bounds access.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/kv_blocks.h"
#include "common/error.h"

namespace m40::backend {

class BlockTables {
 public:
  // A pool of `n_blocks` blocks for `n_seq` sequences of up to `n_ctx`
  // positions; each sequence starts with its own whole context where the
  // pool holds one per sequence (Backend::n_kv_blocks), else no blocks.
  BlockTables(int n_seq, int n_ctx, int n_blocks)
      : n_ctx_(n_ctx), n_blocks_(n_blocks), max_blocks_(kv_blocks_for(n_ctx)),
        flat_(static_cast<size_t>(n_seq) * max_blocks_, 0), length_(n_seq, 0), cached_(n_seq, 0) {
    if (n_seq <= 0 || n_ctx <= 0 || n_blocks <= 0) throw Error("the KV cache needs sequences, a context and blocks");
    if (static_cast<int64_t>(n_seq) * max_blocks_ <= n_blocks) {
      for (int s = 0; s < n_seq; ++s) {
        for (int b = 0; b < max_blocks_; ++b) flat_[static_cast<size_t>(s) * max_blocks_ + b] = s * max_blocks_ + b;
        length_[s] = max_blocks_;
      }
    }
  }

  int n_seq() const { return static_cast<int>(length_.size()); }
  int n_blocks() const { return n_blocks_; }
  // Table entries per sequence (kv_blocks_for(n_ctx)): the stride of flat().
  int max_blocks() const { return max_blocks_; }
  // Every sequence's table, max_blocks() entries each (unused ones 0).
  const std::vector<int32_t>& flat() const { return flat_; }
  const int32_t* table(int seq) const { return flat_.data() + static_cast<size_t>(seq) * max_blocks_; }

  void set(int seq, std::span<const int32_t> blocks, int n_cached) {
    if (seq < 0 || seq >= n_seq()) throw Error("sequence " + std::to_string(seq) + " has no KV slot");
    if (static_cast<int>(blocks.size()) > max_blocks_) {
      throw Error(std::to_string(blocks.size()) + " KV blocks are more than a context of " + std::to_string(n_ctx_) +
                  " positions needs");
    }
    for (int32_t b : blocks) {
      if (b < 0 || b >= n_blocks_) throw Error("KV block " + std::to_string(b) + " is outside the pool of " + std::to_string(n_blocks_));
    }
    if (n_cached < 0 || n_cached > static_cast<int>(blocks.size()) * kKvBlockSize) {
      throw Error("sequence " + std::to_string(seq) + " cannot hold " + std::to_string(n_cached) + " cached positions in " +
                  std::to_string(blocks.size()) + " blocks");
    }
    std::copy(blocks.begin(), blocks.end(), flat_.begin() + static_cast<std::ptrdiff_t>(seq) * max_blocks_);
    std::fill(flat_.begin() + static_cast<std::ptrdiff_t>(seq) * max_blocks_ + static_cast<std::ptrdiff_t>(blocks.size()),
              flat_.begin() + static_cast<std::ptrdiff_t>(seq + 1) * max_blocks_, 0);
    length_[seq] = static_cast<int>(blocks.size());
    cached_[seq] = n_cached;
  }

  void check_block(int32_t block) const {
    if (block < 0 || block >= n_blocks_) throw Error("KV block " + std::to_string(block) + " is outside the pool of " + std::to_string(n_blocks_));
  }

  // Throws m40::Error for an empty or inconsistent batch, a token outside
  // the vocabulary, a sequence without a KV slot, a position outside the
  // context or the sequence's blocks, or one that skips uncached positions.
  // The output buffer holds n_vocab logits per output token, or n_embd
  // values with Batch::output_embeddings (n_embd 0: the backend has none).
  void check(const Batch& batch, size_t logits_size, int n_vocab, int n_embd = 0) const {
    check_tokens(batch, n_vocab);
    if (batch.output_embeddings && n_embd <= 0) throw Error("this backend gives no hidden states");
    const int row = batch.output_embeddings ? n_embd : n_vocab;
    if (logits_size < batch.logits_count() * static_cast<size_t>(row)) {
      throw Error(batch.output_embeddings ? "hidden-state buffer too small for the batch" : "logits buffer too small for the batch");
    }
  }

  // check() for a step of a stage of a split model (Backend::forward_stage):
  // the output buffer where it holds the last layer, the hidden-state buffer
  // (n_embd values per token) where it reads or writes one.
  void check_stage(const Batch& batch, size_t hidden_size, size_t out_size, int n_vocab, int n_embd, bool holds_input,
                   bool holds_output) const {
    if (holds_output) {
      check(batch, out_size, n_vocab, n_embd);
    } else {
      check_tokens(batch, n_vocab);
    }
    if ((!holds_input || !holds_output) && hidden_size < batch.size() * static_cast<size_t>(n_embd)) {
      throw Error("hidden-state buffer too small for the batch");
    }
  }

  // check() without the output buffer: a stage of a split model that hands
  // its hidden states on (Backend::forward_stage) has no logits to size.
  void check_tokens(const Batch& batch, int n_vocab) const {
    if (batch.size() == 0) throw Error("empty batch");
    if (batch.positions.size() != batch.size() || batch.seq_ids.size() != batch.size() ||
        batch.want_logits.size() != batch.size()) {
      throw Error("batch fields have different lengths");
    }
    std::vector<int> filled = cached_;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int32_t token = batch.tokens[i], pos = batch.positions[i], seq = batch.seq_ids[i];
      if (token < 0 || token >= n_vocab) {
        throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(n_vocab));
      }
      if (seq < 0 || seq >= n_seq()) throw Error("sequence " + std::to_string(seq) + " has no KV slot");
      if (pos < 0 || pos >= n_ctx_) {
        throw Error("position " + std::to_string(pos) + " is outside the context of " + std::to_string(n_ctx_) + " tokens");
      }
      if (pos >= length_[seq] * kKvBlockSize) {
        throw Error("position " + std::to_string(pos) + " of sequence " + std::to_string(seq) + " is past its " +
                    std::to_string(length_[seq]) + " KV blocks");
      }
      if (pos > filled[seq]) {
        throw Error("position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                    " skips uncached positions (cached: " + std::to_string(filled[seq]) + ")");
      }
      filled[seq] = std::max(filled[seq], pos + 1);
    }
  }

  // Records the positions a batch has cached: those of all its tokens, or
  // of its first `count` (at most its size: a layer slice that stops
  // before the last layer caches nothing yet, layer_slices.h).
  void advance(const Batch& batch) { advance(batch, batch.size()); }
  void advance(const Batch& batch, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      cached_[batch.seq_ids[i]] = std::max(cached_[batch.seq_ids[i]], batch.positions[i] + 1);
    }
  }

 private:
  int n_ctx_;
  int n_blocks_;
  int max_blocks_;
  std::vector<int32_t> flat_;
  std::vector<int> length_;
  std::vector<int> cached_;
};

}  // namespace m40::backend

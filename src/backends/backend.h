// The interface every compute backend (CPU, CUDA) offers the engine: one
// forward step over a batch of tokens from one or more sequences, each token
// at its position, with its K and V kept in the backend's paged cache
// (kv_blocks.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"

namespace m40::backend {

// The KV cache element type. F16 is the design's default; F32 exists to
// compare with llama.cpp's F32-cache reference to the last digit; Q8_0
// (GGUF Q8_0 blocks of 32 values, 34 bytes, quantized as K and V are
// appended) halves the cache of F16 for long contexts. F32 is CPU only.
enum class KvType { F16, F32, Q8_0 };

// Layers [first, end) of a model: what one stage of a model split over
// devices computes (pipeline_backend.h).
struct LayerRange {
  int first = 0;
  int end = 0;
  int size() const { return end - first; }
  bool operator==(const LayerRange&) const = default;
};

// [0, n_layer) for the default {0, 0}; else `r`, which must be a non-empty
// range of the model's layers (throws m40::Error naming it otherwise).
inline LayerRange resolve_layers(LayerRange r, int n_layer) {
  if (r == LayerRange{}) return {0, n_layer};
  if (r.first < 0 || r.first >= r.end || r.end > n_layer) {
    throw Error("layers " + std::to_string(r.first) + " to " + std::to_string(r.end - 1) + " are not a stage of a model of " +
                std::to_string(n_layer) + " layers");
  }
  return r;
}

// Throws m40::Error unless `r` is the whole model: a stage of a split model
// runs its steps through Backend::forward_stage, not forward().
inline void require_whole_model(const std::string& backend_name, LayerRange r, int n_layer) {
  if (r.first != 0 || r.end != n_layer) {
    throw Error("this " + backend_name + " backend computes layers " + std::to_string(r.first) + " to " +
                std::to_string(r.end - 1) + " only: its steps go through forward_stage");
  }
}

// A layer slice of a batch (Batch::slice): its last `tokens` tokens, a
// chunk of one sequence's prompt at consecutive positions, pass only layers
// [first_layer, end_layer) in this step, beside the other tokens, which
// pass every layer. A long prompt is then read a few layers a step in
// chunks big enough for the prefill kernels, one pass over those layers'
// weights with the streams' decode tokens, instead of a few tokens a step
// through every layer: on a GPU whose small batches run at a fraction of
// the prefill rate (docs/server.md, "Prompts beside streams").
// Between steps the backend keeps the chunk's hidden states: a slice whose
// first_layer is past 0 continues the previous step's slice (the same
// sequence, positions and count; first_layer its end_layer). The chunk's
// positions count as cached once it has passed the last layer; until then
// its tokens want no outputs. tokens == 0: no slice.
struct LayerSlice {
  int tokens = 0;
  int first_layer = 0;
  int end_layer = 0;
  bool operator==(const LayerSlice&) const = default;

  // Whether its tokens pass `layer`.
  bool passes(int layer) const { return tokens > 0 && layer >= first_layer && layer < end_layer; }
  // The tokens of a batch of n that pass `layer`: all, or all but the
  // slice's where it does not run that layer.
  int tokens_at(int n, int layer) const { return tokens == 0 || passes(layer) ? n : n - tokens; }
  // Before `layer` its hidden states come from the previous step.
  bool resumes_at(int layer) const { return tokens > 0 && layer == first_layer && layer > 0; }
  // After `layer` (of a model of n_layer) its hidden states wait for the next step.
  bool pauses_after(int layer, int n_layer) const { return passes(layer) && layer + 1 == end_layer && end_layer < n_layer; }
};

// What a backend offers for layer slices (Backend::layer_slices).
struct SliceSupport {
  int layers = 0;     // the model's layers a slice may range over; 0: this backend runs no slices
  int max_batch = 0;  // the most tokens a step with a slice may hold (the slice's and the others)
};

struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;   // position of each token in its sequence
  std::vector<int32_t> seq_ids;     // which sequence (KV slot) each token belongs to
  std::vector<uint8_t> want_logits; // 1 where the caller needs this token's output (its logits, or its hidden state)
  // The outputs are the final hidden states (after the final norm, before
  // the output head: n_embd floats per token that wants one) instead of
  // logits, for every output token of this batch (embeddings).
  bool output_embeddings = false;
  LayerSlice slice;  // tokens 0: every token passes every layer

  void add(int32_t token, int32_t position, int32_t seq, bool logits) {
    tokens.push_back(token);
    positions.push_back(position);
    seq_ids.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
  }
  size_t size() const { return tokens.size(); }
  size_t logits_count() const {
    size_t n = 0;
    for (auto w : want_logits) n += w;
    return n;
  }
  void clear() {
    tokens.clear();
    positions.clear();
    seq_ids.clear();
    want_logits.clear();
    output_embeddings = false;
    slice = {};
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int n_ctx() const = 0;       // positions per sequence
  virtual int n_seq_max() const = 0;   // sequences (KV slots)
  virtual int n_vocab() const = 0;
  // The width of a hidden state (Batch::output_embeddings); 0: this
  // backend gives none.
  virtual int n_embd() const { return 0; }
  // The memory the model occupies with this backend: the weights (mapped or
  // copied), the KV pool and the working buffers, in bytes.
  virtual uint64_t memory_bytes() const = 0;
  // The part of memory_bytes() in GPU memory.
  virtual uint64_t gpu_memory_bytes() const { return 0; }

  // The paged KV cache (kv_blocks.h). The pool has n_kv_blocks() blocks.
  // Until set_blocks() names them, sequence s holds blocks
  // [s * B, (s + 1) * B) with B = kv_blocks_for(n_ctx()), when the pool has
  // that many (the layout of one whole context per sequence, what callers
  // that never page get), else none.
  virtual int n_kv_blocks() const = 0;
  // Gives sequence `seq` the blocks its positions live in, in order (at
  // most kv_blocks_for(n_ctx()), each below n_kv_blocks()); its first
  // `n_cached` positions hold K and V already (a prefix shared from those
  // blocks), so the next forward() may continue at n_cached. Throws
  // m40::Error for a bad sequence, block or count.
  virtual void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) = 0;
  // Copies K and V of every layer from block `src` to block `dst` (a shared
  // partial block a sequence is about to write: copy on write).
  virtual void copy_block(int32_t src, int32_t dst) = 0;

  // Runs one step. Tokens of a sequence attend to that sequence's cached
  // positions up to their own (causal), including earlier tokens of this
  // batch. A position must lie within the sequence's blocks. Writes n_vocab logits per token that wants them, in batch order,
  // to `logits` (sized logits_count() * n_vocab), or with
  // Batch::output_embeddings n_embd() hidden-state values per such token
  // (sized logits_count() * n_embd()). Throws m40::Error on a bad
  // token id, position or sequence.
  virtual void forward(const Batch& batch, std::span<float> logits) = 0;
  // Whether forward() takes batches with a layer slice, and how large; a
  // backend without them (the default: a split model's stages and shards)
  // throws m40::Error for one.
  virtual SliceSupport layer_slices() const { return {}; }

  // --- A stage of a model split over devices (pipeline_backend.h) ---------
  // The layers this backend computes; {0, 0} for a backend that cannot run
  // as a stage. A backend of the whole model holds [0, n_layer).
  virtual LayerRange layers() const { return {}; }
  // One step over layers(), as forward() but for a stage: unless it holds
  // layer 0, it reads each batch token's hidden state (n_embd() floats, in
  // batch order) from `hidden` instead of embedding the token; unless it
  // holds the last layer, it writes each token's hidden state after its
  // last layer back to `hidden` and leaves `out` alone; the stage that
  // holds the last layer writes `out` as forward() writes its logits.
  // Throws m40::Error as forward() does, or for a `hidden` too small.
  virtual void forward_stage(const Batch& batch, std::span<float> hidden, std::span<float> out);

  // --- A shard of a model split by rows (row_split/row_split_backend.h) ----
  // One step over every layer on this shard's slices, while the other
  // shards run theirs on their own threads and their branches' partial sums
  // are added through the group they share: shard 0 writes `out` as
  // forward() writes its logits, the others take an empty span. Throws
  // m40::Error as forward() does, before any work.
  virtual void forward_shard(const Batch& batch, std::span<float> out);
};

inline void Backend::forward_stage(const Batch&, std::span<float>, std::span<float>) {
  throw Error("the " + name() + " backend cannot run as one stage of a model split over devices");
}

inline void Backend::forward_shard(const Batch&, std::span<float>) {
  throw Error("the " + name() + " backend cannot run as one shard of a model split by rows");
}

}  // namespace m40::backend

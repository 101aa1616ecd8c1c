// The bookkeeping of layer slices (backend.h, LayerSlice) that both
// backends share: each batch's slice checked against the model and against
// the slice in flight, and where that one stopped. The backend keeps the
// hidden states this describes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>

#include "backends/backend.h"
#include "common/error.h"

namespace m40::backend {

class SliceTracker {
 public:
  explicit SliceTracker(int n_layer) : n_layer_(n_layer) {}

  // Throws m40::Error for a slice this step cannot run: more tokens than the
  // batch, a batch over `max_batch`, tokens of several sequences, positions
  // that do not follow each other, a sequence that also has tokens outside
  // the slice, layers outside the model or none, outputs wanted before the
  // last layer or as hidden states, or a continuation (first_layer > 0) of
  // anything but the slice in flight.
  void check(const Batch& batch, int max_batch) const {
    const LayerSlice& s = batch.slice;
    if (s.tokens == 0) return;
    const size_t n = batch.size();
    if (s.tokens < 0 || static_cast<size_t>(s.tokens) > n) {
      throw Error("a layer slice of " + std::to_string(s.tokens) + " tokens in a batch of " + std::to_string(n));
    }
    if (n > static_cast<size_t>(max_batch)) {
      throw Error("a batch with a layer slice holds at most " + std::to_string(max_batch) + " tokens, not " +
                  std::to_string(n));
    }
    if (s.first_layer < 0 || s.first_layer >= s.end_layer || s.end_layer > n_layer_) {
      throw Error("layers " + std::to_string(s.first_layer) + " to " + std::to_string(s.end_layer - 1) +
                  " are not a slice of a model of " + std::to_string(n_layer_) + " layers");
    }
    if (batch.output_embeddings) throw Error("a layer slice gives no hidden states");
    const size_t first = n - static_cast<size_t>(s.tokens);
    const int32_t seq = batch.seq_ids[first];
    for (size_t i = 0; i < n; ++i) {
      const bool in_slice = i >= first;
      if (in_slice && (batch.seq_ids[i] != seq || batch.positions[i] != batch.positions[first] + static_cast<int32_t>(i - first))) {
        throw Error("a layer slice holds consecutive positions of one sequence");
      }
      if (!in_slice && batch.seq_ids[i] == seq) {
        throw Error("sequence " + std::to_string(seq) + " has tokens inside and outside the layer slice");
      }
      if (in_slice && batch.want_logits[i] != 0 && s.end_layer != n_layer_) {
        throw Error("a layer slice that ends before the last layer has no outputs");
      }
    }
    if (s.first_layer == 0) return;
    const InFlight wanted{seq, batch.positions[first], s.tokens, s.first_layer};
    if (!in_flight_ || !(*in_flight_ == wanted)) {
      throw Error("the layer slice from layer " + std::to_string(s.first_layer) + " of sequence " + std::to_string(seq) +
                  " continues no slice in flight");
    }
  }

  // Before a step with a slice runs: none is in flight until it has run (a
  // step that fails midway leaves hidden states no one may continue).
  void begin(const Batch& batch) {
    if (batch.slice.tokens > 0) in_flight_.reset();
  }

  // After the step ran: where its slice stopped (nothing in flight once it
  // passed the last layer).
  void advance(const Batch& batch) {
    const LayerSlice& s = batch.slice;
    if (s.tokens == 0) return;
    if (s.end_layer == n_layer_) {
      in_flight_.reset();
      return;
    }
    const size_t first = batch.size() - static_cast<size_t>(s.tokens);
    in_flight_ = InFlight{batch.seq_ids[first], batch.positions[first], s.tokens, s.end_layer};
  }

  // The sequence's positions were reset (Backend::set_blocks): its slice
  // cannot go on.
  void forget_sequence(int seq) {
    if (in_flight_ && in_flight_->seq == seq) in_flight_.reset();
  }

  // The batch's tokens whose positions are cached once it has run, from the
  // first: all but those of a slice that stops before the last layer.
  size_t cached_tokens(const Batch& batch) const {
    const LayerSlice& s = batch.slice;
    return s.tokens > 0 && s.end_layer != n_layer_ ? batch.size() - static_cast<size_t>(s.tokens) : batch.size();
  }

 private:
  struct InFlight {
    int seq = 0;
    int first_position = 0;
    int tokens = 0;
    int next_layer = 0;
    bool operator==(const InFlight&) const = default;
  };
  int n_layer_;
  std::optional<InFlight> in_flight_;
};

}  // namespace m40::backend

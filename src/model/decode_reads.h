// The bytes of weights a decode step reads for each token: every tensor
// once, but one row of the token embedding (where the output head is its
// own tensor) and, of a mixture-of-experts layer's expert tensors, only
// the used share (expert_used_count of expert_count slices). Memory
// bandwidth over it bounds the decode speed. For the whole file (`show`)
// or for the layers one stage of a split model computes.
#pragma once

#include <cstdint>

#include "gguf/file.h"

namespace m40::model {

struct DecodeScope {
  int first_layer = 0;
  int end_layer = 1 << 30;  // one past the last layer counted
  bool input = true;         // the token embedding (the stage that holds layer 0)
  bool output = true;        // the output norm and head (the stage that holds the last layer)
};

// n_expert and n_expert_used: the file's expert_count and expert_used_count
// (0 for a dense model).
uint64_t decode_bytes_per_token(const gguf::File& file, uint64_t n_expert, uint64_t n_expert_used,
                                const DecodeScope& scope = {});

}  // namespace m40::model

#include "model/decode_reads.h"

#include <cstdlib>
#include <string>

namespace m40::model {

namespace {

// The layer of a "blk.N." tensor; -1 for the others.
int layer_of(const std::string& name) {
  if (!name.starts_with("blk.")) return -1;
  char* end = nullptr;
  const long layer = std::strtol(name.c_str() + 4, &end, 10);
  return end != name.c_str() + 4 && *end == '.' ? static_cast<int>(layer) : -1;
}

}  // namespace

uint64_t decode_bytes_per_token(const gguf::File& file, uint64_t n_expert, uint64_t n_expert_used,
                                const DecodeScope& scope) {
  const bool tied = file.find_tensor("output.weight") == nullptr;
  uint64_t bytes = 0;
  for (const auto& t : file.tensors()) {
    const int layer = layer_of(t.name);
    if (layer >= 0) {
      if (layer < scope.first_layer || layer >= scope.end_layer) continue;
      const bool expert_slices = n_expert > 0 && n_expert_used <= n_expert && t.dims.size() == 3 &&
                                 t.dims[2] == n_expert && t.name.ends_with("_exps.weight");
      bytes += expert_slices ? t.byte_size / n_expert * n_expert_used : t.byte_size;
    } else if (t.name == "token_embd.weight") {
      // A tied head reads it whole at the output; else a token reads its row.
      if (tied && scope.output) {
        bytes += t.byte_size;
      } else if (scope.input && t.dims.size() >= 2 && t.dims[1] > 0) {
        bytes += t.byte_size / t.dims[1];
      }
    } else if (t.name.starts_with("output")) {
      if (scope.output) bytes += t.byte_size;
    } else if (scope.input) {
      bytes += t.byte_size;  // what every layer shares (RoPE factors): counted once
    }
  }
  return bytes;
}

}  // namespace m40::model

// The size a GGUF file must have, read from its first bytes: the header and
// the tensor infos say where the data section starts and where each
// tensor's bytes lie, so a download can be judged before its tensor data
// arrives (a file whose header declares terabytes, a stream longer than its
// own header allows, bytes that are no GGUF file at all).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace m40::store {

// Where a complete file ends: at least `min_size` bytes (the end of the
// last tensor's data) and at most `max_size` (that end padded to the
// alignment, as writers pad after each tensor).
struct GgufExtent {
  uint64_t min_size = 0;
  uint64_t max_size = 0;
};

struct GgufProbe {
  enum class Status { NeedMore, Done, Invalid };
  Status status = Status::NeedMore;
  GgufExtent extent;        // Done
  uint64_t need = 0;        // NeedMore: the prefix must be at least this long to get further
  std::string problem;      // Invalid: why it cannot be a GGUF file
};

// Reads up to `size` bytes at `offset` into `out`; returns how many it read.
using PrefixReader = std::function<size_t(uint64_t offset, void* out, size_t size)>;

// Reads the header and the tensor infos from the first `available` bytes
// of a file, without holding them in memory (strings and arrays are
// skipped): NeedMore while they are not all there. The cost is one pass
// over what it reads, so a caller that probes again only once the prefix
// has doubled reads O(header) bytes in all.
GgufProbe probe_gguf(const PrefixReader& read, uint64_t available);

}  // namespace m40::store

// The context size a backend is built with. By default it is the model's
// trained context (context_length), capped by what the memory holds: the KV
// cache grows linearly with the context, so the largest context whose plan
// fits is (available - fixed) / bytes per position, rounded down.
#pragma once

#include <cstdint>

namespace m40::engine {

struct MemoryBudget {
  uint64_t available = 0;           // bytes the backend may use
  uint64_t fixed = 0;               // bytes needed at any context (weights, scratch, reserve)
  uint64_t per_position = 0;        // bytes one position adds (K and V of every layer and sequence)
};

// Contexts are chosen in steps of this many positions.
inline constexpr int kContextGranule = 256;

// `requested` > 0 is returned as asked (the backend's memory plan then says
// whether it fits); 0 picks min(trained, what the budget holds), at least
// one granule (a model whose weights alone do not fit fails in its plan).
// Throws m40::Error for a negative request.
int choose_context_size(int trained, int requested, const MemoryBudget& budget);

}  // namespace m40::engine

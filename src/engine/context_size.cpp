#include "engine/context_size.h"

#include <algorithm>

#include "common/error.h"

namespace m40::engine {

int choose_context_size(int trained, int requested, const MemoryBudget& budget) {
  if (requested < 0) throw Error("the context size must be positive");
  if (requested > 0) return requested;
  // A file without context_length: llama.cpp's usual default.
  const int wanted = trained > 0 ? trained : 4096;
  if (budget.per_position == 0) return wanted;
  const uint64_t room = budget.available > budget.fixed ? budget.available - budget.fixed : 0;
  const uint64_t fits = room / budget.per_position / kContextGranule * kContextGranule;
  const int capped = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(wanted), fits));
  return std::max(capped, std::min(wanted, kContextGranule));
}

}  // namespace m40::engine

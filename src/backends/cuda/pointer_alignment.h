// Whether a pointer may be read with vector loads: the check every
// launcher makes before it picks a float4 / 16-byte kernel over its scalar
// twin. Host code only.
#pragma once

#include <cstdint>

namespace m40::cuda {

inline bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void* p) { return aligned(p, 16); }
// For optional operands: absent (nullptr) counts as aligned.
inline bool aligned16_or_absent(const void* p) { return p == nullptr || aligned16(p); }

}  // namespace m40::cuda

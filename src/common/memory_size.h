// Memory sizes as users write them on the command line ("24G", "512M").
#pragma once

#include <cstdint>
#include <string>

namespace m40 {

// Binary units: K, M, G, T, optionally followed by B or iB; no unit means
// bytes. Throws m40::Error for anything else or a size that is not positive.
uint64_t parse_memory_size(const std::string& text);

}  // namespace m40

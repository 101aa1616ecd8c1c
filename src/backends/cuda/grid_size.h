// Grid sizes for the grid-stride kernels (element-wise, MoE gather and
// combine): enough blocks of `threads` for `items`, at most `max_blocks`
// (a grid-stride loop covers the rest; a few thousand blocks fill any GPU).
#pragma once

#include <algorithm>
#include <cstdint>

namespace m40::cuda {

inline int grid_blocks(int64_t items, int threads, int64_t max_blocks = 4096) {
  return static_cast<int>(std::max<int64_t>(1, std::min((items + threads - 1) / threads, max_blocks)));
}

}  // namespace m40::cuda

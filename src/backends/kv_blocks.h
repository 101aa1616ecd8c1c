// The paged KV cache's addressing, one definition for the host and the
// device. The cache is a pool of blocks of kKvBlockSize positions (every
// layer has its own K and V rows for each block); a sequence holds a block
// table, and position p of that sequence lives in row p % kKvBlockSize of
// block table[p / kKvBlockSize]. Blocks are handed out as sequences grow and
// full blocks are shared between sequences with the same prefix (the
// engine's KvBlockPool decides; backends only follow the tables).
#pragma once

#include <cstdint>

#include "quant/host_device.h"

namespace m40::backend {

// Positions per block: the granularity of prefix reuse (16, as vLLM and
// llama.cpp's server use) and of allocation.
inline constexpr int kKvBlockSize = 16;

// Blocks a sequence of `n_positions` positions needs.
M40_HOST_DEVICE constexpr int kv_blocks_for(int n_positions) { return (n_positions + kKvBlockSize - 1) / kKvBlockSize; }

// Positions and block ids are never negative: the unsigned forms below
// divide by shifts (the attention kernels compute a row per key).

// The entry of a block table that holds position `pos`.
M40_HOST_DEVICE constexpr int kv_block_index(int pos) {
  return static_cast<int>(static_cast<uint32_t>(pos) / kKvBlockSize);
}

// The pool row of position `pos` when `block` (its table entry) holds it.
M40_HOST_DEVICE constexpr uint32_t kv_row_in_block(int32_t block, int pos) {
  return static_cast<uint32_t>(block) * kKvBlockSize + static_cast<uint32_t>(pos) % kKvBlockSize;
}

// The pool row (block * kKvBlockSize + offset) of position `pos` of the
// sequence whose block table is `table`.
M40_HOST_DEVICE inline int64_t kv_row(const int32_t* table, int pos) {
  return kv_row_in_block(table[kv_block_index(pos)], pos);
}

}  // namespace m40::backend

// The CPU backend's KV cache: a pool of blocks (kv_blocks.h) holding, for
// every layer, K and V of kKvBlockSize positions each, as FP16 (the
// design's default), FP32 (for bit-tight comparisons with llama.cpp's
// F32-cache reference) or Q8_0 (kv_dim / 32 quant::BlockQ8_0 blocks per row,
// quantized as they are stored: half the bytes of FP16). Which block holds
// which sequence's positions is the block tables' business
// (backend::BlockTables); here rows are pool rows.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "backends/kv_blocks.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::cpu {

class KvCache {
 public:
  // Throws m40::Error for Q8_0 with a kv_dim that is not a multiple of 32.
  KvCache(int n_layer, int n_blocks, int kv_dim, backend::KvType type);

  // Bytes of one position's K (or V) row of kv_dim values.
  static uint64_t row_bytes(backend::KvType type, int kv_dim);

  backend::KvType type() const { return type_; }
  int n_blocks() const { return n_blocks_; }
  uint64_t bytes() const { return k_.size() + v_.size(); }
  int kv_dim() const { return kv_dim_; }

  // K and V of one position into pool row `row` (block * kKvBlockSize + offset).
  void store(int layer, int64_t row, const float* k, const float* v);
  // Copies every layer's rows of block `src` to block `dst`.
  void copy_block(int32_t src, int32_t dst);

  // The layer's pool: row r at r * kv_dim elements of T, T uint16_t (F16
  // bits) or float, matching type(); for Q8_0, T is quant::BlockQ8_0 and
  // row r starts at block r * kv_dim / 32.
  template <class T> const T* keys(int layer) const { return reinterpret_cast<const T*>(k_.data() + offset(layer, 0)); }
  template <class T> const T* values(int layer) const { return reinterpret_cast<const T*>(v_.data() + offset(layer, 0)); }
  // The raw bytes of one layer's K and V pools (n_blocks * kKvBlockSize rows
  // of row_bytes each): what the tests copy to the GPU and compare with it.
  const uint8_t* key_bytes(int layer) const { return k_.data() + offset(layer, 0); }
  const uint8_t* value_bytes(int layer) const { return v_.data() + offset(layer, 0); }

 private:
  uint64_t offset(int layer, int64_t row) const {
    return (static_cast<uint64_t>(layer) * n_blocks_ * backend::kKvBlockSize + static_cast<uint64_t>(row)) * row_bytes_;
  }

  int n_layer_, n_blocks_, kv_dim_;
  backend::KvType type_;
  uint64_t row_bytes_;
  std::vector<uint8_t> k_, v_;
};

inline float kv_to_float(uint16_t h) { return quant::half_to_float(h); }
inline float kv_to_float(float f) { return f; }

}  // namespace m40::cpu

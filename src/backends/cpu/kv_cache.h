// The CPU backend's KV cache: a pool of blocks (kv_blocks.h) holding, for
// every layer, K and V of kKvBlockSize positions each, as FP16 (the
// design's default) or FP32 (for bit-tight comparisons with llama.cpp's
// F32-cache reference). Which block holds which sequence's positions is the
// block tables' business (backend::BlockTables); here rows are pool rows.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "backends/kv_blocks.h"
#include "quant/fp16.h"

namespace m40::cpu {

class KvCache {
 public:
  KvCache(int n_layer, int n_blocks, int kv_dim, backend::KvType type);

  backend::KvType type() const { return type_; }
  int n_blocks() const { return n_blocks_; }
  uint64_t bytes() const { return k_.size() + v_.size(); }

  // K and V of one position into pool row `row` (block * kKvBlockSize + offset).
  void store(int layer, int64_t row, const float* k, const float* v);
  // Copies every layer's rows of block `src` to block `dst`.
  void copy_block(int32_t src, int32_t dst);

  // The layer's pool: row r at r * kv_dim. Element type T is uint16_t (F16
  // bits) or float, matching type().
  template <class T> const T* keys(int layer) const { return reinterpret_cast<const T*>(k_.data() + offset(layer, 0)); }
  template <class T> const T* values(int layer) const { return reinterpret_cast<const T*>(v_.data() + offset(layer, 0)); }

 private:
  uint64_t offset(int layer, int64_t row) const {
    return (static_cast<uint64_t>(layer) * n_blocks_ * backend::kKvBlockSize + static_cast<uint64_t>(row)) * kv_dim_ *
           element_bytes_;
  }

  int n_layer_, n_blocks_, kv_dim_;
  backend::KvType type_;
  uint64_t element_bytes_;
  std::vector<uint8_t> k_, v_;
};

inline float kv_to_float(uint16_t h) { return quant::half_to_float(h); }
inline float kv_to_float(float f) { return f; }

}  // namespace m40::cpu

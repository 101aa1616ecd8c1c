// The CPU backend's KV cache: for every layer and sequence slot, K and V of
// each position, as FP16 (the design's default) or FP32 (for bit-tight
// comparisons with llama.cpp's F32-cache reference).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "quant/fp16.h"

namespace m40::cpu {

class KvCache {
 public:
  KvCache(int n_layer, int n_seq, int n_ctx, int kv_dim, backend::KvType type);

  backend::KvType type() const { return type_; }
  int n_ctx() const { return n_ctx_; }
  int n_seq() const { return n_seq_; }
  uint64_t bytes() const { return k_.size() + v_.size(); }

  void store(int layer, int seq, int pos, const float* k, const float* v);

  // Element type T is uint16_t (F16 bits) or float, matching type().
  template <class T> const T* keys(int layer, int seq) const {
    return reinterpret_cast<const T*>(k_.data() + offset(layer, seq, 0));
  }
  template <class T> const T* values(int layer, int seq) const {
    return reinterpret_cast<const T*>(v_.data() + offset(layer, seq, 0));
  }

 private:
  uint64_t offset(int layer, int seq, int pos) const {
    return ((static_cast<uint64_t>(layer) * n_seq_ + seq) * n_ctx_ + pos) * kv_dim_ * element_bytes_;
  }

  int n_layer_, n_seq_, n_ctx_, kv_dim_;
  backend::KvType type_;
  uint64_t element_bytes_;
  std::vector<uint8_t> k_, v_;
};

inline float kv_to_float(uint16_t h) { return quant::half_to_float(h); }
inline float kv_to_float(float f) { return f; }

}  // namespace m40::cpu

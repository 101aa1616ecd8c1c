#include "backends/cpu/kv_cache.h"

#include <cstring>

#include "common/error.h"

namespace m40::cpu {

KvCache::KvCache(int n_layer, int n_blocks, int kv_dim, backend::KvType type)
    : n_layer_(n_layer), n_blocks_(n_blocks), kv_dim_(kv_dim), type_(type),
      element_bytes_(type == backend::KvType::F16 ? 2 : 4) {
  const uint64_t bytes =
      static_cast<uint64_t>(n_layer) * n_blocks * backend::kKvBlockSize * static_cast<uint64_t>(kv_dim) * element_bytes_;
  try {
    k_.resize(bytes);
    v_.resize(bytes);
  } catch (const std::bad_alloc&) {
    throw Error("cannot allocate the KV cache (" + std::to_string(2 * bytes >> 20) +
                " MiB): lower the context size with --ctx");
  }
}

void KvCache::copy_block(int32_t src, int32_t dst) {
  if (src == dst) return;
  const uint64_t bytes = static_cast<uint64_t>(backend::kKvBlockSize) * kv_dim_ * element_bytes_;
  for (int l = 0; l < n_layer_; ++l) {
    const int64_t from = static_cast<int64_t>(src) * backend::kKvBlockSize, to = static_cast<int64_t>(dst) * backend::kKvBlockSize;
    std::memcpy(k_.data() + offset(l, to), k_.data() + offset(l, from), bytes);
    std::memcpy(v_.data() + offset(l, to), v_.data() + offset(l, from), bytes);
  }
}

void KvCache::store(int layer, int64_t row, const float* k, const float* v) {
  uint8_t* kd = k_.data() + offset(layer, row);
  uint8_t* vd = v_.data() + offset(layer, row);
  if (type_ == backend::KvType::F32) {
    std::memcpy(kd, k, kv_dim_ * sizeof(float));
    std::memcpy(vd, v, kv_dim_ * sizeof(float));
    return;
  }
  auto* k16 = reinterpret_cast<uint16_t*>(kd);
  auto* v16 = reinterpret_cast<uint16_t*>(vd);
  for (int i = 0; i < kv_dim_; ++i) {
    k16[i] = quant::float_to_half(k[i]);
    v16[i] = quant::float_to_half(v[i]);
  }
}

}  // namespace m40::cpu

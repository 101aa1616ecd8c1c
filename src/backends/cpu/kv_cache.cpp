#include "backends/cpu/kv_cache.h"

#include <cstring>

#include "common/error.h"

namespace m40::cpu {

KvCache::KvCache(int n_layer, int n_seq, int n_ctx, int kv_dim, backend::KvType type)
    : n_layer_(n_layer), n_seq_(n_seq), n_ctx_(n_ctx), kv_dim_(kv_dim), type_(type),
      element_bytes_(type == backend::KvType::F16 ? 2 : 4) {
  const uint64_t bytes = static_cast<uint64_t>(n_layer) * n_seq * n_ctx * kv_dim * element_bytes_;
  try {
    k_.resize(bytes);
    v_.resize(bytes);
  } catch (const std::bad_alloc&) {
    throw Error("cannot allocate the KV cache (" + std::to_string(2 * bytes >> 20) +
                " MiB): lower the context size with --ctx");
  }
}

void KvCache::store(int layer, int seq, int pos, const float* k, const float* v) {
  uint8_t* kd = k_.data() + offset(layer, seq, pos);
  uint8_t* vd = v_.data() + offset(layer, seq, pos);
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

#include "backends/cpu/kv_cache.h"

#include <cstring>
#include <string>

#include "common/error.h"

namespace m40::cpu {

uint64_t KvCache::row_bytes(backend::KvType type, int kv_dim) {
  const auto n = static_cast<uint64_t>(kv_dim);
  switch (type) {
    case backend::KvType::F32: return n * 4;
    case backend::KvType::Q8_0: return n / quant::BlockQ8_0::kValues * sizeof(quant::BlockQ8_0);
    case backend::KvType::F16: break;
  }
  return n * 2;
}

KvCache::KvCache(int n_layer, int n_blocks, int kv_dim, backend::KvType type)
    : n_layer_(n_layer), n_blocks_(n_blocks), kv_dim_(kv_dim), type_(type), row_bytes_(row_bytes(type, kv_dim)) {
  if (type == backend::KvType::Q8_0 && kv_dim % quant::BlockQ8_0::kValues != 0) {
    throw Error("a Q8_0 KV cache needs K/V rows of a multiple of 32 values, this model has " + std::to_string(kv_dim) +
                ": use --kv-type f16");
  }
  const uint64_t bytes = static_cast<uint64_t>(n_layer) * n_blocks * backend::kKvBlockSize * row_bytes_;
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
  const uint64_t bytes = static_cast<uint64_t>(backend::kKvBlockSize) * row_bytes_;
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
  if (type_ == backend::KvType::Q8_0) {  // the CUDA twin (kv_append) runs the same quantize_block_q8_0
    auto* kb = reinterpret_cast<quant::BlockQ8_0*>(kd);
    auto* vb = reinterpret_cast<quant::BlockQ8_0*>(vd);
    for (int b = 0; b < kv_dim_ / quant::BlockQ8_0::kValues; ++b) {
      quant::quantize_block_q8_0(k + b * quant::BlockQ8_0::kValues, kb[b]);
      quant::quantize_block_q8_0(v + b * quant::BlockQ8_0::kValues, vb[b]);
    }
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

// Appending K and V to the FP16 or Q8_0 KV cache of one layer. CPU twin:
// cpu::KvCache::store. The conversion is quant::float_to_half, the same
// integer-only round-to-nearest-even code the CPU runs, or for Q8_0
// quant::quantize_block_q8_0, the CPU's quantizer itself (blocks.h), so the
// cache bytes are identical on both sides.
//
// Layout (paged, as the CPU cache's per-layer pool; backends/kv_blocks.h):
// element d of position pos of sequence seq is at (row * kv_dim + d), row =
// kv_row(block_tables + seq * max_blocks, pos).
// FP16: one thread converts four values of K and four of V (a float4 in,
// eight bytes out) when kv_dim and the pointers allow it, else one of each.
// Q8_0: one thread quantizes one 32-value block of K and the same of V (row
// r's block b at r * kv_dim / 32 + b; kv_dim a multiple of 32).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/pointer_alignment.h"
#include "backends/cuda/cuda_check.h"
#include "backends/kv_blocks.h"
#include "backends/cuda/kv_store.cuh"
#include "backends/cuda/layer_kernels.h"
#include "common/error.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

struct AppendArgs {
  KvLayer cache;  // FP16 bits, or quant::BlockQ8_0 blocks for kv_append_q8_0_kernel
  const float* k;
  const float* v;
  const int32_t* seq_ids;
  const int32_t* positions;
  int n_tokens;
};

// kWidth values per thread: 4 (float4 loads, 8-byte stores) or 1. Tokens
// kv_store_row refuses are skipped.
template <int kWidth>
__global__ void __launch_bounds__(kThreads) kv_append_kernel(AppendArgs a) {
  const int groups_per_token = a.cache.kv_dim / kWidth;
  const int64_t total = static_cast<int64_t>(a.n_tokens) * groups_per_token;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; item < total; item += stride) {
    const int64_t t = item / groups_per_token;
    const int d = static_cast<int>(item % groups_per_token) * kWidth;
    const int64_t row = kv_store_row(a.cache, __ldg(a.seq_ids + t), __ldg(a.positions + t));
    if (row < 0) continue;
    const int64_t dst = row * a.cache.kv_dim + d;
    const int64_t src = t * a.cache.kv_dim + d;
    if constexpr (kWidth == 4) {
      const float4 kf = __ldg(reinterpret_cast<const float4*>(a.k + src));
      const float4 vf = __ldg(reinterpret_cast<const float4*>(a.v + src));
      const auto pack = [](float lo, float hi) {
        return static_cast<uint32_t>(quant::float_to_half(lo)) |
               (static_cast<uint32_t>(quant::float_to_half(hi)) << 16);
      };
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(a.cache.k) + dst) = make_uint2(pack(kf.x, kf.y), pack(kf.z, kf.w));
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(a.cache.v) + dst) = make_uint2(pack(vf.x, vf.y), pack(vf.z, vf.w));
    } else {
      static_cast<uint16_t*>(a.cache.k)[dst] = quant::float_to_half(__ldg(a.k + src));
      static_cast<uint16_t*>(a.cache.v)[dst] = quant::float_to_half(__ldg(a.v + src));
    }
  }
}

// One thread per (token, 32-value block): K's block and V's.
__global__ void __launch_bounds__(kThreads) kv_append_q8_0_kernel(AppendArgs a) {
  constexpr int kValues = quant::BlockQ8_0::kValues;
  const int blocks_per_row = a.cache.kv_dim / kValues;
  const int64_t total = static_cast<int64_t>(a.n_tokens) * blocks_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; item < total; item += stride) {
    const int64_t t = item / blocks_per_row;
    const int b = static_cast<int>(item % blocks_per_row);
    const int64_t row = kv_store_row(a.cache, __ldg(a.seq_ids + t), __ldg(a.positions + t));
    if (row < 0) continue;
    const int64_t dst = row * blocks_per_row + b;
    const int64_t src = t * a.cache.kv_dim + static_cast<int64_t>(b) * kValues;
    quantize_into(a.k + src, static_cast<quant::BlockQ8_0*>(a.cache.k) + dst);
    quantize_into(a.v + src, static_cast<quant::BlockQ8_0*>(a.cache.v) + dst);
  }
}


}  // namespace

void check_kv_layer(const KvLayer& cache, const char* op) {
  if (cache.n_ctx <= 0 || cache.kv_dim <= 0) {
    throw Error(std::string(op) + ": bad cache shape (n_ctx " + std::to_string(cache.n_ctx) + ", kv_dim " +
                std::to_string(cache.kv_dim) + ")");
  }
  if (cache.type == KvFormat::Q8_0 && cache.kv_dim % quant::BlockQ8_0::kValues != 0) {
    throw Error(std::string(op) + ": a Q8_0 cache needs kv_dim to be a multiple of 32, got " +
                std::to_string(cache.kv_dim));
  }
  if (cache.block_tables == nullptr || cache.max_blocks < backend::kv_blocks_for(cache.n_ctx)) {
    throw Error(std::string(op) + ": the cache needs block tables of at least " +
                std::to_string(backend::kv_blocks_for(cache.n_ctx)) + " entries per sequence (got " +
                std::to_string(cache.max_blocks) + ")");
  }
}

void kv_append(const KvLayer& cache, const float* k, const float* v, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, cudaStream_t stream) {
  check_kv_layer(cache, "kv_append");
  if (n_tokens < 0) throw Error("kv_append: token count " + std::to_string(n_tokens));
  if (n_tokens == 0) return;
  const AppendArgs a{cache, k, v, seq_ids, positions, n_tokens};
  if (cache.type == KvFormat::Q8_0) {
    const int64_t items = static_cast<int64_t>(n_tokens) * (cache.kv_dim / quant::BlockQ8_0::kValues);
    const int blocks = static_cast<int>(std::min((items + kThreads - 1) / kThreads, kMaxBlocks));
    kv_append_q8_0_kernel<<<blocks, kThreads, 0, stream>>>(a);
    M40_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool vec = cache.kv_dim % 4 == 0 && aligned(k, 16) && aligned(v, 16) && aligned(cache.k, 8) &&
                   aligned(cache.v, 8);
  const int64_t items = static_cast<int64_t>(n_tokens) * (vec ? cache.kv_dim / 4 : cache.kv_dim);
  const int blocks = static_cast<int>(std::min((items + kThreads - 1) / kThreads, kMaxBlocks));
  if (vec) {
    kv_append_kernel<4><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    kv_append_kernel<1><<<blocks, kThreads, 0, stream>>>(a);
  }
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda

// The CPU's Q8_0 KV cache: each row is the GGUF Q8_0 encoding of the values
// stored (quant::quantize_row gives the same bytes), rows of a kv_dim that is
// not a multiple of 32 are refused, copy_block moves whole Q8_0 rows, and
// attention reads back what was stored (the dequantized values, q * d).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/block_tables.h"
#include "backends/cpu/kv_cache.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "common/error.h"
#include "quant/quantize.h"

namespace m40 {
namespace {

std::vector<float> random_row(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-3.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = unit(rng);
  return v;
}

TEST(KvCacheQ8_0, RowsAreTheGgufQ8_0EncodingOfTheStoredValues) {
  const int kv_dim = 96, n_blocks = 2;
  cpu::KvCache cache(2, n_blocks, kv_dim, backend::KvType::Q8_0);
  const uint64_t row_bytes = cpu::KvCache::row_bytes(backend::KvType::Q8_0, kv_dim);
  ASSERT_EQ(row_bytes, 3u * 34u);
  EXPECT_EQ(cache.bytes(), 2ull * 2 * n_blocks * backend::kKvBlockSize * row_bytes);  // K and V, 2 layers
  const auto k = random_row(kv_dim, 1), v = random_row(kv_dim, 2);
  cache.store(1, 21, k.data(), v.data());
  std::vector<uint8_t> want_k(row_bytes), want_v(row_bytes);
  quant::quantize_row(gguf::TensorType::Q8_0, k.data(), want_k.data(), kv_dim);
  quant::quantize_row(gguf::TensorType::Q8_0, v.data(), want_v.data(), kv_dim);
  EXPECT_EQ(std::memcmp(cache.key_bytes(1) + 21 * row_bytes, want_k.data(), row_bytes), 0);
  EXPECT_EQ(std::memcmp(cache.value_bytes(1) + 21 * row_bytes, want_v.data(), row_bytes), 0);
  // Dequantized, each value is within half a step of what was stored.
  const auto* blocks = cache.keys<quant::BlockQ8_0>(1) + 21 * (kv_dim / 32);
  for (int i = 0; i < kv_dim; ++i) {
    const auto& b = blocks[i / 32];
    EXPECT_NEAR(quant::dequantize_value(b, i % 32), k[static_cast<size_t>(i)], 0.5f * quant::half_to_float(b.d) + 1e-6f);
  }
}

TEST(KvCacheQ8_0, RowsThatAreNotWholeBlocksAreRefused) {
  EXPECT_THROW(cpu::KvCache(1, 1, 48, backend::KvType::Q8_0), Error);
  EXPECT_NO_THROW(cpu::KvCache(1, 1, 48, backend::KvType::F16));
}

TEST(KvCacheQ8_0, CopyBlockMovesWholeRows) {
  const int kv_dim = 64;
  cpu::KvCache cache(2, 3, kv_dim, backend::KvType::Q8_0);
  const uint64_t row_bytes = cpu::KvCache::row_bytes(backend::KvType::Q8_0, kv_dim);
  for (int layer = 0; layer < 2; ++layer) {
    for (int r = 0; r < backend::kKvBlockSize; ++r) {
      const auto k = random_row(kv_dim, 10 + r + 100 * layer), v = random_row(kv_dim, 50 + r + 100 * layer);
      cache.store(layer, r, k.data(), v.data());  // block 0
    }
  }
  cache.copy_block(0, 2);
  const uint64_t block_bytes = backend::kKvBlockSize * row_bytes;
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(std::memcmp(cache.key_bytes(layer) + 2 * block_bytes, cache.key_bytes(layer), block_bytes), 0);
    EXPECT_EQ(std::memcmp(cache.value_bytes(layer) + 2 * block_bytes, cache.value_bytes(layer), block_bytes), 0);
  }
}

// One head, one key: the output is V's dequantized row (softmax of one score).
TEST(KvCacheQ8_0, AttentionReadsTheDequantizedValues) {
  const int head_dim = 64;
  cpu::KvCache cache(1, 1, head_dim, backend::KvType::Q8_0);
  const auto k = random_row(head_dim, 3), v = random_row(head_dim, 4), q = random_row(head_dim, 5);
  backend::BlockTables tables(1, backend::kKvBlockSize, 1);
  cache.store(0, 0, k.data(), v.data());
  std::vector<float> out(head_dim, NAN);
  const int32_t seq = 0, pos = 0;
  cpu::ThreadPool pool(1);
  cpu::attention(cache, 0, cpu::AttentionShape{1, 1, head_dim, 0.125f, 0.0f, 0}, q.data(), &seq, &pos, 1, tables,
                 out.data(), pool);
  const auto* blocks = cache.values<quant::BlockQ8_0>(0);
  for (int i = 0; i < head_dim; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], quant::dequantize_value(blocks[i / 32], i % 32));
}

}  // namespace
}  // namespace m40

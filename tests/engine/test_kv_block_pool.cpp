// The engine's ledger of KV blocks: allocation, reference counts, the
// prefix index (exact, whole blocks, chained), partly filled blocks on offer
// for copying, and least-recently-used eviction of cached blocks.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

#include "backends/kv_blocks.h"
#include "common/error.h"
#include "engine/kv_block_pool.h"

namespace m40 {
namespace {

using engine::KvBlockPool;
constexpr int B = backend::kKvBlockSize;

std::vector<int32_t> tokens_from(int32_t first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Holds blocks for `tokens` as a sequence would: allocates, then publishes
// each full one in order.
std::vector<int32_t> fill(KvBlockPool& pool, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> blocks;
  uint64_t parent = KvBlockPool::kRootHash;
  for (int b = 0; b < backend::kv_blocks_for(static_cast<int>(tokens.size())); ++b) {
    blocks.push_back(*pool.allocate());
    if ((b + 1) * B <= static_cast<int>(tokens.size())) {
      parent = pool.publish(blocks.back(), parent, std::span(tokens).subspan(static_cast<size_t>(b) * B, B));
    }
  }
  return blocks;
}

TEST(KvBlockPool, AllocatesEveryBlockOnceThenNone) {
  KvBlockPool pool(5);
  std::set<int32_t> seen;
  for (int i = 0; i < 5; ++i) {
    auto b = pool.allocate();
    ASSERT_TRUE(b);
    EXPECT_TRUE(seen.insert(*b).second);
    EXPECT_GE(*b, 0);
    EXPECT_LT(*b, 5);
  }
  EXPECT_FALSE(pool.allocate());
  EXPECT_EQ(pool.available(), 0);
  pool.release(*seen.begin());
  EXPECT_EQ(pool.available(), 1);
  EXPECT_TRUE(pool.allocate());
}

TEST(KvBlockPool, ASecondSequenceReusesTheFullBlocksOfTheSamePrefix) {
  KvBlockPool pool(16);
  const auto first = tokens_from(100, 3 * B + 5);  // three full blocks and a partial one
  const auto held = fill(pool, first);
  // Same first 2.5 blocks, then different.
  auto second = tokens_from(100, 2 * B + 8);
  second.push_back(7);
  const auto prefix = pool.acquire_prefix(second, 100);
  ASSERT_EQ(prefix.blocks.size(), 2u);
  EXPECT_EQ(prefix.blocks[0], held[0]);
  EXPECT_EQ(prefix.blocks[1], held[1]);
  EXPECT_EQ(prefix.hashes[1], KvBlockPool::chain_hash(prefix.hashes[0], std::span(first).subspan(B, B)));
  // max_blocks bounds the match.
  const auto one = pool.acquire_prefix(first, 1);
  EXPECT_EQ(one.blocks.size(), 1u);
}

TEST(KvBlockPool, ABlockMatchesOnlyAfterTheSamePrefix) {
  KvBlockPool pool(16);
  const auto a = tokens_from(0, 2 * B);
  fill(pool, a);
  // The second block's tokens after another first block: no match at all,
  // and none for the second block alone.
  std::vector<int32_t> b = tokens_from(1000, B);
  b.insert(b.end(), a.begin() + B, a.end());
  EXPECT_TRUE(pool.acquire_prefix(b, 100).blocks.empty());
  // One token changed in the first block: nothing.
  auto c = a;
  c[3] = 99999;
  EXPECT_TRUE(pool.acquire_prefix(c, 100).blocks.empty());
}

TEST(KvBlockPool, ReleasedIndexedBlocksStayCachedAndAreEvictedLeastRecentlyUsedFirst) {
  KvBlockPool pool(4);
  const auto a = tokens_from(0, 2 * B);
  const auto a_blocks = fill(pool, a);
  for (int32_t blk : a_blocks) pool.release(blk);
  EXPECT_EQ(pool.cached(), 2);
  EXPECT_EQ(pool.available(), 4);
  EXPECT_EQ(pool.in_use(), 0);
  // Still matchable after release.
  auto again = pool.acquire_prefix(a, 100);
  ASSERT_EQ(again.blocks.size(), 2u);
  EXPECT_EQ(pool.cached(), 0);
  for (int32_t blk : again.blocks) pool.release(blk);
  // Two unused blocks go first; then the least recently released cached
  // block (a's first: released before its second) is evicted.
  auto x = pool.allocate();
  auto y = pool.allocate();
  ASSERT_TRUE(x && y);
  EXPECT_EQ(pool.cached(), 2);
  auto z = pool.allocate();
  ASSERT_TRUE(z);
  EXPECT_EQ(*z, again.blocks[0]);
  EXPECT_EQ(pool.cached(), 1);
  // The first block is gone, so the prefix no longer matches at all.
  EXPECT_TRUE(pool.acquire_prefix(a, 100).blocks.empty());
}

TEST(KvBlockPool, AHeldBlockIsNeverEvicted) {
  KvBlockPool pool(2);
  const auto a = tokens_from(0, B);
  const auto held = fill(pool, a);  // one block, held
  auto other = pool.allocate();
  ASSERT_TRUE(other);
  EXPECT_FALSE(pool.allocate());
  const auto still = pool.acquire_prefix(a, 1);
  ASSERT_EQ(still.blocks.size(), 1u);
  EXPECT_EQ(still.blocks[0], held[0]);
}

TEST(KvBlockPool, ADuplicateBlockStaysOutOfTheIndexAndIsFreedOnRelease) {
  KvBlockPool pool(4);
  const auto a = tokens_from(0, B);
  const auto first = fill(pool, a);
  const auto second = fill(pool, a);  // computed twice (two requests at once)
  EXPECT_NE(first[0], second[0]);
  pool.release(second[0]);
  EXPECT_EQ(pool.cached(), 0);  // freed, not cached
  pool.release(first[0]);
  EXPECT_EQ(pool.cached(), 1);
}

// A partly filled block on offer: found after its own prefix by the longest
// common beginning (whole blocks too), held for the copy, cached after
// release, gone once evicted.
TEST(KvBlockPool, APartlyFilledBlockOnOfferIsFoundByItsCommonBeginning) {
  KvBlockPool pool(4);
  const auto tokens = tokens_from(100, B + 5);  // one whole block and 5 positions
  auto blocks = fill(pool, tokens);
  const uint64_t first_hash = KvBlockPool::chain_hash(KvBlockPool::kRootHash, std::span(tokens).first(B));
  pool.publish_partial(blocks[1], first_hash, std::span(tokens).subspan(B, 5));
  for (int32_t b : blocks) pool.release(b);
  EXPECT_EQ(pool.cached(), 2);

  // Three of the five positions agree; after another prefix nothing does.
  std::vector<int32_t> wanted = {tokens[B], tokens[B + 1], tokens[B + 2], 7, 8};
  EXPECT_FALSE(pool.match_partial(KvBlockPool::kRootHash + 1, wanted));
  EXPECT_FALSE(pool.match_partial(first_hash, std::vector<int32_t>{7}));
  const auto match = pool.match_partial(first_hash, wanted);
  ASSERT_TRUE(match);
  EXPECT_EQ(match->block, blocks[1]);
  EXPECT_EQ(match->length, 3);
  EXPECT_FALSE(match->can_take_over);  // its other two positions stay on offer
  EXPECT_EQ(pool.cached(), 1);  // held for the copy
  pool.release(match->block);
  // Continuing all five: the block may become the caller's own.
  auto all = wanted;
  std::copy(tokens.begin() + B, tokens.end(), all.begin());
  all.push_back(9);
  const auto continued = pool.match_partial(first_hash, all);
  ASSERT_TRUE(continued);
  EXPECT_EQ(continued->length, 5);
  EXPECT_TRUE(continued->can_take_over);
  pool.release(continued->block);
  // A whole indexed block is a candidate too: its first positions.
  const auto whole = pool.match_partial(KvBlockPool::kRootHash, std::span(tokens).first(4));
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->block, blocks[0]);
  EXPECT_EQ(whole->length, 4);
  pool.release(whole->block);

  // Evicted (every block allocated), the offer is gone.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.allocate());
  EXPECT_FALSE(pool.match_partial(first_hash, wanted));
}

// The holder may go on filling an offered block: a longer offer replaces
// its shorter one, an offer another block covers adds nothing, and
// publishing it full keeps it a candidate with its whole tokens.
TEST(KvBlockPool, AnOfferGrowsAndBecomesAWholeBlock) {
  KvBlockPool pool(4);
  const auto tokens = tokens_from(300, B);
  const int32_t a = *pool.allocate();
  pool.publish_partial(a, KvBlockPool::kRootHash, std::span(tokens).first(3));
  pool.publish_partial(a, KvBlockPool::kRootHash, std::span(tokens).first(9));
  auto m = pool.match_partial(KvBlockPool::kRootHash, tokens);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->length, 9);
  pool.release(m->block);
  // b offers what a covers already: a stays the only candidate, so b is
  // freed (not cached) on release.
  const int32_t b = *pool.allocate();
  pool.publish_partial(b, KvBlockPool::kRootHash, std::span(tokens).first(5));
  pool.release(b);
  EXPECT_EQ(pool.cached(), 0);
  pool.publish(a, KvBlockPool::kRootHash, tokens);
  m = pool.match_partial(KvBlockPool::kRootHash, tokens);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->block, a);
  EXPECT_EQ(m->length, B);
  pool.release(m->block);
  pool.release(a);
  EXPECT_EQ(pool.cached(), 1);
  EXPECT_THROW(pool.publish_partial(a, KvBlockPool::kRootHash, std::span(tokens).first(3)), Error);  // not held
  const int32_t c = *pool.allocate();
  EXPECT_THROW(pool.publish_partial(c, KvBlockPool::kRootHash, tokens), Error);  // a whole block's worth
}

TEST(KvBlockPool, MisuseIsAnError) {
  KvBlockPool pool(2);
  EXPECT_THROW(pool.release(0), Error);
  EXPECT_THROW(pool.release(7), Error);
  const auto a = tokens_from(0, B);
  EXPECT_THROW(pool.publish(0, KvBlockPool::kRootHash, a), Error);  // not held
  auto b = pool.allocate();
  EXPECT_THROW(pool.publish(*b, KvBlockPool::kRootHash, std::span(a).first(B - 1)), Error);
  EXPECT_THROW(KvBlockPool(0), Error);
}

}  // namespace
}  // namespace m40

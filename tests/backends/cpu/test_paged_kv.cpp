// The CPU backend reads K and V through block tables (backends/kv_blocks.h):
// a shuffled table, a prefix shared from another sequence's blocks and a
// copied partial block all give exactly the logits of the default layout
// (F32 cache: the same arithmetic in the same order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/kv_blocks.h"
#include "common/error.h"
#include "model/loaded_model.h"
#include "test_paths.h"

namespace m40 {
namespace {

constexpr int B = backend::kKvBlockSize;

class PagedKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    model_ = model::LoadedModel::open(path.string());
    tokens_.resize(70);
    std::mt19937 rng(7);
    for (auto& t : tokens_) t = static_cast<int32_t>(rng() % model_->hparams.n_vocab);
  }
  std::unique_ptr<cpu::CpuBackend> backend(int n_seq, int kv_blocks) const {
    return std::make_unique<cpu::CpuBackend>(
        model_->hparams, model_->weights,
        cpu::CpuBackendOptions{.n_ctx = 128, .n_seq = n_seq, .kv_blocks = kv_blocks, .kv_type = backend::KvType::F32, .threads = 2});
  }
  // Feeds tokens_[from, to) of `seq` at their positions; the logits of the
  // last one, poisoned first.
  std::vector<float> feed(backend::Backend& b, int seq, int from, int to) const {
    backend::Batch batch;
    for (int p = from; p < to; ++p) batch.add(tokens_[p], p, seq, p + 1 == to);
    std::vector<float> logits(model_->hparams.n_vocab, std::nanf(""));
    b.forward(batch, logits);
    return logits;
  }
  std::unique_ptr<model::LoadedModel> model_;
  std::vector<int32_t> tokens_;
};

TEST_F(PagedKvTest, AShuffledBlockTableGivesTheSameLogits) {
  auto plain_owner = backend(1, 0);
  auto& plain = *plain_owner;
  const auto expected = feed(plain, 0, 0, 40);
  const auto expected_next = feed(plain, 0, 40, 41);
  ASSERT_FALSE(std::isnan(expected[0]));

  auto paged_owner = backend(1, 16);
  auto& paged = *paged_owner;
  std::vector<int32_t> table = {11, 3, 14};  // 48 positions in scattered blocks
  paged.set_blocks(0, table, 0);
  EXPECT_EQ(feed(paged, 0, 0, 40), expected);
  EXPECT_EQ(feed(paged, 0, 40, 41), expected_next);
}

TEST_F(PagedKvTest, AnotherSequenceContinuesFromSharedFullBlocks) {
  auto ref_owner = backend(1, 0);
  auto& ref = *ref_owner;
  const auto expected = feed(ref, 0, 0, 70);

  auto paged_owner = backend(2, 16);
  auto& paged = *paged_owner;
  paged.set_blocks(0, std::vector<int32_t>{5, 9, 2}, 0);
  feed(paged, 0, 0, 40);  // blocks 5 and 9 are full, 2 half
  // Sequence 1 shares the two full blocks and continues in its own.
  paged.set_blocks(1, std::vector<int32_t>{5, 9, 12, 0, 7}, 2 * B);
  EXPECT_EQ(feed(paged, 1, 2 * B, 70), expected);
}

TEST_F(PagedKvTest, ACopiedPartialBlockContinuesLikeTheOriginal) {
  auto ref_owner = backend(1, 0);
  auto& ref = *ref_owner;
  const auto expected = feed(ref, 0, 0, 50);

  auto paged_owner = backend(2, 16);
  auto& paged = *paged_owner;
  paged.set_blocks(0, std::vector<int32_t>{4, 6, 1}, 0);
  feed(paged, 0, 0, 40);
  paged.copy_block(1, 10);  // the half-full third block, copied before writing to it
  paged.set_blocks(1, std::vector<int32_t>{4, 6, 10, 13}, 40);
  EXPECT_EQ(feed(paged, 1, 40, 50), expected);
}

TEST_F(PagedKvTest, BadTablesAndPositionsPastTheBlocksAreRefused) {
  auto paged_owner = backend(2, 8);
  auto& paged = *paged_owner;
  EXPECT_THROW(paged.set_blocks(2, std::vector<int32_t>{0}, 0), Error);          // no such sequence
  EXPECT_THROW(paged.set_blocks(0, std::vector<int32_t>{8}, 0), Error);          // outside the pool
  EXPECT_THROW(paged.set_blocks(0, std::vector<int32_t>(9, 0), 0), Error);       // more than a context needs
  EXPECT_THROW(paged.set_blocks(0, std::vector<int32_t>{1}, B + 1), Error);      // more cached than held
  EXPECT_THROW(paged.copy_block(0, 8), Error);
  paged.set_blocks(0, std::vector<int32_t>{3}, 0);
  EXPECT_THROW(feed(paged, 0, 0, B + 1), Error);  // position 16 is past its one block
  // A pool smaller than a context per sequence starts with no blocks.
  EXPECT_THROW(feed(paged, 1, 0, 1), Error);
  EXPECT_EQ(paged.n_kv_blocks(), 8);
}

}  // namespace
}  // namespace m40

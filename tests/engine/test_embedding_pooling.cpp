// Pooling and normalization of embeddings (engine/embedding_pooling.h) on
// hand-made hidden states: what each pooling keeps, in any chunking, and
// the normalization and truncation the APIs apply.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "engine/embedding_pooling.h"

using namespace m40;
using model::PoolingType;

namespace {

// The hidden state of position p: row p of a 2-wide table, distinct values.
std::vector<float> row(int p) { return {static_cast<float>(p + 1), static_cast<float>(-2 * p)}; }

std::vector<float> pool(PoolingType pooling, int n_tokens) {
  engine::EmbeddingPooler pooler(pooling, 2, n_tokens);
  for (int p = 0; p < n_tokens; ++p) {
    if (pooler.wants(p)) pooler.add(p, row(p));
  }
  EXPECT_TRUE(pooler.complete());
  return pooler.pooled();
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

}  // namespace

TEST(EmbeddingPooling, MeanAveragesEveryToken) {
  // Rows (1, 0), (2, -2), (3, -4), (4, -6): the mean is (2.5, -3).
  EXPECT_EQ(pool(PoolingType::Mean, 4), (std::vector<float>{2.5f, -3.0f}));
}

TEST(EmbeddingPooling, ClsTakesTheFirstTokenAndLastTheLast) {
  EXPECT_EQ(pool(PoolingType::Cls, 5), row(0));
  EXPECT_EQ(pool(PoolingType::Last, 5), row(4));
  EXPECT_EQ(pool(PoolingType::Last, 1), row(0));
}

TEST(EmbeddingPooling, OnlyTheNeededHiddenStatesAreAskedFor) {
  engine::EmbeddingPooler mean(PoolingType::Mean, 2, 3), cls(PoolingType::Cls, 2, 3), last(PoolingType::Last, 2, 3);
  for (int p = 0; p < 3; ++p) {
    EXPECT_TRUE(mean.wants(p));
    EXPECT_EQ(cls.wants(p), p == 0);
    EXPECT_EQ(last.wants(p), p == 2);
  }
  EXPECT_FALSE(mean.wants(3));
  EXPECT_THROW(cls.add(1, row(1)), Error);           // not wanted
  const std::vector<float> wide = {1.0f, 2.0f, 3.0f};
  EXPECT_THROW(mean.add(0, wide), Error);  // wrong width
  EXPECT_FALSE(mean.complete());
  EXPECT_THROW(mean.pooled(), Error);  // incomplete
}

TEST(EmbeddingPooling, ChunkingDoesNotChangeTheMean) {
  // A long text read in chunks sums exactly as one pass would (in double).
  const int n = 1000;
  engine::EmbeddingPooler chunked(PoolingType::Mean, 2, n);
  double sum0 = 0, sum1 = 0;
  for (int p = 0; p < n; ++p) {
    const std::vector<float> r = {0.001f * static_cast<float>(p % 7), 1.0f / static_cast<float>(p + 1)};
    chunked.add(p, r);
    sum0 += r[0];
    sum1 += r[1];
  }
  const auto v = chunked.pooled();
  EXPECT_FLOAT_EQ(v[0], static_cast<float>(sum0 / n));
  EXPECT_FLOAT_EQ(v[1], static_cast<float>(sum1 / n));
}

TEST(EmbeddingPooling, OnlyMeanClsAndLastPool) {
  EXPECT_THROW(engine::EmbeddingPooler(PoolingType::None, 2, 3), Error);
  EXPECT_THROW(engine::EmbeddingPooler(PoolingType::Rank, 2, 3), Error);
  EXPECT_THROW(engine::EmbeddingPooler(PoolingType::Mean, 2, 0), Error);
}

TEST(EmbeddingPooling, AModelsPoolingIsItsOwnElseLastToken) {
  model::ModelHparams hp;
  hp.architecture = "qwen3";
  EXPECT_EQ(engine::embedding_pooling(hp), PoolingType::Last);  // generative: none declared
  hp.pooling = PoolingType::None;
  EXPECT_EQ(engine::embedding_pooling(hp), PoolingType::Last);
  for (auto p : {PoolingType::Mean, PoolingType::Cls, PoolingType::Last}) {
    hp.pooling = p;
    EXPECT_EQ(engine::embedding_pooling(hp), p);
  }
  hp.pooling = PoolingType::Rank;
  try {
    engine::embedding_pooling(hp);
    FAIL() << "a reranker embeds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3.pooling_type"), std::string::npos) << e.what();
  }
}

TEST(EmbeddingPooling, NormalizationGivesLengthOne) {
  std::vector<float> v = {3.0f, -4.0f};
  engine::l2_normalize(v);
  EXPECT_FLOAT_EQ(v[0], 0.6f);
  EXPECT_FLOAT_EQ(v[1], -0.8f);
  std::vector<float> zero = {0.0f, 0.0f};
  engine::l2_normalize(zero);  // stays zero, no NaN
  EXPECT_EQ(zero, (std::vector<float>{0.0f, 0.0f}));
  std::vector<float> tiny = {1e-30f, 1e-30f, 1e-30f, 1e-30f};  // squares underflow in float, not in double
  engine::l2_normalize(tiny);
  EXPECT_NEAR(norm(tiny), 1.0, 1e-6);
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THROW(engine::l2_normalize(bad), Error);
  std::vector<float> inf = {std::numeric_limits<float>::infinity()};
  EXPECT_THROW(engine::l2_normalize(inf), Error);
}

TEST(EmbeddingPooling, TruncationKeepsTheFirstValuesRenormalized) {
  std::vector<float> v = {0.6f, 0.0f, -0.8f, 0.0f};
  const auto two = engine::truncate_embedding(v, 2);
  EXPECT_EQ(two, (std::vector<float>{1.0f, 0.0f}));
  const auto three = engine::truncate_embedding(v, 3);
  EXPECT_FLOAT_EQ(three[0], 0.6f);
  EXPECT_FLOAT_EQ(three[2], -0.8f);
  EXPECT_EQ(engine::truncate_embedding(v, 4).size(), 4u);
  EXPECT_THROW(engine::truncate_embedding(v, 0), Error);
  EXPECT_THROW(engine::truncate_embedding(v, 5), Error);
}

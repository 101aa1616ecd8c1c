// A row split's plan (model/row_split.h): the shards cover every KV head
// and FFN column once, in order and in proportion to their shares; their
// columns of the output and down products start on blocks of the tensors'
// types and tile each row; models that cannot be divided so are refused
// with the reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/loaded_model.h"
#include "model/row_split.h"
#include "test_paths.h"

namespace m40 {
namespace {

std::unique_ptr<model::LoadedModel> open_shared(const std::string& name) {
  const auto path = test::shared_model(name);
  if (!std::filesystem::exists(path)) return nullptr;
  return model::LoadedModel::open(path.string());
}

std::string error_of(const model::LoadedModel& m, std::vector<double> shares) {
  try {
    model::plan_row_split(m.hparams, m.weights, shares);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RowSplit, ShardsCoverEveryHeadAndColumnOnceWithTheirSlicesTilingEachRow) {
  for (const char* name : {"TinyStories-656K-Q8_0.gguf", "synthetic/tiny-llama-rand-Q4_0.gguf", "arch/tiny-qwen2-Q8_0.gguf",
                           "arch/tiny-phi3-F32.gguf", "arch/tiny-gemma2-F32.gguf"}) {
    const auto m = open_shared(name);
    if (m == nullptr) GTEST_SKIP() << "shared models not found";
    const auto& hp = m->hparams;
    const std::vector<double> shares = {1, 1};
    const auto shards = model::plan_row_split(hp, m->weights, shares);
    ASSERT_EQ(shards.size(), 2u) << name;
    uint32_t next_head = 0;
    uint64_t next_ff = 0, q_rows = 0, heads = 0;
    for (const model::RowShard& s : shards) {
      EXPECT_EQ(s.kv_head_first, next_head) << name;
      EXPECT_EQ(s.ff_first, next_ff) << name;
      EXPECT_LT(s.kv_head_first, s.kv_head_end) << name;
      EXPECT_LT(s.ff_first, s.ff_end) << name;
      next_head = s.kv_head_end;
      next_ff = s.ff_end;
      const model::ModelHparams sh = model::shard_hparams(hp, s);
      EXPECT_EQ(sh.n_head_kv, s.kv_head_end - s.kv_head_first) << name;
      EXPECT_EQ(sh.n_gqa(), hp.n_gqa()) << name;
      EXPECT_EQ(sh.n_ff, s.ff_end - s.ff_first) << name;
      EXPECT_EQ(sh.n_embd, hp.n_embd) << name;
      const model::ShardRows r = model::shard_rows(hp, s);
      EXPECT_EQ(r.q_end - r.q_first, sh.q_dim()) << name;
      EXPECT_EQ(r.kv_end - r.kv_first, sh.kv_dim()) << name;
      q_rows += r.q_end - r.q_first;
      heads += sh.n_head;
    }
    EXPECT_EQ(next_head, hp.n_head_kv) << name;
    EXPECT_EQ(next_ff, hp.n_ff) << name;
    EXPECT_EQ(q_rows, hp.q_dim()) << name;
    EXPECT_EQ(heads, hp.n_head) << name;
    // Each layer's output and down rows are tiled by the shards' slices.
    for (const model::LayerWeights& l : m->weights.layers) {
      uint64_t wo_offset = 0, down_offset = 0;
      for (const model::RowShard& s : shards) {
        const model::ShardRows r = model::shard_rows(hp, s);
        const model::ColumnSlice wo = model::column_slice(l.wo, r.q_first, r.q_end);
        const model::ColumnSlice down = model::column_slice(l.w_down, r.ff_first, r.ff_end);
        EXPECT_EQ(wo.offset, wo_offset) << name;
        EXPECT_EQ(down.offset, down_offset) << name;
        wo_offset += wo.bytes;
        down_offset += down.bytes;
      }
      EXPECT_EQ(wo_offset, l.wo.row_bytes) << name;
      EXPECT_EQ(down_offset, l.w_down.row_bytes) << name;
    }
  }
}

// TinyStories: 4 KV heads (Q8_0 output product: one head a unit) and 384
// FFN columns (12 blocks of 32), divided 3:1.
TEST(RowSplit, SharesDivideInProportion) {
  const auto m = open_shared("TinyStories-656K-Q8_0.gguf");
  if (m == nullptr) GTEST_SKIP() << "shared models not found";
  const std::vector<double> shares = {24, 8};
  const auto shards = model::plan_row_split(m->hparams, m->weights, shares);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].kv_head_end, 3u);
  EXPECT_EQ(shards[0].ff_end, 288u);
  EXPECT_EQ(shards[1].kv_head_end, 4u);
  EXPECT_EQ(shards[1].ff_end, 384u);
  // Four devices: one head each; a tiny share still gets one unit.
  const std::vector<double> four = {1, 1, 1, 1};
  const auto quarters = model::plan_row_split(m->hparams, m->weights, four);
  ASSERT_EQ(quarters.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(quarters[static_cast<size_t>(i)].kv_head_end, static_cast<uint32_t>(i + 1));
  const std::vector<double> lopsided = {1000, 1};
  const auto skewed = model::plan_row_split(m->hparams, m->weights, lopsided);
  EXPECT_EQ(skewed[1].kv_head_end - skewed[1].kv_head_first, 1u);
  EXPECT_GE(skewed[1].ff_end - skewed[1].ff_first, 32u);
}

TEST(RowSplit, ModelsThatCannotBeDividedSoAreRefusedWithTheReason) {
  // Q4_K output product (blocks of 256) over 2 KV heads of 2 x 64 columns:
  // one group of both heads, not two.
  if (const auto m = open_shared("synthetic/tiny-llama-rand-Q4_K_M.gguf")) {
    const std::string e = error_of(*m, {1, 1});
    EXPECT_NE(e.find("2 KV heads in 1 groups of 2"), std::string::npos) << e;
    EXPECT_NE(e.find("--split-mode layer"), std::string::npos) << e;
  }
  if (const auto m = open_shared("arch/tiny-granite-F32.gguf")) {  // one KV head
    EXPECT_NE(error_of(*m, {1, 1}).find("1 KV heads"), std::string::npos);
    EXPECT_EQ(error_of(*m, {1}), "") << "one device takes the whole model";
  }
  if (const auto m = open_shared("arch/tiny-qwen3moe-Q8_0.gguf")) {
    EXPECT_NE(error_of(*m, {1, 1}).find("has experts"), std::string::npos);
  }
  const auto m = open_shared("TinyStories-656K-Q8_0.gguf");
  if (m == nullptr) GTEST_SKIP() << "shared models not found";
  EXPECT_NE(error_of(*m, {1, 0}).find("positive"), std::string::npos);
  EXPECT_NE(error_of(*m, {}).find("at least one"), std::string::npos);
  EXPECT_NE(error_of(*m, {1, 1, 1, 1, 1}).find("for 5 devices"), std::string::npos);
  // A column range off the blocks of the tensor's type.
  EXPECT_THROW(model::column_slice(m->weights.layers[0].wo, 16, 64), Error);
  EXPECT_THROW(model::column_slice(m->weights.layers[0].wo, 0, 0), Error);
}

}  // namespace
}  // namespace m40

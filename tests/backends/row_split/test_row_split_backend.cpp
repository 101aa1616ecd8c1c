// A model split by rows into CPU shards (cpu::make_row_split_backend, the
// reference of the CUDA row split) answers as the whole model: a prompt
// read at once (logits at every position), a second sequence, decode steps
// of both, a step mixing a decode token with a prompt chunk, and a block
// copied on write; two, three and four shards, equal and unequal shares.
// The shards' sums run in another order than the whole model's products
// (each shard's heads and FFN columns, then the shards added in order), so
// the logits agree to rounding, not bit for bit. A bad batch fails every
// shard and the next step runs; a shard alone refuses forward().
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/row_split.h"
#include "backends/kv_blocks.h"
#include "common/error.h"
#include "model/loaded_model.h"
#include "test_paths.h"

using namespace m40;

namespace {

// Largest |difference| a split may leave in a logit: FP32 sums in another
// order, through the layers. (The KV cache is FP32 here: in FP16, a last-bit
// difference in K or V may round to a neighbouring half, a 5e-4 step.)
constexpr float kTolerance = 1e-4f;

struct Case {
  std::string model;
  std::vector<double> shares;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << ", shares";
  for (double s : c.shares) *os << " " << s;
}

class RowSplitCpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const auto path = test::shared_model(GetParam().model);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model missing: " << path;
    model_ = model::LoadedModel::open(path.string());
  }
  cpu::CpuBackendOptions options() const {
    cpu::CpuBackendOptions o;
    o.n_ctx = 64;
    o.n_seq = 2;
    o.threads = 1;
    o.kv_type = backend::KvType::F32;
    return o;
  }
  static std::vector<float> run(backend::Backend& b, const backend::Batch& batch) {
    std::vector<float> out(batch.logits_count() * static_cast<size_t>(b.n_vocab()), NAN);
    b.forward(batch, out);
    return out;
  }
  float worst_difference(const std::vector<float>& want, const std::vector<float>& got) const {
    float worst = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::isnan(got[i]) ? INFINITY : std::abs(want[i] - got[i]));
    return worst;
  }
  std::unique_ptr<model::LoadedModel> model_;
};

TEST_P(RowSplitCpu, GivesTheWholeModelsLogits) {
  cpu::CpuBackend whole(model_->hparams, model_->weights, options());
  const auto split = cpu::make_row_split_backend(model_->hparams, model_->weights, options(), GetParam().shares);
  ASSERT_EQ(split->n_shards(), GetParam().shares.size());
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams.n_vocab);
  auto token = [&](int i) { return static_cast<int32_t>((1 + 7919ull * i * i + 104729ull * i) % n_vocab); };
  const auto expect_close = [&](const backend::Batch& batch, const std::string& what) {
    const std::vector<float> want = run(whole, batch);
    const std::vector<float> got = run(*split, batch);
    EXPECT_LE(worst_difference(want, got), kTolerance) << what;
  };

  backend::Batch batch;
  for (int p = 0; p < 20; ++p) batch.add(token(p), p, 0, true);
  expect_close(batch, "the prompt");
  batch.clear();
  for (int p = 0; p < 5; ++p) batch.add(token(100 + p), p, 1, p == 4);
  expect_close(batch, "the second prompt");
  for (int step = 0; step < 3; ++step) {
    batch.clear();
    batch.add(token(200 + step), 20 + step, 0, true);
    batch.add(token(300 + step), 5 + step, 1, true);
    expect_close(batch, "decode step " + std::to_string(step));
  }
  batch.clear();
  batch.add(token(500), 23, 0, true);
  for (int p = 8; p < 11; ++p) batch.add(token(600 + p), p, 1, p == 10);
  expect_close(batch, "a mixed step");
  // Sequence 1 continues from a copy of sequence 0's first block.
  const int per_seq = backend::kv_blocks_for(64);
  const std::vector<int32_t> blocks = {per_seq + 1, per_seq};
  for (backend::Backend* b : {static_cast<backend::Backend*>(&whole), static_cast<backend::Backend*>(split.get())}) {
    b->copy_block(0, per_seq + 1);
    b->set_blocks(1, blocks, backend::kKvBlockSize);
  }
  batch.clear();
  for (int p = backend::kKvBlockSize; p < backend::kKvBlockSize + 3; ++p) batch.add(token(400 + p), p, 1, true);
  expect_close(batch, "after the block copy");
}

std::vector<Case> cases() {
  std::vector<Case> c;
  for (const char* m : {"TinyStories-656K-Q8_0.gguf", "synthetic/tiny-llama-rand-Q4_0.gguf", "synthetic/tiny-llama-rand-F16.gguf",
                        "arch/tiny-qwen2-Q8_0.gguf", "arch/tiny-qwen3-Q8_0.gguf", "arch/tiny-gemma2-F32.gguf",
                        "arch/tiny-gemma3-Q8_0.gguf", "arch/tiny-phi3-F32.gguf", "arch/tiny-mistral3-F32.gguf"}) {
    c.push_back({m, {1, 1}});
  }
  // TinyStories' 4 KV heads and 12 FFN blocks: four shards, and 3:1.
  c.push_back({"TinyStories-656K-Q8_0.gguf", {1, 1, 1, 1}});
  c.push_back({"TinyStories-656K-Q8_0.gguf", {3, 1}});
  return c;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = std::filesystem::path(info.param.model).stem().string();
  for (double s : info.param.shares) name += "_" + std::to_string(static_cast<int>(s));
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(SharedModels, RowSplitCpu, ::testing::ValuesIn(cases()), case_name);

TEST(RowSplitCpuBackend, ABadBatchFailsEveryShardAndTheNextStepRuns) {
  const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  const auto model = model::LoadedModel::open(path.string());
  cpu::CpuBackendOptions o;
  o.n_ctx = 64;
  o.threads = 1;
  const auto split = cpu::make_row_split_backend(model->hparams, model->weights, o, {1, 1});
  EXPECT_EQ(split->name(), "CPU + CPU (row split)");
  const size_t n_vocab = model->hparams.n_vocab;
  backend::Batch bad;
  bad.add(static_cast<int32_t>(n_vocab), 0, 0, true);  // outside the vocabulary
  std::vector<float> out(n_vocab, NAN);
  EXPECT_THROW(split->forward(bad, out), Error);
  backend::Batch good;
  good.add(1, 0, 0, true);
  good.add(2, 1, 0, true);
  std::vector<float> small(n_vocab, NAN);  // room for one row of two: shard 0 refuses, the other is released
  EXPECT_THROW(split->forward(good, small), Error);
  std::vector<float> logits(2 * n_vocab, NAN);
  split->forward(good, logits);
  EXPECT_TRUE(std::none_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); }));
}

TEST(RowSplitCpuBackend, AShardAloneRefusesAWholeStep) {
  const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  const auto model = model::LoadedModel::open(path.string());
  cpu::ShardSums sums(2);
  cpu::CpuBackendOptions o;
  o.n_ctx = 64;
  o.threads = 1;
  o.shard = model::plan_row_split(model->hparams, model->weights, std::vector<double>{1, 1})[0];
  o.sums = &sums;
  cpu::CpuBackend shard(model->hparams, model->weights, o);
  backend::Batch batch;
  batch.add(1, 0, 0, true);
  std::vector<float> out(model->hparams.n_vocab);
  EXPECT_THROW(shard.forward(batch, out), Error);
  o.sums = nullptr;
  EXPECT_THROW(cpu::CpuBackend(model->hparams, model->weights, o), Error) << "a shard without its group";
  cpu::CpuBackend whole(model->hparams, model->weights, cpu::CpuBackendOptions{.n_ctx = 64, .threads = 1});
  EXPECT_THROW(whole.forward_shard(batch, out), Error);
}

}  // namespace

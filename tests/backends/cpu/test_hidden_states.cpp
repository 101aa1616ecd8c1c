// Batch::output_embeddings on the CPU backend: the hidden states it returns
// are the ones the logits come from. Computed here from the GGUF's output
// weights (dequantized row by row, dot products in double) and the
// architecture's logit scale and soft-cap, they give the logits the same
// batch returns without the flag; and a batch that returns hidden states
// leaves the KV cache as one that returns logits does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "common/error.h"
#include "model/loaded_model.h"
#include "quant/dequantize.h"
#include "test_paths.h"

namespace m40 {
namespace {

class HiddenStates : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto path = test::shared_model(GetParam());
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not found: " << path;
    model_ = model::LoadedModel::open(path.string());
  }
  std::unique_ptr<cpu::CpuBackend> backend() const {
    return std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights,
                                             cpu::CpuBackendOptions{.n_ctx = 64, .n_seq = 1, .threads = 2});
  }
  std::vector<int32_t> prompt(int n) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((3 + 7919ull * i * i + 104729ull * i) % model_->hparams.n_vocab));
    return ids;
  }
  // The batch of `ids` where the tokens in `wanted` give an output.
  static backend::Batch batch_of(const std::vector<int32_t>& ids, const std::vector<int>& wanted, bool hidden) {
    backend::Batch b;
    for (size_t i = 0; i < ids.size(); ++i) {
      b.add(ids[i], static_cast<int>(i), 0, std::find(wanted.begin(), wanted.end(), static_cast<int>(i)) != wanted.end());
    }
    b.output_embeddings = hidden;
    return b;
  }
  std::unique_ptr<model::LoadedModel> model_;
};

TEST_P(HiddenStates, TheLogitsAreTheHiddenStatesThroughTheOutputHead) {
  const auto& hp = model_->hparams;
  const int n_embd = static_cast<int>(hp.n_embd), n_vocab = static_cast<int>(hp.n_vocab);
  const auto ids = prompt(12);
  const std::vector<int> wanted = {0, 5, 11};
  std::vector<float> logits(wanted.size() * n_vocab), hidden(wanted.size() * n_embd, NAN);
  backend()->forward(batch_of(ids, wanted, false), logits);
  auto b = backend();
  EXPECT_EQ(b->n_embd(), n_embd);
  b->forward(batch_of(ids, wanted, true), hidden);

  // The output head from the file: output.weight, or token_embd.weight when tied.
  const model::WeightView& out = model_->weights.output;
  ASSERT_EQ(out.cols, static_cast<uint64_t>(n_embd));
  ASSERT_EQ(out.rows, static_cast<uint64_t>(n_vocab));
  std::vector<float> w(n_embd);
  double worst = 0;
  for (int v = 0; v < n_vocab; ++v) {
    quant::dequantize_row(out.type, out.row(v), w.data(), n_embd);
    for (size_t r = 0; r < wanted.size(); ++r) {
      double z = 0;
      for (int j = 0; j < n_embd; ++j) z += static_cast<double>(w[j]) * hidden[r * n_embd + j];
      z *= hp.logit_scale;
      if (hp.final_softcap > 0) z = hp.final_softcap * std::tanh(z / hp.final_softcap);
      const double got = logits[r * n_vocab + v];
      worst = std::max(worst, std::abs(got - z));
      ASSERT_NEAR(got, z, 1e-4 * std::max(1.0, std::abs(z))) << "token " << v << ", row " << r;
    }
  }
  RecordProperty("worst_difference", std::to_string(worst));
}

TEST_P(HiddenStates, ABatchOfHiddenStatesCachesWhatALogitsBatchDoes) {
  const int n_vocab = static_cast<int>(model_->hparams.n_vocab), n_embd = static_cast<int>(model_->hparams.n_embd);
  const auto ids = prompt(13);
  const std::vector<int32_t> head(ids.begin(), ids.end() - 1);
  auto a = backend(), b = backend();
  std::vector<float> logits(n_vocab), hidden(head.size() * n_embd);
  std::vector<int> every(head.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int>(i);
  a->forward(batch_of(head, {static_cast<int>(head.size()) - 1}, false), logits);
  b->forward(batch_of(head, every, true), hidden);
  // The next token's logits, after either.
  backend::Batch next;
  next.add(ids.back(), static_cast<int>(head.size()), 0, true);
  std::vector<float> la(n_vocab), lb(n_vocab);
  a->forward(next, la);
  b->forward(next, lb);
  EXPECT_EQ(la, lb);
}

TEST_P(HiddenStates, ARowIsTheSameAloneOrAmongOthers) {
  const int n_embd = static_cast<int>(model_->hparams.n_embd);
  const auto ids = prompt(10);
  std::vector<int> every(ids.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int>(i);
  std::vector<float> all(ids.size() * n_embd), last(n_embd);
  backend()->forward(batch_of(ids, every, true), all);
  backend()->forward(batch_of(ids, {9}, true), last);
  for (int j = 0; j < n_embd; ++j) EXPECT_FLOAT_EQ(last[j], all[9 * n_embd + j]) << j;
}

INSTANTIATE_TEST_SUITE_P(SharedModels, HiddenStates,
                         ::testing::Values("TinyStories-656K-Q8_0.gguf", "arch/tiny-qwen3-F32.gguf", "arch/tiny-qwen3-Q8_0.gguf",
                                           "arch/tiny-gemma2-F32.gguf", "arch/tiny-granite-F32.gguf"),
                         [](const auto& param_info) {
                           std::string s = std::filesystem::path(param_info.param).stem().string();
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(HiddenStatesBuffer, ABufferTooSmallForTheHiddenStatesIsRefused) {
  const auto path = test::shared_model("arch/tiny-qwen3-F32.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not found: " << path;
  auto model = model::LoadedModel::open(path.string());
  cpu::CpuBackend b(model->hparams, model->weights, cpu::CpuBackendOptions{.n_ctx = 16, .n_seq = 1, .threads = 1});
  backend::Batch batch;
  batch.add(1, 0, 0, true);
  batch.add(2, 1, 0, true);
  batch.output_embeddings = true;
  std::vector<float> small(2 * model->hparams.n_embd - 1);
  EXPECT_THROW(b.forward(batch, small), Error);
  batch.clear();
  EXPECT_FALSE(batch.output_embeddings);
}

}  // namespace
}  // namespace m40

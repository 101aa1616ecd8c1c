// Layer slices (backends/backend.h, LayerSlice): a prompt chunk read a few
// layers a step beside another sequence's decode tokens gives the logits of
// the same prompt read in one step, on models of two and three layers,
// sliding windows and experts; and a slice that does not fit the one in
// flight is refused before any work.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "common/error.h"
#include "model/loaded_model.h"
#include "test_paths.h"

namespace m40 {
namespace {

// Both runs compute every token's rows with the same arithmetic; only the
// batches' compositions differ. A layer skipped or run twice moves these
// logits by tenths.
constexpr float kTolerance = 1e-4f;

class LayerSlices : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto path = test::shared_model(GetParam());
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model missing: " << path;
    model_ = model::LoadedModel::open(path.string());
    n_layer_ = static_cast<int>(model_->hparams.n_layer);
    n_vocab_ = static_cast<int>(model_->hparams.n_vocab);
    std::mt19937 rng(11);
    for (auto* ids : {&prompt_, &other_}) {
      ids->resize(ids == &prompt_ ? 37 : 9);
      for (auto& t : *ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab_));
    }
  }
  std::unique_ptr<cpu::CpuBackend> backend() const {
    return std::make_unique<cpu::CpuBackend>(
        model_->hparams, model_->weights,
        cpu::CpuBackendOptions{.n_ctx = 64, .n_seq = 2, .kv_type = backend::KvType::F32, .threads = 2});
  }
  // Runs `batch`; its logits, poisoned first.
  std::vector<float> run(backend::Backend& b, const backend::Batch& batch) const {
    std::vector<float> logits(batch.logits_count() * n_vocab_, std::nanf(""));
    b.forward(batch, logits);
    return logits;
  }
  ::testing::AssertionResult close(const float* expected, const float* got) const {
    for (int i = 0; i < n_vocab_; ++i) {
      if (!(std::fabs(expected[i] - got[i]) <= kTolerance)) {
        return ::testing::AssertionFailure() << "logit " << i << ": " << got[i] << " instead of " << expected[i];
      }
    }
    return ::testing::AssertionSuccess();
  }
  std::unique_ptr<model::LoadedModel> model_;
  int n_layer_ = 0;
  int n_vocab_ = 0;
  std::vector<int32_t> prompt_;  // sequence 0's prompt
  std::vector<int32_t> other_;   // sequence 1's tokens: a prompt of 4, then decode tokens
};

TEST_P(LayerSlices, APromptReadInSlicesGivesTheLogitsOfOneRead) {
  const int n = static_cast<int>(prompt_.size());
  // Reference: sequence 0's prompt in one step, then its next token;
  // sequence 1 alone, one token a step.
  auto ref = backend();
  backend::Batch batch;
  for (int p = 0; p < n; ++p) batch.add(prompt_[p], p, 0, p + 1 == n);
  const auto prompt_logits = run(*ref, batch);
  batch.clear();
  batch.add(prompt_[0], n, 0, true);
  const auto next_logits = run(*ref, batch);
  std::vector<std::vector<float>> other_logits;
  batch.clear();
  for (int p = 0; p < 4; ++p) batch.add(other_[p], p, 1, false);
  run(*ref, batch);
  for (int p = 4; p < 9; ++p) {
    batch.clear();
    batch.add(other_[p], p, 1, true);
    other_logits.push_back(run(*ref, batch));
  }

  // Sliced: sequence 1 decodes every step; sequence 0's prompt passes
  // layer 0, then (after a step without it) the other layers.
  auto sliced = backend();
  batch.clear();
  for (int p = 0; p < 4; ++p) batch.add(other_[p], p, 1, false);
  run(*sliced, batch);
  const backend::LayerSlice plan[3] = {{n, 0, 1}, {}, {n, 1, n_layer_}};
  int p = 4;
  for (const backend::LayerSlice& slice : plan) {
    batch.clear();
    batch.add(other_[p], p, 1, true);
    for (int i = 0; i < slice.tokens; ++i) batch.add(prompt_[i], i, 0, i + 1 == n && slice.end_layer == n_layer_);
    batch.slice = slice;
    const auto logits = run(*sliced, batch);
    EXPECT_TRUE(close(other_logits[p - 4].data(), logits.data())) << "sequence 1 at position " << p;
    if (slice.end_layer == n_layer_) {
      ASSERT_EQ(logits.size(), 2u * n_vocab_);
      EXPECT_TRUE(close(prompt_logits.data(), logits.data() + n_vocab_)) << "the prompt's last token";
    }
    ++p;
  }
  // The prompt's positions are cached: sequence 0 decodes on.
  batch.clear();
  batch.add(prompt_[0], n, 0, true);
  batch.add(other_[p], p, 1, true);
  const auto logits = run(*sliced, batch);
  EXPECT_TRUE(close(next_logits.data(), logits.data()));
  EXPECT_TRUE(close(other_logits[p - 4].data(), logits.data() + n_vocab_));
}

INSTANTIATE_TEST_SUITE_P(Models, LayerSlices,
                         ::testing::Values("TinyStories-656K-Q8_0.gguf", "arch/tiny-gemma3-Q8_0.gguf",
                                           "arch/tiny-qwen3moe-Q8_0.gguf"),
                         [](const auto& info) {
                           std::string name = std::filesystem::path(info.param).stem().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

class LayerSliceChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = test::shared_model("arch/tiny-gemma3-Q8_0.gguf");  // three layers
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model missing: " << path;
    model_ = model::LoadedModel::open(path.string());
    backend_ = std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights,
                                                 cpu::CpuBackendOptions{.n_ctx = 64, .n_seq = 2, .threads = 1});
  }
  // Sequence `seq`'s positions [first, first + count) as a slice of layers [a, b).
  static backend::Batch slice(int seq, int first, int count, int a, int b, bool last_wants_logits = false) {
    backend::Batch batch;
    for (int i = 0; i < count; ++i) batch.add(5 + i, first + i, seq, last_wants_logits && i + 1 == count);
    batch.slice = {count, a, b};
    return batch;
  }
  void run(const backend::Batch& batch) {
    std::vector<float> logits(batch.logits_count() * model_->hparams.n_vocab);
    backend_->forward(batch, logits);
  }
  std::unique_ptr<model::LoadedModel> model_;
  std::unique_ptr<cpu::CpuBackend> backend_;
};

TEST_F(LayerSliceChecks, TheBackendSaysWhatItRuns) {
  EXPECT_EQ(backend_->layer_slices().layers, 3);
  EXPECT_GT(backend_->layer_slices().max_batch, 1000);
}

TEST_F(LayerSliceChecks, SlicesThatDoNotFitAreRefused) {
  EXPECT_THROW(run(slice(0, 0, 8, 1, 2)), Error);        // continues no slice in flight
  EXPECT_THROW(run(slice(0, 0, 8, 0, 2, true)), Error);  // outputs before the last layer
  EXPECT_THROW(run(slice(0, 0, 8, 2, 2)), Error);        // no layers
  EXPECT_THROW(run(slice(0, 0, 8, 0, 4)), Error);        // past the model's
  backend::Batch two = slice(0, 0, 4, 0, 1);
  two.add(9, 0, 1, false);
  two.slice.tokens = 5;
  EXPECT_THROW(run(two), Error);  // two sequences
  backend::Batch gap = slice(0, 0, 4, 0, 1);
  gap.positions[2] = 3;
  EXPECT_THROW(run(gap), Error);  // positions that skip
  backend::Batch too_many = slice(0, 0, 4, 0, 1);
  too_many.slice.tokens = 5;
  EXPECT_THROW(run(too_many), Error);
  backend::Batch inside_and_out = slice(0, 1, 4, 0, 1);
  inside_and_out.tokens.insert(inside_and_out.tokens.begin(), 3);
  inside_and_out.positions.insert(inside_and_out.positions.begin(), 0);
  inside_and_out.seq_ids.insert(inside_and_out.seq_ids.begin(), 0);
  inside_and_out.want_logits.insert(inside_and_out.want_logits.begin(), 0);
  EXPECT_THROW(run(inside_and_out), Error);  // the slice's sequence outside it too
}

TEST_F(LayerSliceChecks, OnlyTheSliceInFlightContinues) {
  run(slice(0, 0, 8, 0, 1));
  EXPECT_THROW(run(slice(0, 0, 8, 2, 3)), Error);  // not where it stopped
  EXPECT_THROW(run(slice(0, 0, 7, 1, 3)), Error);  // other tokens
  EXPECT_THROW(run(slice(1, 0, 8, 1, 3)), Error);  // another sequence
  // The refused steps left it as it was: it goes on, then ends.
  run(slice(0, 0, 8, 1, 2));
  run(slice(0, 0, 8, 2, 3, true));
  EXPECT_THROW(run(slice(0, 0, 8, 2, 3)), Error);  // nothing in flight any more
  // Its positions are cached: the next chunk follows them.
  run(slice(0, 8, 4, 0, 3, true));
  // A sequence whose blocks are reset loses the slice in flight.
  run(slice(1, 0, 6, 0, 2));
  const std::vector<int32_t> blocks = {4};
  backend_->set_blocks(1, blocks, 0);
  EXPECT_THROW(run(slice(1, 0, 6, 2, 3)), Error);
}

}  // namespace
}  // namespace m40

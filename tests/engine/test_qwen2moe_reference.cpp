// qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B) on the CPU against llama.cpp: the
// routed experts' softmax probabilities used as they are (no
// renormalization) and a shared expert scaled by sigmoid(gate · x). No tiny
// qwen2moe oracle is in ../shared, so the test writes one with gen-model
// (tiny-qwen2moe, F32, seed 1234) and compares with what llama.cpp 3f545be
// computed on that file (tests/data/qwen2moe/README.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "reference_case.h"
#include "synthetic_model.h"

using namespace m40;
using test::argmax;
using test::max_abs_diff;
using test::ModelUnderTest;

namespace {

// The prompt of the reference run (README.md).
const std::vector<int32_t> kPrompt = {46, 77, 346, 705, 263, 264, 882, 500};

class Qwen2MoeReference : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = test::write_synthetic_model("tiny-qwen2moe", "f32", "arch/tiny-qwen2-F32.gguf");
    if (path_.empty()) GTEST_SKIP() << "shared data missing";
    model_ = std::make_unique<ModelUnderTest>(path_);
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove(path_);
  }

  std::filesystem::path path_;
  std::unique_ptr<ModelUnderTest> model_;
};

}  // namespace

TEST_F(Qwen2MoeReference, LoadsItsSharedExpert) {
  const auto& hp = model_->hparams;
  EXPECT_EQ(hp.n_expert, 8u);
  EXPECT_EQ(hp.n_expert_used, 2u);
  EXPECT_EQ(hp.n_ff_expert, 32u);
  EXPECT_EQ(hp.n_ff_shared_expert, 64u);
  EXPECT_FALSE(hp.desc->expert_weights_renormalized);
  ASSERT_TRUE(model_->weights.has_shared_expert());
  for (const auto& l : model_->weights.layers) {
    EXPECT_EQ(l.gate_inp_shexp.rows, 1u);
    EXPECT_EQ(l.gate_shexp.rows, 64u);
    EXPECT_EQ(l.down_shexp.rows, 64u);
    EXPECT_TRUE(l.bq.present());  // Q/K/V biases, as Qwen1.5-MoE has them
  }
  EXPECT_TRUE(model_->weights.unused_tensors.empty());
}

// llama.cpp's plain-FP32 run (F32 KV cache, flash attention off), the whole
// prompt as one batch, at every position.
TEST_F(Qwen2MoeReference, F32CacheMatchesLlamaCppAtEveryPromptPosition) {
  const auto expected = test::read_floats(test::repo_test_data("qwen2moe/tiny-qwen2moe-F32.logits_all.bin"));
  const int n_vocab = static_cast<int>(model_->hparams.n_vocab);
  ASSERT_EQ(expected.size(), kPrompt.size() * n_vocab);
  auto be = model_->backend(backend::KvType::F32, 64);
  backend::Batch batch;
  for (size_t i = 0; i < kPrompt.size(); ++i) batch.add(kPrompt[i], static_cast<int>(i), 0, true);
  std::vector<float> logits(expected.size(), NAN);
  be->forward(batch, logits);
  for (size_t i = 0; i < kPrompt.size(); ++i) {
    const float* got = logits.data() + i * n_vocab;
    const float* want = expected.data() + i * n_vocab;
    EXPECT_LE(max_abs_diff(got, want, n_vocab), 1e-3f) << "position " << i;
    EXPECT_EQ(argmax(got, n_vocab), argmax(want, n_vocab)) << "position " << i;
  }
}

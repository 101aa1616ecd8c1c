// The CPU engine against llama.cpp's reference outputs for every shared model
// (max |logit difference| 2e-2 for F32/F16 weights, 0.3 for quantized ones,
// grounded in ../shared/reference/README.md's measured noise): logits at the last prompt position, at every prompt
// position, and greedy continuations up to the first near-tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "reference_case.h"

using namespace m40;

namespace {

using test::ModelUnderTest;

struct Param {
  std::string model;
  float tolerance;  // max |logit difference| allowed against the default reference
};

bool quantized(const std::string& model) {
  return model.find("Q8_0") != std::string::npos || model.find("Q4") != std::string::npos ||
         model.find("Q2_K") != std::string::npos;
}

std::vector<Param> all_models() {
  std::vector<Param> out;
  for (const char* m : {"tiny-llama-rand-F32", "tiny-llama-rand-F16", "tiny-llama-rand-Q8_0", "tiny-llama-rand-Q4_0",
                        "tiny-llama-rand-Q4_K_M", "TinyStories-656K-Q8_0", "TinyStories-656K-Q2_K",
                        "llama-2-tiny-random"}) {
    out.push_back({m, quantized(m) ? 0.3f : 2e-2f});
  }
  return out;
}

using test::argmax;
using test::max_abs_diff;

class CpuReference : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    path_ = test::model_for_reference(GetParam().model);
    ref_dir_ = test::shared_dir() / "reference" / GetParam().model;
    if (!std::filesystem::exists(path_) || !std::filesystem::exists(ref_dir_)) GTEST_SKIP() << "shared data missing";
    model_ = std::make_unique<ModelUnderTest>(path_);
  }
  std::filesystem::path path_, ref_dir_;
  std::unique_ptr<ModelUnderTest> model_;
};

}  // namespace

TEST_P(CpuReference, LastPositionLogitsAndEveryPromptPosition) {
  const int n_vocab = static_cast<int>(model_->hparams.n_vocab);
  for (const char* prompt : {"once-upon-a-time", "the-quick-brown-fox"}) {
    SCOPED_TRACE(prompt);
    auto ref = test::ReferenceCase::load(ref_dir_ / prompt);
    auto be = model_->backend();
    backend::Batch batch;
    const int n = static_cast<int>(ref.prompt.size());
    for (int i = 0; i < n; ++i) batch.add(ref.prompt[i], i, 0, true);
    std::vector<float> logits(static_cast<size_t>(n) * n_vocab, NAN);
    be->forward(batch, logits);

    const auto expected = ref.logits();
    ASSERT_EQ(expected.size(), static_cast<size_t>(n_vocab));
    const float* last = logits.data() + static_cast<size_t>(n - 1) * n_vocab;
    EXPECT_LE(max_abs_diff(last, expected.data(), n_vocab), GetParam().tolerance);
    EXPECT_EQ(argmax(last, n_vocab), argmax(expected.data(), n_vocab));

    // Every prompt position: the bounds above are for the last one; llama.cpp
    // quantizes activations to 8 bits for quantized weights, and that noise
    // reaches 0.36 at some earlier positions of the Q4_K_M model, so those
    // get half again the tolerance (F32/F16 models keep theirs).
    const float all_tolerance = quantized(GetParam().model) ? 1.5f * GetParam().tolerance : GetParam().tolerance;
    const auto all = ref.logits(".logits_all.bin");
    ASSERT_EQ(all.size(), logits.size());
    for (int i = 0; i < n; ++i) {
      EXPECT_LE(max_abs_diff(logits.data() + static_cast<size_t>(i) * n_vocab, all.data() + static_cast<size_t>(i) * n_vocab,
                             n_vocab),
                all_tolerance)
          << "position " << i;
    }
  }
}

TEST_P(CpuReference, GreedyContinuationUpToTheFirstNearTie) {
  for (const char* prompt : {"once-upon-a-time", "the-quick-brown-fox"}) {
    SCOPED_TRACE(prompt);
    auto ref = test::ReferenceCase::load(ref_dir_ / prompt);
    auto be = model_->backend();
    const auto c = test::compare_greedy(*be, ref, GetParam().tolerance);  // below: a legitimate tie
    EXPECT_EQ(c.mismatch, -1) << "step " << c.mismatch << ": " << c.got << " instead of " << c.expected;
    const int compared = c.matched;
    RecordProperty(std::string(prompt) + "_steps_compared", compared);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedModels, CpuReference, ::testing::ValuesIn(all_models()),
                         [](const auto& param_info) {
                           std::string s = param_info.param.model;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// With an F32 KV cache, llama.cpp's flash-attention-off CPU path computes in
// FP32 throughout: the two implementations agree to rounding.
TEST(CpuReferenceTight, F32WeightsWithF32CacheMatchWithin1e3) {
  auto path = test::model_for_reference("tiny-llama-rand-F32");
  auto dir = test::shared_dir() / "reference" / "tiny-llama-rand-F32" / "variants" / "kvf32-fa-off";
  if (!std::filesystem::exists(path) || !std::filesystem::exists(dir)) GTEST_SKIP() << "shared data missing";
  ModelUnderTest m(path);
  const int n_vocab = static_cast<int>(m.hparams.n_vocab);
  for (const char* prompt : {"once-upon-a-time", "the-quick-brown-fox"}) {
    auto ref = test::ReferenceCase::load(dir / prompt);
    auto be = m.backend(backend::KvType::F32);
    backend::Batch batch;
    for (size_t i = 0; i < ref.prompt.size(); ++i) batch.add(ref.prompt[i], static_cast<int>(i), 0, i + 1 == ref.prompt.size());
    std::vector<float> logits(n_vocab, NAN);
    be->forward(batch, logits);
    EXPECT_LE(max_abs_diff(logits.data(), ref.logits().data(), n_vocab), 1e-3f) << prompt;
  }
}

// Decoding the prompt one token at a time reads back through the KV cache
// what one batched step computes at once.
TEST(CpuEngine, TokenByTokenEqualsOneBatch) {
  auto path = test::model_for_reference("tiny-llama-rand-Q4_K_M");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data missing";
  ModelUnderTest m(path);
  const int n_vocab = static_cast<int>(m.hparams.n_vocab);
  const std::vector<int32_t> prompt = {1, 80, 247, 1807, 80, 1216, 983, 480, 76};
  auto batched = m.backend(backend::KvType::F32);
  backend::Batch batch;
  for (size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], static_cast<int>(i), 0, true);
  std::vector<float> all(prompt.size() * n_vocab);
  batched->forward(batch, all);

  auto stepwise = m.backend(backend::KvType::F32);
  std::vector<float> one(n_vocab);
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.clear();
    batch.add(prompt[i], static_cast<int>(i), 0, true);
    stepwise->forward(batch, one);
    EXPECT_LE(max_abs_diff(one.data(), all.data() + i * n_vocab, n_vocab), 1e-4f) << "position " << i;
  }
}

// Two sequences in one batch do not see each other's cache.
TEST(CpuEngine, SequencesInOneBatchAreIndependent) {
  auto path = test::model_for_reference("tiny-llama-rand-F16");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data missing";
  ModelUnderTest m(path);
  const int n_vocab = static_cast<int>(m.hparams.n_vocab);
  cpu::CpuBackendOptions o;
  o.n_ctx = 32;
  o.n_seq = 2;
  cpu::CpuBackend both(m.hparams, m.weights, o);
  const std::vector<int32_t> a = {1, 80, 147, 201}, b = {1, 500, 600};
  backend::Batch batch;
  for (size_t i = 0; i < a.size(); ++i) batch.add(a[i], static_cast<int>(i), 0, i + 1 == a.size());
  for (size_t i = 0; i < b.size(); ++i) batch.add(b[i], static_cast<int>(i), 1, i + 1 == b.size());
  std::vector<float> out(2 * n_vocab);
  both.forward(batch, out);

  for (int which = 0; which < 2; ++which) {
    const auto& seq = which == 0 ? a : b;
    auto alone = m.backend();
    backend::Batch single;
    for (size_t i = 0; i < seq.size(); ++i) single.add(seq[i], static_cast<int>(i), 0, i + 1 == seq.size());
    std::vector<float> expected(n_vocab);
    alone->forward(single, expected);
    EXPECT_LE(max_abs_diff(expected.data(), out.data() + which * n_vocab, n_vocab), 1e-4f) << "sequence " << which;
  }
}

TEST(CpuEngine, BadBatchesAreRefusedWithClearErrors) {
  auto path = test::model_for_reference("TinyStories-656K-Q8_0");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data missing";
  ModelUnderTest m(path);
  auto be = m.backend(backend::KvType::F16, 8);
  std::vector<float> logits(m.hparams.n_vocab);
  auto expect_error = [&](backend::Batch b, const std::string& fragment) {
    try {
      be->forward(b, logits);
      FAIL() << "expected an error containing " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  backend::Batch b;
  b.add(5000, 0, 0, true);
  expect_error(b, "outside the vocabulary");
  b.clear();
  b.add(1, 8, 0, true);
  expect_error(b, "outside the context");
  b.clear();
  b.add(1, 3, 0, true);
  expect_error(b, "skips uncached positions");
  b.clear();
  b.add(1, 0, 1, true);
  expect_error(b, "no KV slot");
  expect_error(backend::Batch{}, "empty batch");
}

// A Q8_0 KV cache (K and V quantized to 8 bits per 32 values as they are
// stored) against the F32 cache on TinyStories: every prompt position's
// logits (and every decode step's while the continuations agree) stay
// within kQ8_0CacheBound of the F32 cache's, and greedy continuations of 48
// tokens agree token for token. Measured (x86-64, g++ 12 -O3): the largest
// difference is 0.174 over the three prompts and their continuations (0.115
// at the prompt positions), and all three continuations are identical. The
// bound leaves room for other compilers' rounding; it stays below the 0.3 the
// CPU engine keeps against llama.cpp for quantized weights.
TEST(CpuEngine, Q8_0CacheStaysCloseToTheF32Cache) {
  auto path = test::model_for_reference("TinyStories-656K-Q8_0");
  const auto ref_dir = test::shared_dir() / "reference" / "TinyStories-656K-Q8_0";
  if (!std::filesystem::exists(path) || !std::filesystem::exists(ref_dir)) GTEST_SKIP() << "shared data missing";
  constexpr float kQ8_0CacheBound = 0.25f;
  constexpr int kContinuation = 48;
  ModelUnderTest m(path);
  const int n_vocab = static_cast<int>(m.hparams.n_vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (const char* name : {"once-upon-a-time", "the-quick-brown-fox"}) {
    prompts.push_back(test::ReferenceCase::load(ref_dir / name).prompt);
  }
  prompts.push_back({1, 80, 247, 1807, 80, 1216, 983, 480, 76});
  float worst = 0.0f, prompt_worst = 0.0f;
  for (const auto& prompt : prompts) {
    const int n = static_cast<int>(prompt.size());
    SCOPED_TRACE(std::to_string(n) + "-token prompt");
    auto f32 = m.backend(backend::KvType::F32, 128);
    auto q8 = m.backend(backend::KvType::Q8_0, 128);
    backend::Batch batch;
    for (int i = 0; i < n; ++i) batch.add(prompt[i], i, 0, true);
    std::vector<float> want(static_cast<size_t>(n) * n_vocab), got(want.size(), NAN);
    f32->forward(batch, want);
    q8->forward(batch, got);
    for (int i = 0; i < n; ++i) {
      const float d = max_abs_diff(got.data() + static_cast<size_t>(i) * n_vocab,
                                   want.data() + static_cast<size_t>(i) * n_vocab, n_vocab);
      prompt_worst = std::max(prompt_worst, d);
      EXPECT_LE(d, kQ8_0CacheBound) << "prompt position " << i;
    }
    // Greedy continuations, each backend fed its own choice.
    std::vector<int32_t> tokens_f32, tokens_q8;
    int32_t next_f32 = static_cast<int32_t>(argmax(want.data() + static_cast<size_t>(n - 1) * n_vocab, n_vocab));
    int32_t next_q8 = static_cast<int32_t>(argmax(got.data() + static_cast<size_t>(n - 1) * n_vocab, n_vocab));
    std::vector<float> lf(n_vocab), lq(n_vocab);
    for (int step = 0; step < kContinuation; ++step) {
      tokens_f32.push_back(next_f32);
      tokens_q8.push_back(next_q8);
      backend::Batch a, b;
      a.add(next_f32, n + step, 0, true);
      b.add(next_q8, n + step, 0, true);
      f32->forward(a, lf);
      q8->forward(b, lq);
      if (next_f32 == next_q8) {
        const float d = max_abs_diff(lq.data(), lf.data(), n_vocab);
        worst = std::max(worst, d);
        EXPECT_LE(d, kQ8_0CacheBound) << "continuation step " << step;
      }
      next_f32 = static_cast<int32_t>(argmax(lf.data(), n_vocab));
      next_q8 = static_cast<int32_t>(argmax(lq.data(), n_vocab));
    }
    EXPECT_EQ(tokens_q8, tokens_f32);
  }
  RecordProperty("q8_0_cache_worst_logit_difference", std::to_string(std::max(worst, prompt_worst)));
  if (std::getenv("M40_REPORT_ERRORS") != nullptr) {
    std::printf("  Q8_0 vs F32 cache: worst |logit difference| %.4g at prompt positions, %.4g while decoding\n",
                prompt_worst, worst);
  }
}

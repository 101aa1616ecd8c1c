// Generation end to end on a real model: limits, stop strings, cancellation,
// the context bound and reproducible sampling.
#include <gtest/gtest.h>

#include "engine/backend_factory.h"
#include "engine/generator.h"
#include "engine/stop_strings.h"
#include "reference_case.h"

using namespace m40;

TEST(StopStringFilter, HoldsBackAPossibleStartAndReleasesItWhenItIsNot) {
  engine::StopStringFilter f({"</end>", "STOP"});
  EXPECT_EQ(f.push("hello </e"), "hello ");
  EXPECT_EQ(f.push("x> more S"), "</ex> more ");
  EXPECT_EQ(f.push("TO"), "");
  EXPECT_EQ(f.push("RY"), "STORY");
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.push(" tail ST"), " tail ");
  EXPECT_EQ(f.flush(), "ST");
}

TEST(StopStringFilter, StopsAtTheEarliestMatchAcrossPieces) {
  engine::StopStringFilter f({"STOP", "op"});
  EXPECT_EQ(f.push("a sto"), "a st");  // case matters: "sto" is not "STO", but "o" could start "op"
  EXPECT_EQ(f.push("p and ST"), "");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.matched(), "op");
  EXPECT_EQ(f.push("more"), "");
  EXPECT_EQ(f.flush(), "");
}

TEST(StopStringFilter, NoStopsPassesEverythingThrough) {
  engine::StopStringFilter f({"", ""});
  EXPECT_EQ(f.push("abc"), "abc");
  EXPECT_EQ(f.flush(), "");
}

namespace {

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    model_ = model::LoadedModel::open(path.string());
    vocab_ = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_metadata(model_->file.metadata()));
    engine::BackendOptions o;
    o.n_ctx = 64;
    o.threads = 2;
    backend_ = engine::make_backend(*model_, o);
  }
  engine::GenerationResult generate(const engine::GenerationOptions& o, std::string& text,
                                    const std::string& prompt = "Once upon a time") {
    engine::Generator g(*backend_, *vocab_);
    return g.generate(vocab_->encode(prompt), o, [&](std::string_view piece) {
      text += piece;
      return true;
    });
  }
  std::unique_ptr<model::LoadedModel> model_;
  std::unique_ptr<tokenizer::Vocab> vocab_;
  std::unique_ptr<backend::Backend> backend_;
};

engine::GenerationOptions greedy(int max_tokens) {
  engine::GenerationOptions o;
  o.sampler.temperature = 0;
  o.sampler.repeat_penalty = 1.0f;
  o.max_tokens = max_tokens;
  return o;
}

}  // namespace

TEST_F(GeneratorTest, GreedyTokensAreTheReferenceContinuation) {
  auto ref = test::ReferenceCase::load(test::shared_dir() / "reference/TinyStories-656K-Q8_0/the-quick-brown-fox");
  std::string text;
  engine::Generator g(*backend_, *vocab_);
  auto prompt = vocab_->encode("The quick brown fox");
  ASSERT_EQ(prompt, ref.prompt);
  auto r = g.generate(prompt, greedy(32), [&](std::string_view p) { text += p; return true; });
  ASSERT_EQ(r.tokens.size(), 32u);
  for (size_t i = 0; i < ref.greedy.size() && ref.greedy[i].margin_to_2nd >= 0.3f; ++i) {
    EXPECT_EQ(r.tokens[i], ref.greedy[i].id) << "step " << i;
  }
  EXPECT_EQ(r.finish_reason, engine::FinishReason::MaxTokens);
  EXPECT_EQ(r.prompt_tokens, static_cast<int>(prompt.size()));
  EXPECT_FALSE(text.empty());
}

TEST_F(GeneratorTest, StreamedTextEqualsTheDecodedTokens) {
  std::string text;
  auto r = generate(greedy(40), text);
  std::vector<int32_t> with_prompt = vocab_->encode("Once upon a time");
  const std::string prompt_text = vocab_->decode(with_prompt, {.remove_special = true});
  with_prompt.insert(with_prompt.end(), r.tokens.begin(), r.tokens.end());
  EXPECT_EQ(prompt_text + text, vocab_->decode(with_prompt, {.remove_special = true}));
}

TEST_F(GeneratorTest, StopStringEndsGenerationAndIsNotShown) {
  std::string full;
  generate(greedy(40), full);
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(10, 5);  // text that greedy decoding is known to produce
  auto o = greedy(40);
  o.stop = {stop};
  std::string text;
  auto r = generate(o, text);
  EXPECT_EQ(r.finish_reason, engine::FinishReason::StopString);
  EXPECT_EQ(text, full.substr(0, full.find(stop)));
}

TEST_F(GeneratorTest, CancellingFromTheCallbackStopsAtOnce) {
  engine::Generator g(*backend_, *vocab_);
  int calls = 0;
  auto r = g.generate(vocab_->encode("Once upon a time"), greedy(40), [&](std::string_view) { return ++calls < 3; });
  EXPECT_EQ(r.finish_reason, engine::FinishReason::Cancelled);
  EXPECT_EQ(calls, 3);
  EXPECT_LE(r.tokens.size(), 4u);
}

TEST_F(GeneratorTest, TheContextBoundsGeneration) {
  std::string text;
  auto o = greedy(-1);
  o.ignore_eos = true;
  auto r = generate(o, text);
  EXPECT_EQ(r.finish_reason, engine::FinishReason::ContextFull);
  EXPECT_EQ(r.prompt_tokens + static_cast<int>(r.tokens.size()), backend_->n_ctx() + 1);
}

TEST_F(GeneratorTest, APromptOverTheContextIsAClearError) {
  std::string text, long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "the dog ran. ";
  try {
    generate(greedy(4), text, long_prompt);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context holds 64"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(text.empty());
}

TEST_F(GeneratorTest, SeededSamplingIsReproducible) {
  auto o = greedy(24);
  o.sampler.temperature = 1.0f;
  o.sampler.seed = 7;
  std::string a, b, c;
  auto ra = generate(o, a);
  auto rb = generate(o, b);
  o.sampler.seed = 8;
  auto rc = generate(o, c);
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_EQ(a, b);
  EXPECT_NE(ra.tokens, rc.tokens);
}

// The one token loop (engine/token_loop.h) the generator, the scheduler and
// the CLI chat share: the end checks in their order, the text it shows, and
// an end token's text never shown, even spelled out in ordinary pieces.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/token_loop.h"
#include "test_paths.h"
#include "tokenizer/vocab.h"

namespace m40 {
namespace {

using engine::FinishReason;
using engine::TokenLoop;

class TokenLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    vocab_ = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_file(path.string()));
  }
  // Logits that make `token` the greedy choice.
  std::vector<float> favor(int32_t token) const {
    std::vector<float> logits(vocab_->size(), 0.0f);
    logits[static_cast<size_t>(token)] = 10.0f;
    return logits;
  }
  TokenLoop loop(engine::AnswerLimits limits) const {
    engine::SamplerParams greedy;
    greedy.temperature = 0;
    greedy.repeat_penalty = 1.0f;
    const std::vector<int32_t> prompt = {vocab_->special().bos};
    return TokenLoop(*vocab_, greedy, static_cast<int>(vocab_->size()), std::move(limits), prompt);
  }
  // Feeds `tokens` as the greedy choices; the text shown and how it ended.
  std::pair<std::string, std::optional<FinishReason>> run(TokenLoop& l, const std::vector<int32_t>& tokens, int n_ctx = 1000) {
    std::string shown;
    int fed = 1;
    for (int32_t t : tokens) {
      auto step = l.next(favor(t), fed++, n_ctx);
      shown += step.text;
      if (step.finish) return {shown, step.finish};
      EXPECT_EQ(step.token, t);
    }
    return {shown, std::nullopt};
  }
  std::vector<int32_t> pieces(const std::string& text) const { return vocab_->encode(text, {.add_special = false}); }
  std::unique_ptr<tokenizer::Vocab> vocab_;
};

TEST_F(TokenLoopTest, AnEndTokenSpelledInTextEndsTheAnswerUnshown) {
  ASSERT_GT(pieces("<|end_story|>").size(), 1u) << "TinyStories writes its end token as ordinary pieces";
  const auto tokens = pieces("They had fun.<|end_story|> More");
  auto l = loop({});
  const auto [shown, finish] = run(l, tokens);
  EXPECT_EQ(shown, " They had fun.");
  EXPECT_EQ(finish, FinishReason::EndOfGeneration);

  // With ignore_eos the text is the model's to show.
  auto past = loop({.ignore_eos = true});
  const auto [all, none] = run(past, tokens);
  EXPECT_FALSE(none.has_value());
  EXPECT_NE(all.find("<|end_story|>"), std::string::npos) << all;
}

TEST_F(TokenLoopTest, TheEndTokenItselfEndsTheAnswerWithAllHeldTextShown) {
  auto l = loop({.stop = {"had fun!"}});
  auto tokens = pieces("They had fun");  // " had fun" is held: it may begin the stop string
  tokens.push_back(vocab_->special().eos);
  const auto [shown, finish] = run(l, tokens);
  EXPECT_EQ(shown, " They had fun");
  EXPECT_EQ(finish, FinishReason::EndOfGeneration);
  EXPECT_EQ(l.generated(), static_cast<int>(tokens.size()) - 1);  // the end token is not counted
}

TEST_F(TokenLoopTest, AStopStringEndsTheAnswerBeforeIt) {
  auto l = loop({.stop = {"fun"}});
  const auto [shown, finish] = run(l, pieces("They had fun today."));
  EXPECT_EQ(shown, " They had ");
  EXPECT_EQ(finish, FinishReason::StopString);
}

TEST_F(TokenLoopTest, LimitsAndTheContextEndTheAnswer) {
  auto none = loop({.max_tokens = 0});
  const auto step = none.next(favor(pieces("They")[0]), 1, 100);
  EXPECT_EQ(step.finish, FinishReason::MaxTokens);
  EXPECT_EQ(none.generated(), 0);

  auto two = loop({.max_tokens = 2});
  EXPECT_EQ(run(two, pieces("They had fun")).second, FinishReason::MaxTokens);
  EXPECT_EQ(two.generated(), 2);

  auto full = loop({});
  // Fed after the 1-token prompt: 1, 2, then 3 >= 3 (as the generator: the
  // last token sampled is not fed).
  EXPECT_EQ(run(full, pieces("They had fun and more"), 3).second, FinishReason::ContextFull);
  EXPECT_EQ(full.generated(), 3);
}

TEST_F(TokenLoopTest, FinishReleasesHeldTextOnce) {
  auto l = loop({.stop = {"fun!"}});
  const auto [shown, finish] = run(l, pieces("They had fun"));
  EXPECT_FALSE(finish.has_value());
  EXPECT_EQ(shown + l.finish(), " They had fun");
  EXPECT_EQ(l.finish(), "");
}

}  // namespace
}  // namespace m40

// The one token loop (engine/token_loop.h) the generator, the scheduler and
// the CLI chat share: the end checks in their order, the text it shows, and
// an end token's text never shown, even spelled out in ordinary pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "engine/token_loop.h"
#include "grammar/grammar.h"
#include "grammar/token_vocabulary.h"
#include "test_paths.h"
#include "tokenizer/vocab.h"

namespace m40 {
namespace {

using engine::FinishReason;
using engine::TokenLoop;

engine::AnswerLimits limits(int max_tokens = -1, std::vector<std::string> stop = {}, bool ignore_eos = false) {
  engine::AnswerLimits l;
  l.max_tokens = max_tokens;
  l.stop = std::move(stop);
  l.ignore_eos = ignore_eos;
  return l;
}

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
  auto past = loop(limits(-1, {}, true));
  const auto [all, none] = run(past, tokens);
  EXPECT_FALSE(none.has_value());
  EXPECT_NE(all.find("<|end_story|>"), std::string::npos) << all;
}

TEST_F(TokenLoopTest, TheEndTokenItselfEndsTheAnswerWithAllHeldTextShown) {
  auto l = loop(limits(-1, {"had fun!"}));
  auto tokens = pieces("They had fun");  // " had fun" is held: it may begin the stop string
  tokens.push_back(vocab_->special().eos);
  const auto [shown, finish] = run(l, tokens);
  EXPECT_EQ(shown, " They had fun");
  EXPECT_EQ(finish, FinishReason::EndOfGeneration);
  EXPECT_EQ(l.generated(), static_cast<int>(tokens.size()) - 1);  // the end token is not counted
}

TEST_F(TokenLoopTest, AStopStringEndsTheAnswerBeforeIt) {
  auto l = loop(limits(-1, {"fun"}));
  const auto [shown, finish] = run(l, pieces("They had fun today."));
  EXPECT_EQ(shown, " They had ");
  EXPECT_EQ(finish, FinishReason::StopString);
}

TEST_F(TokenLoopTest, LimitsAndTheContextEndTheAnswer) {
  auto none = loop(limits(0));
  const auto step = none.next(favor(pieces("They")[0]), 1, 100);
  EXPECT_EQ(step.finish, FinishReason::MaxTokens);
  EXPECT_EQ(none.generated(), 0);

  auto two = loop(limits(2));
  EXPECT_EQ(run(two, pieces("They had fun")).second, FinishReason::MaxTokens);
  EXPECT_EQ(two.generated(), 2);

  auto full = loop({});
  // Fed after the 1-token prompt: 1, 2, then 3 >= 3 (as the generator: the
  // last token sampled is not fed).
  EXPECT_EQ(run(full, pieces("They had fun and more"), 3).second, FinishReason::ContextFull);
  EXPECT_EQ(full.generated(), 3);
}

TEST_F(TokenLoopTest, FinishReleasesHeldTextOnce) {
  auto l = loop(limits(-1, {"fun!"}));
  const auto [shown, finish] = run(l, pieces("They had fun"));
  EXPECT_FALSE(finish.has_value());
  EXPECT_EQ(shown + l.finish(), " They had fun");
  EXPECT_EQ(l.finish(), "");
}

}  // namespace
}  // namespace m40

namespace m40 {
namespace {

// log p from the logits alone: p = (1/4, 3/4, 0) for logits (0, ln 3, -inf).
TEST(TokenLogprob, IsTheLogSoftmaxOfTheLogitsWithTheMostLikelyFirst) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), -std::numeric_limits<float>::infinity(), std::log(3.0f)};
  const auto lp = engine::token_logprob(logits, 0, 3);
  EXPECT_EQ(lp.token, 0);
  EXPECT_NEAR(lp.logprob, std::log(1.0 / 7.0), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // tied with 3: the lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[0].second, std::log(3.0 / 7.0), 1e-6);
  // Logits far from zero lose nothing (no exp overflows).
  const std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_NEAR(engine::token_logprob(big, 1, 0).logprob, std::log(0.5), 1e-6);
  EXPECT_TRUE(engine::token_logprob(big, 1, 0).top.empty());
}

TEST_F(TokenLoopTest, LogprobsComeWithEachAnswerTokenButNotTheEndToken) {
  engine::SamplerParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt = {vocab_->special().bos};
  TokenLoop l(*vocab_, greedy, static_cast<int>(vocab_->size()), {}, prompt, 2);
  const int32_t they = pieces("They")[0];
  const auto step = l.next(favor(they), 1, 100);
  ASSERT_TRUE(step.logprob.has_value());
  EXPECT_EQ(step.logprob->token, they);
  ASSERT_EQ(step.logprob->top.size(), 2u);
  EXPECT_EQ(step.logprob->top[0].first, they);
  EXPECT_NEAR(step.logprob->logprob, step.logprob->top[0].second, 1e-7);
  EXPECT_LT(step.logprob->logprob, 0.0f);
  const auto end = l.next(favor(vocab_->special().eos), 2, 100);
  EXPECT_EQ(end.finish, FinishReason::EndOfGeneration);
  EXPECT_FALSE(end.logprob.has_value());
}

// Under a grammar the loop draws only what the grammar allows, whatever the
// logits favor, and ends the answer when the grammar is complete.
class GrammarTokenLoopTest : public TokenLoopTest {
 protected:
  engine::AnswerGrammar grammar(const std::string& gbnf, std::string starts_after = "") const {
    std::vector<std::string> pieces(vocab_->size());
    for (size_t id = 0; id < vocab_->size(); ++id) {
      const auto t = static_cast<tokenizer::TokenId>(id);
      if (!vocab_->is_control(t)) pieces[id] = vocab_->piece(t, true);
    }
    engine::AnswerGrammar g;
    g.grammar = grammar::parse_gbnf(gbnf);
    g.vocabulary = std::make_shared<grammar::TokenVocabulary>(std::move(pieces), vocab_->end_of_generation_tokens());
    g.starts_after = std::move(starts_after);
    return g;
  }
  TokenLoop constrained(const engine::AnswerGrammar& g, int logprobs = -1) const {
    engine::SamplerParams greedy;
    greedy.temperature = 0;
    greedy.repeat_penalty = 1.0f;
    const std::vector<int32_t> prompt = {vocab_->special().bos};
    return TokenLoop(*vocab_, greedy, static_cast<int>(vocab_->size()), {}, prompt, logprobs, g);
  }
  // A token no grammar below allows: "They" whole.
  int32_t they() const { return pieces("They").back(); }
};

TEST_F(GrammarTokenLoopTest, OnlyTheGrammarsTextComesOutAndItEndsTheAnswer) {
  TokenLoop l = constrained(grammar(R"(root ::= " Once upon a time" ("." | "!"))"), 0);
  std::string shown;
  std::optional<FinishReason> finish;
  for (int fed = 1; fed < 40 && !finish; ++fed) {
    // The logits favor "They" every step; the grammar never allows it.
    auto step = l.next(favor(they()), fed, 1000);
    shown += step.text;
    finish = step.finish;
    if (step.logprob) {
      EXPECT_LE(step.logprob->logprob, 0.0f);
      EXPECT_NE(step.logprob->token, they());
    }
  }
  EXPECT_EQ(finish, FinishReason::EndOfGeneration);
  EXPECT_TRUE(shown == " Once upon a time." || shown == " Once upon a time!") << shown;
}

TEST_F(GrammarTokenLoopTest, TheGrammarAppliesOnlyAfterItsOpeningText) {
  const std::string open = vocab_->piece(they(), true);
  TokenLoop l = constrained(grammar(R"(root ::= " yes")", open));
  // Free until "They" has been written: the favored tokens pass.
  const int32_t once = pieces("fun").back();
  auto first = l.next(favor(once), 1, 1000);
  EXPECT_EQ(first.token, once);
  auto second = l.next(favor(they()), 2, 1000);
  EXPECT_EQ(second.token, they());
  std::string shown = first.text + second.text;
  std::optional<FinishReason> finish;
  for (int fed = 3; fed < 20 && !finish; ++fed) {
    auto step = l.next(favor(once), fed, 1000);
    shown += step.text;
    finish = step.finish;
  }
  EXPECT_EQ(finish, FinishReason::EndOfGeneration);
  EXPECT_EQ(shown, vocab_->piece(once) + vocab_->piece(they()) + " yes");
}

TEST_F(GrammarTokenLoopTest, AGrammarTheVocabularyCannotSpellFailsClearly) {
  // TinyStories has no token that spells "{" (and no byte tokens).
  TokenLoop l = constrained(grammar("root ::= \"{\""));
  EXPECT_THROW(
      {
        try {
          l.next(favor(they()), 1, 1000);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("grammar"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace m40

// The conversation behind the interactive `run`: a turn that builds on the
// cached prefix answers exactly as one that prefills everything. Each
// session owns its backend's KV cache (its scheduler's pool), so each test
// session has a backend of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <span>
#include <vector>

#include "cli/chat_session.h"
#include "engine/backend_factory.h"
#include "engine/generator.h"
#include "model/loaded_model.h"
#include "test_paths.h"
#include "wrapped_backend.h"

namespace {

struct Chat {
  explicit Chat(const std::string& path) : model(m40::model::LoadedModel::open(path)),
                                           vocab(m40::tokenizer::Vocab::from_metadata(model->file.metadata())) {
    m40::engine::BackendOptions bo;
    bo.force_cpu = true;
    bo.threads = 1;
    backend = m40::engine::make_backend(*model, bo);
  }
  m40::cli::ChatSession session() { return {*backend, vocab, m40::chat::model_chat_template(model->file)}; }

  std::unique_ptr<m40::model::LoadedModel> model;
  m40::tokenizer::Vocab vocab;
  std::unique_ptr<m40::backend::Backend> backend;
};

m40::engine::GenerationOptions greedy(int max_tokens) {
  m40::engine::GenerationOptions o;
  o.sampler.temperature = 0;
  o.max_tokens = max_tokens;
  return o;
}

// The real backend, made to fail on demand: forward() throws, or the model
// picks a token one past the vocabulary (the backend claims one logit more
// than the vocabulary has tokens, kept at -1e9 unless the fault asks).
class FaultyBackend : public m40::test::WrappedBackend {
 public:
  enum class Fault { None, ForwardThrows, TokenOutOfRange };
  explicit FaultyBackend(m40::backend::Backend& inner) : WrappedBackend(inner), inner_(inner) {}

  int n_vocab() const override { return inner_.n_vocab() + 1; }
  void forward(const m40::backend::Batch& batch, std::span<float> logits) override {
    if (fault == Fault::ForwardThrows) throw m40::Error("the device is gone");
    const size_t n = static_cast<size_t>(inner_.n_vocab());
    const size_t rows = logits.size() / (n + 1);
    std::vector<float> inner_logits(rows * n);
    inner_.forward(batch, inner_logits);
    for (size_t r = 0; r < rows; ++r) {
      std::copy_n(inner_logits.begin() + static_cast<std::ptrdiff_t>(r * n), n, logits.begin() + r * (n + 1));
      logits[r * (n + 1) + n] = fault == Fault::TokenOutOfRange ? 1e9f : -1e9f;
    }
  }

  Fault fault = Fault::None;

 private:
  m40::backend::Backend& inner_;
};

}  // namespace

// A turn that fails after the user message was taken in (the backend
// failing in the prefill, a sampled token out of range while answering)
// leaves the conversation as it was: the next turn answers exactly as in a
// conversation that never had the failed turns.
TEST(ChatSession, AFailedTurnLeavesTheConversationAsItWas) {
  const auto path = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models missing";
  Chat chat(path.string());
  FaultyBackend faulty(*chat.backend);
  const std::atomic<bool> never{false};
  const auto ignore = [](std::string_view) {};

  m40::cli::ChatSession session(faulty, chat.vocab, m40::chat::model_chat_template(chat.model->file));
  const auto first = session.send("The dog", greedy(8), ignore, never);
  const auto before = session.messages();
  ASSERT_EQ(before.size(), 2u);

  faulty.fault = FaultyBackend::Fault::ForwardThrows;
  EXPECT_THROW(session.send("The cat", greedy(8), ignore, never), m40::Error);
  EXPECT_EQ(session.messages(), before);
  faulty.fault = FaultyBackend::Fault::TokenOutOfRange;
  EXPECT_THROW(session.send("The cat", greedy(8), ignore, never), m40::Error);
  EXPECT_EQ(session.messages(), before);

  faulty.fault = FaultyBackend::Fault::None;
  const auto after = session.send("The bird", greedy(8), ignore, never);
  EXPECT_EQ(session.messages().size(), 4u);
  EXPECT_EQ(session.messages()[2]["content"], "The bird");

  Chat other(path.string());
  auto fresh = other.session();
  EXPECT_EQ(fresh.send("The dog", greedy(8), ignore, never).answer, first.answer);
  const auto expected = fresh.send("The bird", greedy(8), ignore, never);
  EXPECT_EQ(after.prompt_tokens, expected.prompt_tokens);
  EXPECT_EQ(after.answer, expected.answer);
}

TEST(ChatSession, ACachedPrefixGivesTheSameAnswerAsAFullPrefill) {
  const auto path = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models missing";
  Chat chat(path.string());
  const std::atomic<bool> never{false};
  const auto ignore = [](std::string_view) {};

  auto reusing = chat.session();
  reusing.set_system("You tell short stories.");
  auto first_messages = reusing.messages();
  first_messages.push_back({{"role", "user"}, {"content", "The dog"}});
  const auto first_prompt = reusing.render_prompt(first_messages);
  const auto first = reusing.send("The dog", greedy(16), ignore, never);
  EXPECT_EQ(first.reused_tokens, 0);
  auto messages = reusing.messages();
  messages.push_back({{"role", "user"}, {"content", "The cat"}});
  const auto second_prompt = reusing.render_prompt(messages);
  const auto second = reusing.send("The cat", greedy(16), ignore, never);
  // At least as much of the first turn's prompt as the second one begins
  // with (whole blocks and the partly filled one after them).
  size_t common = 0;
  while (common < first_prompt.size() && common + 1 < second_prompt.size() &&
         first_prompt[common] == second_prompt[common]) {
    ++common;
  }
  EXPECT_GT(common, 16u);
  EXPECT_GE(second.reused_tokens, static_cast<int>(common));
  EXPECT_EQ(reusing.messages().size(), 4u);

  // The same second prompt read whole by the one-shot generator on a backend
  // of its own.
  Chat other(path.string());
  m40::engine::Generator generator(*other.backend, other.vocab);
  std::string expected;
  generator.generate(second_prompt, greedy(16), [&](std::string_view t) {
    expected += t;
    return true;
  });
  EXPECT_EQ(second.prompt_tokens, static_cast<int>(second_prompt.size()));
  EXPECT_EQ(second.answer, expected);
}

TEST(ChatSession, ACancelledAnswerIsKeptAsFarAsItGot) {
  const auto path = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models missing";
  Chat chat(path.string());
  std::atomic<bool> cancel{false};
  auto session = chat.session();
  std::string shown;
  auto options = greedy(-1);
  options.ignore_eos = true;
  const auto r = session.send("Once upon a time", options,
                              [&](std::string_view text) {
                                shown += text;
                                if (shown.size() > 20) cancel = true;
                              },
                              cancel);
  EXPECT_EQ(r.finish_reason, m40::engine::FinishReason::Cancelled);
  EXPECT_LT(r.generated_tokens, 2000);  // it stopped (the engine notices at its next step)
  EXPECT_EQ(r.answer, shown);
  EXPECT_EQ(session.messages().back()["content"], shown);
}

TEST(ChatSession, AConversationOverTheContextLeavesItAsItWas) {
  const auto path = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models missing";
  Chat chat(path.string());
  const std::atomic<bool> never{false};
  auto session = chat.session();
  std::string huge;
  for (int i = 0; i < 600; ++i) huge += " dog";
  EXPECT_THROW(session.send(huge, greedy(4), [](std::string_view) {}, never), m40::cli::ContextOverflow);
  EXPECT_TRUE(session.messages().empty());
}

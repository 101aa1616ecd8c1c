// The conversation behind the interactive `run`: a turn that builds on the
// cached prefix answers exactly as one that prefills everything.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli/chat_session.h"
#include "engine/backend_factory.h"
#include "model/loaded_model.h"
#include "test_paths.h"

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

}  // namespace

TEST(ChatSession, ACachedPrefixGivesTheSameAnswerAsAFullPrefill) {
  const auto path = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models missing";
  Chat chat(path.string());
  const std::atomic<bool> never{false};
  const auto ignore = [](std::string_view) {};

  auto reusing = chat.session();
  reusing.set_system("You tell short stories.");
  const auto first = reusing.send("The dog", greedy(16), ignore, never);
  EXPECT_EQ(first.reused_tokens, 0);
  const auto second = reusing.send("The cat", greedy(16), ignore, never);
  EXPECT_GE(second.reused_tokens, first.prompt_tokens - 1);
  EXPECT_EQ(reusing.messages().size(), 4u);

  auto full = chat.session();
  full.set_system("You tell short stories.");
  full.forget_cache();  // the backend's cache holds the other session's tokens
  EXPECT_EQ(full.send("The dog", greedy(16), ignore, never).answer, first.answer);
  full.forget_cache();
  const auto again = full.send("The cat", greedy(16), ignore, never);
  EXPECT_EQ(again.reused_tokens, 0);
  EXPECT_EQ(again.prompt_tokens, second.prompt_tokens);
  EXPECT_EQ(again.answer, second.answer);
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
  EXPECT_LT(r.generated_tokens, 30);
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

// The template of a GGUF model: its tokenizer.chat_template with BOS/EOS
// texts from the vocabulary, a named template on request, and the
// documented fallbacks (ChatML when the vocabulary has <|im_start|>, a plain
// transcript otherwise, each starting with BOS when the model adds one).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "chat/model_template.h"
#include "gguf/file.h"
#include "gguf/metadata.h"
#include "test_paths.h"

namespace {

using Json = nlohmann::ordered_json;
using m40::chat::TemplateOrigin;
namespace gguf = m40::gguf;

gguf::Metadata vocabulary(const std::vector<std::string>& tokens, const std::string& model = "gpt2") {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", gguf::Value(model));
  gguf::Array array;
  array.element_type = gguf::ValueType::STRING;
  for (const auto& t : tokens) array.items.emplace_back(t);
  m.set("tokenizer.ggml.tokens", gguf::Value(array));
  m.set("tokenizer.ggml.bos_token_id", gguf::Value(uint32_t{0}));
  m.set("tokenizer.ggml.eos_token_id", gguf::Value(uint32_t{1}));
  return m;
}

const Json kConversation = Json::parse(R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi"},
  {"role": "assistant", "content": "Hello!"},
  {"role": "user", "content": "Bye"}])");
const Json kOnePrompt = Json::parse(R"([{"role": "user", "content": "Once upon a time"}])");

TEST(ChatModelTemplate, UsesTheModelsTemplateWithItsBosAndEos) {
  gguf::Metadata m = vocabulary({"<B>", "<E>", "x"});
  m.set("tokenizer.chat_template", gguf::Value("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"));
  const auto tpl = m40::chat::model_chat_template(m);
  EXPECT_EQ(tpl.origin, TemplateOrigin::Model);
  EXPECT_FALSE(tpl.is_fallback());
  EXPECT_EQ(tpl.bos_token, "<B>");
  EXPECT_EQ(tpl.eos_token, "<E>");
  EXPECT_EQ(tpl.render(kOnePrompt, {}), "<B>Once upon a time<E>");
  EXPECT_EQ(tpl.chat_template.render(kOnePrompt, tpl.options()), "<B>Once upon a time<E>");
}

TEST(ChatModelTemplate, NamedTemplates) {
  gguf::Metadata m = vocabulary({"<B>", "<E>"});
  m.set("tokenizer.chat_template", gguf::Value("default"));
  m.set("tokenizer.chat_template.tool_use", gguf::Value("tools"));
  EXPECT_EQ(m40::chat::model_chat_template(m, "tool_use").render(kOnePrompt, {}), "tools");
  EXPECT_THROW(m40::chat::model_chat_template(m, "rag"), m40::Error);
}

TEST(ChatModelTemplate, ABrokenTemplateIsASyntaxError) {
  gguf::Metadata m = vocabulary({"<B>", "<E>"});
  m.set("tokenizer.chat_template", gguf::Value("{% for m in messages %}"));
  EXPECT_THROW(m40::chat::model_chat_template(m), m40::chat::TemplateSyntaxError);
}

TEST(ChatModelTemplate, ChatMLFallbackWhenTheVocabularyHasItsTokens) {
  const gguf::Metadata m = vocabulary({"<|endoftext|>", "<|im_end|>", "<|im_start|>", "a"});
  const auto tpl = m40::chat::model_chat_template(m);
  EXPECT_EQ(tpl.origin, TemplateOrigin::FallbackChatML);
  EXPECT_EQ(tpl.render(kConversation, {}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  m40::chat::RenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(tpl.render(kOnePrompt, no_prompt), "<|im_start|>user\nOnce upon a time<|im_end|>\n");
}

TEST(ChatModelTemplate, ChatMLFallbackStartsWithBosWhenTheModelAddsOne) {
  gguf::Metadata m = vocabulary({"<s>", "<|im_end|>", "<|im_start|>"});
  m.set("tokenizer.ggml.add_bos_token", gguf::Value(true));
  EXPECT_EQ(m40::chat::model_chat_template(m).render(kOnePrompt, {}),
            "<s><|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatModelTemplate, TranscriptFallbackOtherwise) {
  const gguf::Metadata m = vocabulary({"<|endoftext|>", "<|eot|>", "a"});
  const auto tpl = m40::chat::model_chat_template(m);
  EXPECT_EQ(tpl.origin, TemplateOrigin::FallbackTranscript);
  // A lone prompt is passed through as it is (a base model continues it).
  EXPECT_EQ(tpl.render(kOnePrompt, {}), "Once upon a time");
  EXPECT_EQ(tpl.render(kConversation, {}),
            "system: Be brief.\n\nuser: Hi\n\nassistant: Hello!\n\nuser: Bye\n\nassistant:");
  m40::chat::RenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(tpl.render(kConversation, no_prompt), "system: Be brief.\n\nuser: Hi\n\nassistant: Hello!\n\nuser: Bye\n\n");
}

TEST(ChatModelTemplate, SpmVocabulariesAddBosUnlessTheyDecline) {
  gguf::Metadata m = vocabulary({"<s>", "</s>"}, "llama");
  EXPECT_EQ(m40::chat::model_chat_template(m).render(kOnePrompt, {}), "<s>Once upon a time");
  m.set("tokenizer.ggml.add_bos_token", gguf::Value(false));
  EXPECT_EQ(m40::chat::model_chat_template(m).render(kOnePrompt, {}), "Once upon a time");
}

TEST(ChatModelTemplate, NoVocabularyMeansNoBosOrEos) {
  const gguf::Metadata m;
  const auto tpl = m40::chat::model_chat_template(m);
  EXPECT_EQ(tpl.bos_token, "");
  EXPECT_EQ(tpl.eos_token, "");
  EXPECT_EQ(tpl.render(kOnePrompt, {}), "Once upon a time");
}

TEST(ChatModelTemplate, SharedModelFiles) {
  const auto phi3 = m40::test::shared_model("vocab/ggml-vocab-phi-3.gguf");
  const auto stories = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(phi3) || !std::filesystem::exists(stories)) GTEST_SKIP() << "shared models missing";

  const auto phi = m40::chat::model_chat_template(gguf::File::open(phi3.string()));
  EXPECT_EQ(phi.origin, TemplateOrigin::Model);
  EXPECT_EQ(phi.bos_token, "<s>");
  EXPECT_EQ(phi.render(kConversation, {}),
            "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n");

  const auto tiny = m40::chat::model_chat_template(gguf::File::open(stories.string()));
  EXPECT_EQ(tiny.origin, TemplateOrigin::FallbackTranscript);
  EXPECT_EQ(tiny.bos_token, "<|start_story|>");
  EXPECT_EQ(tiny.render(kOnePrompt, {}), "<|start_story|>Once upon a time");
}

}  // namespace

// The chat template of a GGUF model: its `tokenizer.chat_template` with the
// BOS/EOS token texts from its vocabulary, or the documented fallback for a
// model without one (docs/chat-templates.md):
// - ChatML when the vocabulary has <|im_start|> and <|im_end|> (what
//   llama.cpp's server uses for a model without a template);
// - otherwise a plain transcript: a lone user message renders as its text
//   (Ollama's `{{ .Prompt }}`, right for base models), a conversation as
//   "role: content" paragraphs ending in "assistant:".
// Either fallback starts with the BOS text when the model asks for a BOS
// (tokenizer.ggml.add_bos_token, or an SPM vocabulary that does not say).
#pragma once

#include <string>

#include "chat/chat_template.h"

namespace m40::gguf {
class File;
class Metadata;
}  // namespace m40::gguf

namespace m40::chat {

enum class TemplateOrigin {
  Model,               // tokenizer.chat_template (or the named one asked for)
  FallbackChatML,      // no template, <|im_start|> in the vocabulary
  FallbackTranscript,  // no template, no ChatML tokens
};
const char* template_origin_name(TemplateOrigin origin);

struct ModelChatTemplate {
  ChatTemplate chat_template;
  std::string bos_token;  // text of tokenizer.ggml.bos_token_id ("" if none)
  std::string eos_token;  // text of tokenizer.ggml.eos_token_id ("" if none)
  TemplateOrigin origin = TemplateOrigin::Model;

  bool is_fallback() const { return origin != TemplateOrigin::Model; }
  // Options with this model's BOS and EOS filled in.
  RenderOptions options() const;
  // Renders with the model's BOS and EOS (overriding those in `options`).
  std::string render(const nlohmann::ordered_json& messages, RenderOptions options) const;
};

// `name` picks `tokenizer.chat_template.<name>` (e.g. "tool_use"); empty
// picks the default template. Throws TemplateSyntaxError when the model's
// template does not parse, m40::Error when a named template is missing.
ModelChatTemplate model_chat_template(const gguf::Metadata& metadata, const std::string& name = "");
ModelChatTemplate model_chat_template(const gguf::File& file, const std::string& name = "");
// `source` in place of the model's own template, with the model's BOS and
// EOS texts (a server's --chat-template-file). Throws TemplateSyntaxError.
ModelChatTemplate model_chat_template_from_source(const gguf::Metadata& metadata, std::string source);

// The fallback templates' sources (also shown in the docs).
std::string chatml_fallback_source(bool with_bos);
std::string transcript_fallback_source(bool with_bos);

}  // namespace m40::chat

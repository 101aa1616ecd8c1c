#include "chat/model_template.h"

#include "gguf/file.h"
#include "gguf/metadata.h"

namespace m40::chat {

namespace {

constexpr const char* kChatML =
    "{%- for message in messages -%}\n"
    "{%- set content = message['content'] if message['content'] is string else '' -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

constexpr const char* kTranscript =
    "{%- set lone_prompt = messages | length == 1 and messages[0]['role'] == 'user' -%}\n"
    "{%- for message in messages -%}\n"
    "{%- set content = message['content'] if message['content'] is string else '' -%}\n"
    "{%- if lone_prompt -%}\n"
    "{{- content -}}\n"
    "{%- else -%}\n"
    "{{- message['role'] + ': ' + content + '\\n\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt and not lone_prompt -%}\n"
    "{{- 'assistant:' -}}\n"
    "{%- endif -%}\n";

std::string with_bos_prefix(const char* body, bool with_bos) {
  return (with_bos ? std::string("{{- bos_token -}}\n") : std::string()) + body;
}

std::string token_text(const gguf::Metadata& m, const char* id_key) {
  const auto id = m.get_optional<uint32_t>(id_key);
  if (!id || !m.contains("tokenizer.ggml.tokens")) return "";
  const gguf::Array& tokens = m.get_array_value("tokenizer.ggml.tokens");
  if (*id >= tokens.items.size()) return "";
  return gguf::convert_value<std::string>(tokens.items[*id], "tokenizer.ggml.tokens item");
}

bool vocabulary_has(const gguf::Metadata& m, const std::string& a, const std::string& b) {
  if (!m.contains("tokenizer.ggml.tokens")) return false;
  bool has_a = false, has_b = false;
  for (const auto& item : m.get_array_value("tokenizer.ggml.tokens").items) {
    if (const auto* s = std::get_if<std::string>(&item.storage)) {
      has_a = has_a || *s == a;
      has_b = has_b || *s == b;
      if (has_a && has_b) return true;
    }
  }
  return false;
}

}  // namespace

const char* template_origin_name(TemplateOrigin origin) {
  switch (origin) {
    case TemplateOrigin::Model: return "model";
    case TemplateOrigin::FallbackChatML: return "fallback (ChatML)";
    case TemplateOrigin::FallbackTranscript: return "fallback (plain transcript)";
  }
  return "unknown";
}

std::string chatml_fallback_source(bool with_bos) { return with_bos_prefix(kChatML, with_bos); }
std::string transcript_fallback_source(bool with_bos) { return with_bos_prefix(kTranscript, with_bos); }

RenderOptions ModelChatTemplate::options() const {
  RenderOptions o;
  o.bos_token = bos_token;
  o.eos_token = eos_token;
  return o;
}

std::string ModelChatTemplate::render(const nlohmann::ordered_json& messages, RenderOptions options) const {
  options.bos_token = bos_token;
  options.eos_token = eos_token;
  return chat_template.render(messages, options);
}

ModelChatTemplate model_chat_template(const gguf::Metadata& m, const std::string& name) {
  const std::string key = name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name;
  const auto source = m.get_optional<std::string>(key);
  if (!source && !name.empty()) throw Error("the model has no chat template named '" + name + "' (" + key + ")");
  const std::string bos = token_text(m, "tokenizer.ggml.bos_token_id");
  const std::string eos = token_text(m, "tokenizer.ggml.eos_token_id");
  if (source) return ModelChatTemplate{ChatTemplate(*source), bos, eos, TemplateOrigin::Model};

  // llama.cpp adds a BOS when add_bos_token says so, and for SPM ("llama")
  // vocabularies when the key is absent.
  const bool add_bos = m.get_optional<bool>("tokenizer.ggml.add_bos_token")
                           .value_or(m.get_optional<std::string>("tokenizer.ggml.model").value_or("") == "llama");
  const bool with_bos = add_bos && !bos.empty();
  if (vocabulary_has(m, "<|im_start|>", "<|im_end|>")) {
    return ModelChatTemplate{ChatTemplate(chatml_fallback_source(with_bos)), bos, eos, TemplateOrigin::FallbackChatML};
  }
  return ModelChatTemplate{ChatTemplate(transcript_fallback_source(with_bos)), bos, eos,
                           TemplateOrigin::FallbackTranscript};
}

ModelChatTemplate model_chat_template_from_source(const gguf::Metadata& m, std::string source) {
  return ModelChatTemplate{ChatTemplate(std::move(source)), token_text(m, "tokenizer.ggml.bos_token_id"),
                           token_text(m, "tokenizer.ggml.eos_token_id"), TemplateOrigin::Model};
}

ModelChatTemplate model_chat_template(const gguf::File& file, const std::string& name) {
  return model_chat_template(file.metadata(), name);
}

}  // namespace m40::chat

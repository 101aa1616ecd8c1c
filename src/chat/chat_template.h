// Chat templates: the Jinja2 program a model ships in `tokenizer.chat_template`
// that turns a list of messages into the prompt text. ChatTemplate renders
// it exactly as Hugging Face transformers' apply_chat_template(...,
// tokenize=False) does (Jinja2 with trim_blocks, lstrip_blocks,
// loopcontrols, transformers' tojson, raise_exception and strftime_now).
//
//   m40::chat::ChatTemplate tpl(source);          // parses; TemplateSyntaxError
//   RenderOptions o;
//   o.bos_token = "<s>";
//   std::string prompt = tpl.render(messages, o); // TemplateRenderError
//
// See docs/chat-templates.md for the supported Jinja subset and the
// fallback used for models without a template (chat/model_template.h).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

#include "chat/jinja/format.h"
#include "chat/jinja/render_limits.h"
#include "chat/jinja/template_error.h"

namespace m40::chat {

namespace jinja {
struct Template;
}

struct RenderOptions {
  // Append the opening of an assistant turn (the model's cue to answer).
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // Tool definitions (OpenAI "tools" array) or null: the template sees none.
  nlohmann::ordered_json tools = nullptr;
  // Retrieval documents or null (transformers passes `documents` too).
  nlohmann::ordered_json documents = nullptr;
  // More template variables, e.g. {"enable_thinking": false}; they override
  // the ones above of the same name.
  nlohmann::ordered_json extra_variables = nlohmann::ordered_json::object();
  // What strftime_now() formats; unset: the local time when rendering.
  std::optional<DateTime> now;
  RenderLimits limits;
};

class ChatTemplate {
 public:
  // Parses the template; throws TemplateSyntaxError (line, column) if it is
  // not valid Jinja or uses something m40-llm does not support.
  explicit ChatTemplate(std::string source);

  // Renders `messages` (a JSON array of {"role": ..., "content": ...}
  // objects, passed to the template as they are). Throws TemplateRaisedError
  // for raise_exception(), TemplateLimitError when a bound is hit, and
  // TemplateRenderError for other failures; m40::Error if messages is not
  // an array.
  std::string render(const nlohmann::ordered_json& messages, const RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Template> tree_;
};

}  // namespace m40::chat

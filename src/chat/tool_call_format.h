// How a chat-template family writes tool calls and reasoning, told from the
// template's Jinja source (and, where the source is not enough, from the
// vocabulary). The parser (tool_call_parser.h) reads a model's answer in
// the format found here; the grammar (tool_call_grammar.h) forces one.
//
//   auto traits = m40::chat::template_traits(model_template.chat_template.source());
//   if (traits.tool_format == ToolCallFormat::None) ... // tools cannot be offered
//
// The families, as the model writes its calls:
//   Hermes       <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>   Qwen 2.5/3, Hermes 2/3, SmolLM3
//   Llama3       {"name": ..., "parameters": {...}} as the whole answer, or
//                <|python_tag|> then such a call or `brave_search.call(query="...")`
//   MistralNemo  [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcdefghi"}, ...]
//   Mistral      [TOOL_CALLS]name[ARGS]{...}   (Mistral Small 3.2, Magistral, Devstral)
//   DeepSeekV3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//   Granite      <|tool_call|>[{"name": ..., "arguments": {...}}]
//   Phi4         <|tool_call|>[...]<|/tool_call|>  (Phi-4-mini; its template reads the tools
//                from the system message's "tools" field, not from `tools`)
//   Generic      {"tool_call": {"name": ..., "arguments": {...}}}, {"tool_calls": [...]},
//                {"name": ..., "arguments": ...} or {"response": "..."} as the whole answer,
//                asked for by generic_tool_instruction() in the system prompt
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>

namespace m40::chat {

enum class ToolCallFormat { None, Hermes, Llama3, MistralNemo, Mistral, DeepSeekV3, Granite, Phi4, Generic };

// "none", "hermes", "llama3", "mistral-nemo", "mistral", "deepseek-v3", "granite", "phi4", "generic".
std::string_view tool_call_format_name(ToolCallFormat format);

struct TemplateTraits {
  // The template reads the `tools` variable: it puts the definitions into the prompt itself.
  bool renders_tools = false;
  // The template knows a reasoning section (it mentions the thinking tags).
  bool has_thinking = false;
  // The family's call format. A family is known from its call markers even when the template
  // does not render the definitions (DeepSeek R1 distills); None when the template neither
  // renders tools nor shows a call format (Gemma 2, Phi-3.5): such a model was not trained
  // to call tools. Generic for a template that renders tools in no known format.
  ToolCallFormat tool_format = ToolCallFormat::None;
  std::string thinking_open;   // "<think>" (or "[THINK]"), empty without thinking
  std::string thinking_close;  // "</think>" (or "[/THINK]")
};

// Whether the vocabulary has a token of exactly this text (a special token such as "[ARGS]").
using HasToken = std::function<bool(std::string_view token_text)>;

// From the Jinja source. `has_token`, when given, settles what the source leaves open: the
// newer Mistral form when the vocabulary has [ARGS], Hermes or DeepSeek V3 for a template that
// renders tools without markers when the vocabulary has their call tokens.
TemplateTraits template_traits(std::string_view template_source, const HasToken& has_token = nullptr);

// True when the rendered prompt ends inside an open reasoning section (DeepSeek R1's
// generation prompt ends in "<think>\n"): the answer then starts as reasoning.
bool prompt_opens_thinking(const TemplateTraits& traits, std::string_view rendered_prompt);

// The system-prompt text llama.cpp adds for the Generic format, and that addition applied
// to an OpenAI messages array: appended to a leading system message after a blank line, or
// as a new first system message.
std::string_view generic_tool_instruction();
nlohmann::ordered_json with_system_instruction(const nlohmann::ordered_json& messages, std::string_view instruction);

}  // namespace m40::chat

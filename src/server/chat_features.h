// What a chat request asks beyond its messages, read once for every API:
// tools and the tool choice, a required answer shape (JSON object, JSON
// schema, GBNF grammar), and thinking. From them come the template's
// variables, the grammar the answer is decoded under, and how the answer's
// text is split back into content, reasoning and tool calls.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "chat/tool_call_format.h"
#include "chat/tool_call_parser.h"
#include "engine/token_loop.h"
#include "server/model_manager.h"
#include "server/server_context.h"

namespace m40::server {

enum class ToolChoice { None, Auto, Required, Named };

struct ChatFeatures {
  json tools = nullptr;  // OpenAI-style tools array (Ollama's has the same shape), or null
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string forced_function;     // ToolChoice::Named
  bool parallel_tool_calls = true;
  std::optional<std::string> grammar;  // GBNF the content must match (response_format, format, json_schema, grammar)
  std::optional<bool> thinking;        // asked for explicitly (Ollama think, enable_thinking); nullopt: the template's default
  json template_variables = json::object();  // llama.cpp's chat_template_kwargs

  bool has_tools() const { return tools.is_array() && !tools.empty() && tool_choice != ToolChoice::None; }
};

// OpenAI chat: tools, tool_choice, parallel_tool_calls, response_format,
// and llama.cpp's json_schema, grammar and chat_template_kwargs. HttpError
// 400 naming the field for a wrong shape.
ChatFeatures openai_chat_features(const json& body);
// OpenAI completions: response_format, json_schema, grammar (no tools).
ChatFeatures openai_completion_features(const json& body);
// Ollama chat and generate: tools (chat only), format ("json" or a JSON
// schema), think.
ChatFeatures ollama_features(const json& body, bool chat);

// How one answer is decoded and read back, for a resident model.
struct AnswerPlan {
  // How the text is read back: the family's tool-call format (with tools),
  // the thinking section (when the template has one; begun already when
  // the prompt opened it).
  chat::AnswerOptions reading;
  engine::AnswerGrammar grammar;
};

// Renders the messages with the request's tools and variables and
// tokenizes them (as chat_prompt), and plans the answer. HttpError 400 when
// the model's template cannot render tools ("does not support tools", as
// Ollama says), a forced function is not among the tools, or the grammar
// or schema is invalid.
std::vector<int32_t> feature_chat_prompt(ResidentModel& m, const json& messages, const ChatFeatures& features,
                                         bool truncate, int n_ctx, AnswerPlan& plan);
// The plan of a plain-prompt answer (completions, Ollama raw generate): only a grammar.
AnswerPlan completion_plan(ResidentModel& m, const ChatFeatures& features);

// An answer's text split as the plan says: reasoning, content, tool calls
// (all content when the plan asks for neither).
chat::ParsedAnswer read_answer(const AnswerPlan& plan, const std::string& text);
// The same, piece by piece as the answer streams.
std::unique_ptr<chat::StreamingAnswerParser> answer_stream(const AnswerPlan& plan);
// Whether the plan splits the text at all.
inline bool splits_answer(const AnswerPlan& plan) { return plan.reading.tools_given || plan.reading.thinking; }

// What the model's template supports, for Ollama's /api/show capabilities.
// `insert`: the vocabulary has fill-in-the-middle tokens; `embedding`: the
// model declares a pooling (an embedding model).
json model_capabilities(const chat::TemplateTraits& traits, bool insert, bool embedding);

}  // namespace m40::server

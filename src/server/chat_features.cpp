#include "server/chat_features.h"

#include <algorithm>

#include "chat/tool_call_grammar.h"
#include "engine/answer_grammar.h"
#include "grammar/gbnf_builder.h"
#include "grammar/grammar.h"
#include "grammar/token_constraint.h"
#include "server/prompt_tokens.h"
#include "server/request_fields.h"

namespace m40::server {

namespace {

// Compiles a JSON schema the client sent; its faults are the client's.
std::string schema_grammar(const json& schema, const char* field) {
  try {
    return grammar::json_schema_to_gbnf(schema);
  } catch (const Error& e) {
    throw HttpError{400, std::string("'") + field + "' holds a JSON schema this server cannot enforce: " + e.what()};
  }
}

// OpenAI's tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
json checked_tools(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return nullptr;
  if (!it->is_array()) throw HttpError{400, std::string("'") + field + "' must be a list of tools"};
  for (const auto& tool : *it) {
    const bool function = tool.is_object() && tool.value("type", "function") == "function" && tool.contains("function") &&
                          tool["function"].is_object() && tool["function"].contains("name") &&
                          tool["function"]["name"].is_string();
    if (!function) {
      throw HttpError{400, std::string("each of '") + field +
                               "' must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}"};
    }
    if (auto p = tool["function"].find("parameters"); p != tool["function"].end() && !p->is_null() && !p->is_object()) {
      throw HttpError{400, "a tool's 'parameters' must be a JSON schema object"};
    }
  }
  return *it;
}

void read_tool_choice(const json& body, ChatFeatures& f) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return;
  if (it->is_string()) {
    const std::string& c = it->get_ref<const std::string&>();
    if (c == "none") f.tool_choice = ToolChoice::None;
    else if (c == "auto") f.tool_choice = ToolChoice::Auto;
    else if (c == "required") f.tool_choice = ToolChoice::Required;
    else throw HttpError{400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"};
    return;
  }
  if (it->is_object() && it->value("type", "") == "function" && it->contains("function") && (*it)["function"].is_object() &&
      (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
    f.tool_choice = ToolChoice::Named;
    f.forced_function = (*it)["function"]["name"].get<std::string>();
    return;
  }
  throw HttpError{400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"};
}

// llama.cpp's json_schema and grammar fields, shared by chat and completions.
void read_llama_cpp_shapes(const json& body, ChatFeatures& f) {
  if (auto it = body.find("json_schema"); it != body.end() && !it->is_null()) {
    if (!it->is_object() && !it->is_boolean()) throw HttpError{400, "'json_schema' must be a JSON schema object"};
    f.grammar = schema_grammar(*it, "json_schema");
  }
  if (auto g = get_string(body, "grammar"); g && !g->empty()) {
    if (f.grammar) throw HttpError{400, "'grammar' and a JSON schema cannot both shape the answer"};
    f.grammar = *g;
  }
}

// OpenAI's response_format: text, json_object, or json_schema {name, schema, strict}.
void read_response_format(const json& body, ChatFeatures& f) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
    throw HttpError{400, "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}"};
  }
  const std::string type = (*it)["type"].get<std::string>();
  std::optional<std::string> shape;
  if (type == "text") return;
  if (type == "json_object") {
    shape = grammar::json_object_gbnf();
  } else if (type == "json_schema") {
    auto js = it->find("json_schema");
    if (js == it->end() || !js->is_object()) throw HttpError{400, "'response_format.json_schema' must be an object with a 'schema'"};
    auto schema = js->find("schema");
    // OpenAI lets the schema be left out: then any JSON object.
    shape = schema == js->end() || schema->is_null() ? grammar::json_object_gbnf()
                                                     : schema_grammar(*schema, "response_format.json_schema.schema");
  } else {
    throw HttpError{400, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\""};
  }
  if (f.grammar) throw HttpError{400, "'response_format' and 'json_schema' or 'grammar' cannot both shape the answer"};
  f.grammar = std::move(shape);
}

// A tool call's arguments as the templates expect them: an object (OpenAI
// sends a JSON string; templates write `arguments | tojson`, which would
// quote it twice).
json template_messages(const json& messages) {
  json out = messages;
  for (auto& m : out) {
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (auto& call : *calls) {
      if (!call.is_object()) continue;
      json* fn = call.contains("function") && call["function"].is_object() ? &call["function"] : &call;
      auto args = fn->find("arguments");
      if (args == fn->end() || !args->is_string()) continue;
      try {
        *args = json::parse(args->get<std::string>());
      } catch (const json::parse_error&) {
        // Not JSON: kept as the text it is.
      }
    }
  }
  return out;
}

std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(ResidentModel& m) {
  std::lock_guard lock(m.grammar_vocabulary_mutex);
  if (!m.grammar_vocabulary) m.grammar_vocabulary = engine::grammar_vocabulary(*m.vocab);
  return m.grammar_vocabulary;
}

engine::AnswerGrammar compile(ResidentModel& m, const std::string& gbnf) {
  engine::AnswerGrammar g;
  try {
    g = engine::answer_grammar(gbnf, grammar_vocabulary(m));
  } catch (const grammar::GrammarError& e) {
    throw HttpError{400, std::string("the grammar is not valid GBNF: ") + e.what()};
  }
  // A grammar this vocabulary cannot even begin is the request's fault, not
  // the engine's: refused before it is queued.
  if (!grammar::TokenConstraint(g.grammar, g.vocabulary).allows_any()) {
    throw HttpError{400, "the grammar cannot begin with any token of the model '" + m.name + "': its vocabulary cannot spell it"};
  }
  return g;
}

}  // namespace

ChatFeatures openai_chat_features(const json& body) {
  ChatFeatures f;
  f.tools = checked_tools(body, "tools");
  read_tool_choice(body, f);
  if (auto p = get_bool(body, "parallel_tool_calls")) f.parallel_tool_calls = *p;
  if ((f.tool_choice == ToolChoice::Required || f.tool_choice == ToolChoice::Named) && !f.has_tools()) {
    throw HttpError{400, "'tool_choice' asks for a tool call but 'tools' is empty"};
  }
  read_response_format(body, f);
  read_llama_cpp_shapes(body, f);
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw HttpError{400, "'chat_template_kwargs' must be an object of template variables"};
    f.template_variables = *it;
    if (auto t = it->find("enable_thinking"); t != it->end() && t->is_boolean()) f.thinking = t->get<bool>();
  }
  return f;
}

ChatFeatures openai_completion_features(const json& body) {
  ChatFeatures f;
  read_response_format(body, f);
  read_llama_cpp_shapes(body, f);
  return f;
}

ChatFeatures ollama_features(const json& body, bool chat) {
  ChatFeatures f;
  if (chat) f.tools = checked_tools(body, "tools");
  if (auto it = body.find("format"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string& s = it->get_ref<const std::string&>();
      if (s == "json") f.grammar = grammar::json_object_gbnf();
      else if (!s.empty()) throw HttpError{400, "'format' must be \"json\" or a JSON schema, got \"" + s + "\""};
    } else if (it->is_object()) {
      f.grammar = schema_grammar(*it, "format");
    } else {
      throw HttpError{400, "'format' must be \"json\" or a JSON schema object"};
    }
  }
  if (auto it = body.find("think"); it != body.end() && !it->is_null()) {
    // Newer Ollama also takes "low" / "medium" / "high" for gpt-oss; the
    // templates here know on and off only.
    if (!it->is_boolean()) throw HttpError{400, "'think' must be true or false"};
    f.thinking = it->get<bool>();
  }
  return f;
}

std::vector<int32_t> feature_chat_prompt(ResidentModel& m, const json& messages, const ChatFeatures& features,
                                         bool truncate, int n_ctx, AnswerPlan& plan) {
  const chat::TemplateTraits& traits = m.template_traits;
  const bool tools = features.has_tools();
  if (tools && !traits.renders_tools) {
    throw HttpError{400, "the model '" + m.name + "' does not support tools (its chat template does not render them)"};
  }
  if (features.thinking.value_or(false) && !traits.has_thinking) {
    throw HttpError{400, "the model '" + m.name + "' does not support thinking (its chat template has no thinking section)"};
  }
  const chat::ModelChatTemplate& tpl = tools && m.tool_use_template ? *m.tool_use_template : *m.chat_template;
  chat::RenderOptions options = tpl.options();
  options.add_generation_prompt = true;
  if (features.tools.is_array() && !features.tools.empty()) options.tools = features.tools;
  for (const auto& [key, value] : features.template_variables.items()) options.extra_variables[key] = value;
  if (features.thinking) options.extra_variables["enable_thinking"] = *features.thinking;
  // A template that takes tools in no known format is asked for llama.cpp's
  // generic JSON answer in the system prompt.
  const json rendered_messages = tools && traits.tool_format == chat::ToolCallFormat::Generic
                                     ? chat::with_system_instruction(template_messages(messages), chat::generic_tool_instruction())
                                     : template_messages(messages);
  std::string text;
  try {
    text = tpl.render(rendered_messages, options);
  } catch (const Error& e) {
    throw HttpError{400, std::string("the model's chat template could not render these messages: ") + e.what()};
  }

  std::optional<std::string> gbnf = features.grammar;
  if (tools && (features.tool_choice == ToolChoice::Required || features.tool_choice == ToolChoice::Named)) {
    if (gbnf) throw HttpError{400, "a forced tool call and 'response_format' cannot both shape the answer"};
    std::optional<std::string> only;
    if (features.tool_choice == ToolChoice::Named) {
      const bool known = std::any_of(features.tools.begin(), features.tools.end(), [&](const json& t) {
        return t["function"]["name"] == features.forced_function;
      });
      if (!known) throw HttpError{400, "'tool_choice' names the function '" + features.forced_function + "', which is not among 'tools'"};
      only = features.forced_function;
    }
    try {
      gbnf = chat::forced_tool_call_grammar(traits.tool_format, features.tools, only, features.parallel_tool_calls);
    } catch (const Error& e) {
      throw HttpError{400, std::string("cannot force a tool call: ") + e.what()};
    }
  }
  const bool thinking = traits.has_thinking && features.thinking.value_or(true) && !traits.thinking_open.empty();
  if (gbnf) {
    plan.grammar = compile(m, *gbnf);
    // Reasoning stays free: with thinking on, the grammar shapes what
    // follows the section, which the prompt opens if the template did not.
    if (thinking) {
      if (!chat::prompt_opens_thinking(traits, text)) text += traits.thinking_open + "\n";
      plan.grammar.starts_after = traits.thinking_close;
    }
  }
  plan.reading = chat::answer_options(traits, tools, text);
  plan.reading.thinking = plan.reading.thinking && features.thinking.value_or(true);
  // The rendered text carries BOS where the template wants it.
  return prompt_tokens(*m.vocab, m.max_token_bytes, n_ctx, text, false, truncate);
}

AnswerPlan completion_plan(ResidentModel& m, const ChatFeatures& features) {
  AnswerPlan plan;
  if (features.grammar) plan.grammar = compile(m, *features.grammar);
  return plan;
}

chat::ParsedAnswer read_answer(const AnswerPlan& plan, const std::string& text) {
  if (!splits_answer(plan)) return chat::ParsedAnswer{.content = text, .reasoning = {}, .tool_calls = {}};
  return chat::parse_answer(plan.reading, text);
}

std::unique_ptr<chat::StreamingAnswerParser> answer_stream(const AnswerPlan& plan) {
  return std::make_unique<chat::StreamingAnswerParser>(plan.reading);
}

json model_capabilities(const chat::TemplateTraits& traits, bool insert, bool embedding) {
  // An embedding model answers embeddings only (generation is refused).
  if (embedding) return json::array({"embedding"});
  json caps = json::array({"completion"});
  if (traits.renders_tools) caps.push_back("tools");
  if (traits.has_thinking) caps.push_back("thinking");
  if (insert) caps.push_back("insert");
  return caps;
}

}  // namespace m40::server

#include "chat/tool_call_grammar.h"

#include <utility>
#include <vector>

#include "common/error.h"
#include "grammar/gbnf_builder.h"

namespace m40::chat {

namespace {

using Json = nlohmann::ordered_json;
using grammar::gbnf_literal;

struct Function {
  std::string name;
  Json parameters;
};

std::vector<Function> functions_of(const Json& tools, const std::optional<std::string>& only_function) {
  std::vector<Function> out;
  if (tools.is_array()) {
    for (const auto& tool : tools) {
      const Json& f = tool.is_object() && tool.contains("function") ? tool.at("function") : tool;
      if (!f.is_object() || !f.contains("name") || !f.at("name").is_string()) continue;
      const std::string name = f.at("name").get<std::string>();
      if (only_function && name != *only_function) continue;
      Json parameters = f.contains("parameters") && f.at("parameters").is_object() ? f.at("parameters")
                                                                                  : Json{{"type", "object"}};
      out.push_back({name, std::move(parameters)});
    }
  }
  if (out.empty()) {
    throw Error(only_function ? "tool_choice names the function \"" + *only_function +
                                    "\", which is not among the tools; name one of the tools' functions"
                              : std::string("no function to call: give tools with a function name each"));
  }
  return out;
}

// A rule-name hint from a function name (GBNF names are letters, digits and '-').
std::string hint(std::string_view name, std::string_view suffix) {
  std::string out;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out += ok ? c : '-';
  }
  return out + "-" + std::string(suffix);
}

std::string quoted(const std::string& name) { return Json(name).dump(); }

}  // namespace

std::string forced_tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                     std::optional<std::string> only_function, bool parallel) {
  if (format == ToolCallFormat::None) {
    throw Error("this model's chat template has no tool-call format; tools cannot be forced for it");
  }
  const auto functions = functions_of(tools, only_function);
  grammar::GbnfBuilder b;

  // One alternative per function: the call as the family writes it.
  std::string alternatives;
  for (const auto& f : functions) {
    const std::string args = b.add_json_schema(f.parameters, hint(f.name, "args"));
    std::string body;
    switch (format) {
      case ToolCallFormat::Hermes:
        body = gbnf_literal("<tool_call>\n{\"name\": " + quoted(f.name) + ", \"arguments\": ") + " " + args + " " +
               gbnf_literal("}\n</tool_call>");
        break;
      case ToolCallFormat::Llama3:
        body = gbnf_literal("{\"name\": " + quoted(f.name) + ", \"parameters\": ") + " " + args + " " +
               gbnf_literal("}");
        break;
      case ToolCallFormat::MistralNemo:
        body = gbnf_literal("{\"name\": " + quoted(f.name) + ", \"arguments\": ") + " " + args + " " +
               gbnf_literal(", \"id\": \"") + " [a-zA-Z0-9]{9} " + gbnf_literal("\"}");
        break;
      case ToolCallFormat::Mistral:
        body = gbnf_literal("[TOOL_CALLS]" + f.name + "[ARGS]") + " " + args;
        break;
      case ToolCallFormat::DeepSeekV3:
        body = gbnf_literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + f.name + "\n```json\n") + " " + args + " " +
               gbnf_literal("\n```<｜tool▁call▁end｜>");
        break;
      case ToolCallFormat::Granite:
      case ToolCallFormat::Phi4:
      case ToolCallFormat::Generic:
        body = gbnf_literal("{\"name\": " + quoted(f.name) + ", \"arguments\": ") + " " + args + " " +
               gbnf_literal("}");
        break;
      case ToolCallFormat::None: break;
    }
    if (!alternatives.empty()) alternatives += " | ";
    alternatives += b.add_rule(hint(f.name, "call"), body);
  }
  const std::string call = b.add_rule("call", alternatives);

  // The calls, and what goes around them.
  const auto calls = [&](std::string_view separator) {
    return parallel ? call + " (" + gbnf_literal(separator) + " " + call + ")*" : call;
  };
  switch (format) {
    case ToolCallFormat::Hermes: return b.build(calls("\n"));
    case ToolCallFormat::Llama3: return b.build(calls("; "));
    case ToolCallFormat::MistralNemo:
      return b.build(gbnf_literal("[TOOL_CALLS][") + " " + calls(", ") + " " + gbnf_literal("]"));
    case ToolCallFormat::Mistral: return b.build(parallel ? call + "+" : call);
    case ToolCallFormat::DeepSeekV3:
      return b.build(gbnf_literal("<｜tool▁calls▁begin｜>") + " " + calls("\n") + " " +
                     gbnf_literal("<｜tool▁calls▁end｜>"));
    case ToolCallFormat::Granite: return b.build(gbnf_literal("<|tool_call|>[") + " " + calls(", ") + " " + gbnf_literal("]"));
    case ToolCallFormat::Phi4:
      return b.build(gbnf_literal("<|tool_call|>[") + " " + calls(", ") + " " + gbnf_literal("]<|/tool_call|>"));
    case ToolCallFormat::Generic:
      return parallel ? b.build(gbnf_literal("{\"tool_calls\": [") + " " + calls(", ") + " " + gbnf_literal("]}"))
                      : b.build(gbnf_literal("{\"tool_call\": ") + " " + call + " " + gbnf_literal("}"));
    case ToolCallFormat::None: break;
  }
  return {};
}

}  // namespace m40::chat

// The GBNF grammar that makes a model's answer exactly a tool call (or, with
// `parallel`, one or more calls) in its family's format, to one of the given
// functions, with arguments valid under the function's `parameters` JSON
// schema. The markers are written as the model writes them, so
// tool_call_parser.h reads the calls back:
//
//   Hermes       <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>     (parallel: "\n" between)
//   Llama3       {"name": "NAME", "parameters": ARGS}                               (parallel: "; " between)
//   MistralNemo  [TOOL_CALLS][{"name": "NAME", "arguments": ARGS, "id": "9 alphanumerics"}, ...]
//   Mistral      [TOOL_CALLS]NAME[ARGS]ARGS                                          (parallel: repeated)
//   DeepSeekV3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   Granite      <|tool_call|>[{"name": "NAME", "arguments": ARGS}, ...]
//   Phi4         <|tool_call|>[{"name": "NAME", "arguments": ARGS}, ...]<|/tool_call|>
//   Generic      {"tool_call": {"name": "NAME", "arguments": ARGS}}, parallel {"tool_calls": [...]}
//
// The grammar covers the whole answer from its first byte: a reasoning section
// is not part of it (force a call only where the model does not think first,
// or start the grammar after the reasoning). Special tokens such as
// <tool_call> are matched as their text.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "chat/tool_call_format.h"

namespace m40::chat {

// `tools`: an OpenAI tools array ({"type": "function", "function": {"name",
// "parameters", ...}}); a function without `parameters` takes an object.
// `only_function`: the one function to call (tool_choice naming a function).
// Throws m40::Error for the None format, no functions, or an unknown
// only_function; grammar::GrammarError for a schema the builder cannot take.
std::string forced_tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                     std::optional<std::string> only_function, bool parallel);

}  // namespace m40::chat

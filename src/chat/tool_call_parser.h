// A model's answer read back into content, reasoning and tool calls, in the
// format of its template family (tool_call_format.h): whole, or streamed as
// the token loop hands out text pieces.
//
//   StreamingAnswerParser parser(answer_options(traits, /*tools_given=*/true, prompt));
//   for (piece : pieces) send(parser.push(piece));  // deltas to send now
//   send(parser.finish());
//   parser.answer();                                 // the whole message
//
// What the parser does with the text:
// - Reasoning: with `thinking`, an answer that starts with the open tag (or
//   whose prompt opened it: starts_in_thinking) has reasoning up to the close
//   tag, or to the end when the tag never comes; it is returned trimmed, and
//   whitespace after the close tag is dropped.
// - Calls (only with tools_given): the family's markers start a call; the
//   whitespace just before a marker and between or after calls is dropped. A
//   call's name comes first, then its arguments in pieces as they arrive;
//   arguments are the model's JSON object with the whitespace outside strings
//   removed (a string holding a JSON object, as some models write, is parsed
//   and dumped compactly; null gives {}).
// - Text that only looks like a call stays content, byte for byte: a marker
//   followed by no call object, a call object without a name (or, for
//   Llama3 and the bare Generic object, without arguments), invalid JSON.
// - Streaming holds back text that may be the start of a marker, and a call
//   until its name and the start of its arguments are known (nothing of a call
//   that turns out not to be one is ever sent). A call that breaks after that
//   (invalid JSON in its arguments, or the output ending inside it) cannot be
//   taken back: its deltas stay sent, while answer() and parse_answer() leave
//   it out and give its text as content (which the stream sends as content too).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_call_format.h"

namespace m40::chat {

struct ToolCall {
  std::string id;         // "call_" + 24 alphanumerics; Mistral Nemo: 9 alphanumerics
  std::string name;
  std::string arguments;  // a JSON object as compact text
};

struct ParsedAnswer {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

struct AnswerOptions {
  ToolCallFormat tool_format = ToolCallFormat::None;
  bool tools_given = false;          // off: no call is read, all of it is content
  bool thinking = false;             // read a leading reasoning section
  bool starts_in_thinking = false;   // the prompt opened it (prompt_opens_thinking)
  std::string thinking_open = "<think>";
  std::string thinking_close = "</think>";
  uint64_t id_seed = 0;              // nonzero: the same ids every time (tests)
};

// The options for reading an answer to `rendered_prompt` from a model with these template
// traits: its format and thinking tags, reasoning read when the template has it, and
// started when the prompt ends inside the section (DeepSeek R1).
AnswerOptions answer_options(const TemplateTraits& traits, bool tools_given, std::string_view rendered_prompt);

// Whole output -> content + reasoning + calls.
ParsedAnswer parse_answer(const AnswerOptions& options, std::string_view output);
ParsedAnswer parse_answer(ToolCallFormat format, std::string_view output, bool tools_given, bool thinking);

struct AnswerDelta {
  std::string content;
  std::string reasoning;
  struct CallDelta {
    int index;              // the call's place in the answer's stream, from 0
    std::string id;         // id and name only in a call's first delta
    std::string name;
    std::string arguments;  // the next piece of the arguments text
  };
  std::vector<CallDelta> calls;

  bool empty() const { return content.empty() && reasoning.empty() && calls.empty(); }
};

class StreamingAnswerParser {
 public:
  explicit StreamingAnswerParser(const AnswerOptions& options);
  StreamingAnswerParser(ToolCallFormat format, bool tools_given, bool thinking);
  StreamingAnswerParser(StreamingAnswerParser&&) noexcept;
  StreamingAnswerParser& operator=(StreamingAnswerParser&&) noexcept;
  ~StreamingAnswerParser();

  // The next piece of the output; returns what can be sent now.
  AnswerDelta push(std::string_view text);
  // End of output: flushes what was held back.
  AnswerDelta finish();
  // Everything decided so far; after finish(), what parse_answer gives.
  const ParsedAnswer& answer() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m40::chat

#include "chat/tool_call_parser.h"

#include <nlohmann/json.hpp>

#include <array>
#include <random>
#include <set>
#include <utility>

namespace m40::chat {

namespace {

using Json = nlohmann::ordered_json;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

size_t count_ws(std::string_view s, size_t from = 0) {
  size_t i = from;
  while (i < s.size() && is_ws(s[i])) ++i;
  return i - from;
}

size_t trimmed_length(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_ws(s[n - 1])) --n;
  return n;
}

// Compact JSON; text that is not valid UTF-8 gets U+FFFD rather than an exception.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

enum class Match { Full, Partial, None };

// Whether `s` starts with `literal` (Partial: s is a proper prefix of it).
Match match_at(std::string_view s, std::string_view literal) {
  if (s.size() >= literal.size()) return s.substr(0, literal.size()) == literal ? Match::Full : Match::None;
  return literal.substr(0, s.size()) == s ? Match::Partial : Match::None;
}

// ---------------------------------------------------------------------------
// One JSON value, validated byte by byte.

class JsonScanner {
 public:
  enum class Step {
    Continue,    // the byte belongs to the value, which goes on
    Done,        // the byte completed the value
    DoneBefore,  // the value (a number) had ended before this byte, which is not part of it
    Error,       // the byte cannot continue the value
  };

  void reset() {
    state_ = S::Value;
    stack_.clear();
  }

  bool in_string() const { return state_ == S::String || state_ == S::Escape || state_ == S::Unicode; }

  Step feed(char c) {
    switch (state_) {
      case S::Value: return start_value(c);
      case S::ObjKeyOrEnd:
        if (is_ws(c)) return Step::Continue;
        if (c == '"') return begin_string(true);
        if (c == '}') return close('{');
        return Step::Error;
      case S::ObjKey:
        if (is_ws(c)) return Step::Continue;
        if (c == '"') return begin_string(true);
        return Step::Error;
      case S::Colon:
        if (is_ws(c)) return Step::Continue;
        if (c == ':') {
          state_ = S::Value;
          return Step::Continue;
        }
        return Step::Error;
      case S::ObjCommaOrEnd:
        if (is_ws(c)) return Step::Continue;
        if (c == ',') {
          state_ = S::ObjKey;
          return Step::Continue;
        }
        if (c == '}') return close('{');
        return Step::Error;
      case S::ArrValueOrEnd:
        if (is_ws(c)) return Step::Continue;
        if (c == ']') return close('[');
        return start_value(c);
      case S::ArrCommaOrEnd:
        if (is_ws(c)) return Step::Continue;
        if (c == ',') {
          state_ = S::Value;
          return Step::Continue;
        }
        if (c == ']') return close('[');
        return Step::Error;
      case S::String:
        if (c == '"') {
          if (string_is_key_) {
            state_ = S::Colon;
            return Step::Continue;
          }
          return after_value();
        }
        if (c == '\\') {
          state_ = S::Escape;
          return Step::Continue;
        }
        if (static_cast<unsigned char>(c) < 0x20) return Step::Error;
        return Step::Continue;
      case S::Escape:
        if (c == 'u') {
          state_ = S::Unicode;
          unicode_left_ = 4;
          return Step::Continue;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
          state_ = S::String;
          return Step::Continue;
        }
        return Step::Error;
      case S::Unicode:
        if (!is_hex(c)) return Step::Error;
        if (--unicode_left_ == 0) state_ = S::String;
        return Step::Continue;
      case S::NumMinus:
        if (c == '0') return to(S::NumZero);
        if (is_digit(c)) return to(S::NumInt);
        return Step::Error;
      case S::NumZero:
        if (c == '.') return to(S::NumDot);
        if (c == 'e' || c == 'E') return to(S::NumE);
        return end_number(c);
      case S::NumInt:
        if (is_digit(c)) return Step::Continue;
        if (c == '.') return to(S::NumDot);
        if (c == 'e' || c == 'E') return to(S::NumE);
        return end_number(c);
      case S::NumDot: return is_digit(c) ? to(S::NumFrac) : Step::Error;
      case S::NumFrac:
        if (is_digit(c)) return Step::Continue;
        if (c == 'e' || c == 'E') return to(S::NumE);
        return end_number(c);
      case S::NumE:
        if (c == '+' || c == '-') return to(S::NumESign);
        return is_digit(c) ? to(S::NumExp) : Step::Error;
      case S::NumESign: return is_digit(c) ? to(S::NumExp) : Step::Error;
      case S::NumExp:
        if (is_digit(c)) return Step::Continue;
        return end_number(c);
      case S::Literal:
        if (c != literal_[literal_pos_]) return Step::Error;
        if (++literal_pos_ == literal_.size()) return after_value();
        return Step::Continue;
      case S::Done: return Step::Error;
    }
    return Step::Error;
  }

 private:
  enum class S : uint8_t {
    Value, ObjKeyOrEnd, ObjKey, Colon, ObjCommaOrEnd, ArrValueOrEnd, ArrCommaOrEnd,
    String, Escape, Unicode,
    NumMinus, NumZero, NumInt, NumDot, NumFrac, NumE, NumESign, NumExp,
    Literal, Done,
  };
  static constexpr size_t kMaxDepth = 256;

  Step to(S s) {
    state_ = s;
    return Step::Continue;
  }

  Step start_value(char c) {
    switch (c) {
      case ' ': case '\t': case '\n': case '\r': return Step::Continue;
      case '{':
      case '[':
        if (stack_.size() >= kMaxDepth) return Step::Error;
        stack_.push_back(c);
        return to(c == '{' ? S::ObjKeyOrEnd : S::ArrValueOrEnd);
      case '"': return begin_string(false);
      case '-': return to(S::NumMinus);
      case '0': return to(S::NumZero);
      case 't': return begin_literal("true");
      case 'f': return begin_literal("false");
      case 'n': return begin_literal("null");
      default: return is_digit(c) ? to(S::NumInt) : Step::Error;
    }
  }

  Step begin_string(bool key) {
    string_is_key_ = key;
    return to(S::String);
  }

  Step begin_literal(std::string_view literal) {
    literal_ = literal;
    literal_pos_ = 1;
    return to(S::Literal);
  }

  Step close(char open) {
    if (stack_.empty() || stack_.back() != open) return Step::Error;
    stack_.pop_back();
    return after_value();
  }

  Step after_value() {
    if (stack_.empty()) {
      state_ = S::Done;
      return Step::Done;
    }
    return to(stack_.back() == '{' ? S::ObjCommaOrEnd : S::ArrCommaOrEnd);
  }

  Step end_number(char c) {
    if (stack_.empty()) {
      state_ = S::Done;
      return Step::DoneBefore;
    }
    after_value();
    return feed(c);
  }

  S state_ = S::Value;
  std::vector<char> stack_;
  bool string_is_key_ = false;
  int unicode_left_ = 0;
  std::string_view literal_;
  size_t literal_pos_ = 0;
};

// ---------------------------------------------------------------------------
// One call object {"name": ..., "arguments": {...}, ...}, read byte by byte
// from its '{'. "parameters" is taken for "arguments" (Llama 3); other keys
// ("id", "type") are checked as JSON and skipped.

class CallObjectReader {
 public:
  enum class Feed { Continue, Complete, Error };

  bool has_name() const { return name_done_; }
  const std::string& name() const { return name_; }
  // The arguments are an object whose bytes are arriving (args() grows).
  bool args_streaming() const { return args_kind_ == ArgsKind::Object; }
  bool has_args() const { return args_done_; }
  const std::string& args() const { return args_; }

  Feed feed(char c) {
    switch (state_) {
      case S::Open:
        if (is_ws(c)) return Feed::Continue;
        if (c != '{') return Feed::Error;
        state_ = S::KeyOrEnd;
        return Feed::Continue;
      case S::KeyOrEnd:
        if (is_ws(c)) return Feed::Continue;
        if (c == '}') return complete();
        return c == '"' ? begin_key() : Feed::Error;
      case S::KeyStart:
        if (is_ws(c)) return Feed::Continue;
        return c == '"' ? begin_key() : Feed::Error;
      case S::Key: {
        raw_ += c;
        const auto step = scanner_.feed(c);
        if (step == JsonScanner::Step::Error) return Feed::Error;
        if (step == JsonScanner::Step::Done) {
          const auto key = Json::parse(raw_, nullptr, false);  // discarded if not valid UTF-8
          if (!key.is_string()) return Feed::Error;
          const auto& k = key.get_ref<const std::string&>();
          field_ = k == "name" ? Field::Name : k == "arguments" || k == "parameters" ? Field::Args : Field::Other;
          state_ = S::Colon;
        }
        return Feed::Continue;
      }
      case S::Colon:
        if (is_ws(c)) return Feed::Continue;
        if (c != ':') return Feed::Error;
        state_ = S::ValueStart;
        return Feed::Continue;
      case S::ValueStart:
        if (is_ws(c)) return Feed::Continue;
        if (!begin_value(c)) return Feed::Error;
        state_ = S::Value;
        return feed(c);
      case S::Value: {
        const bool in_string = scanner_.in_string();
        const auto step = scanner_.feed(c);
        if (step == JsonScanner::Step::Error) return Feed::Error;
        if (step == JsonScanner::Step::DoneBefore) {
          if (!end_value()) return Feed::Error;
          state_ = S::CommaOrEnd;
          return feed(c);
        }
        capture(c, in_string);
        if (step == JsonScanner::Step::Done) {
          if (!end_value()) return Feed::Error;
          state_ = S::CommaOrEnd;
        }
        return Feed::Continue;
      }
      case S::CommaOrEnd:
        if (is_ws(c)) return Feed::Continue;
        if (c == ',') {
          state_ = S::KeyStart;
          return Feed::Continue;
        }
        return c == '}' ? complete() : Feed::Error;
      case S::Done: return Feed::Error;
    }
    return Feed::Error;
  }

 private:
  enum class S : uint8_t { Open, KeyOrEnd, KeyStart, Key, Colon, ValueStart, Value, CommaOrEnd, Done };
  enum class Field : uint8_t { Name, Args, Other };
  enum class ArgsKind : uint8_t { None, Object, String, Null };

  Feed begin_key() {
    scanner_.reset();
    scanner_.feed('"');
    raw_ = "\"";
    state_ = S::Key;
    return Feed::Continue;
  }

  Feed complete() {
    state_ = S::Done;
    return Feed::Complete;
  }

  bool begin_value(char c) {
    scanner_.reset();
    raw_.clear();
    if (field_ == Field::Name) return !name_done_ && c == '"';
    if (field_ == Field::Args) {
      if (args_kind_ != ArgsKind::None) return false;
      args_kind_ = c == '{' ? ArgsKind::Object : c == '"' ? ArgsKind::String : c == 'n' ? ArgsKind::Null : ArgsKind::None;
      return args_kind_ != ArgsKind::None;
    }
    return true;
  }

  void capture(char c, bool in_string) {
    if (field_ == Field::Name) {
      raw_ += c;
    } else if (field_ == Field::Args) {
      if (args_kind_ == ArgsKind::Object) {
        if (in_string || !is_ws(c)) args_ += c;
      } else {
        raw_ += c;
      }
    }
  }

  bool end_value() {
    try {
      if (field_ == Field::Name) {
        name_ = Json::parse(raw_).get<std::string>();
        name_done_ = !name_.empty();
        return name_done_;
      }
      if (field_ == Field::Args) {
        if (args_kind_ == ArgsKind::String) {
          const auto inner = Json::parse(Json::parse(raw_).get<std::string>());
          if (!inner.is_object()) return false;
          args_ = dump(inner);
        } else if (args_kind_ == ArgsKind::Null) {
          if (raw_ != "null") return false;
          args_ = "{}";
        }
        args_done_ = true;
      }
      return true;
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  }

  S state_ = S::Open;
  JsonScanner scanner_;
  Field field_ = Field::Other;
  std::string raw_;  // the key, or the name or string arguments being read
  std::string name_;
  bool name_done_ = false;
  ArgsKind args_kind_ = ArgsKind::None;
  bool args_done_ = false;
  std::string args_;
};

// `name.call(key="value", n=1)` after Llama 3's <|python_tag|> (its builtin
// tools). Incomplete while the closing parenthesis has not come.
struct BuiltinCall {
  enum class Status { Ok, Incomplete, Invalid } status = Status::Invalid;
  std::string name;
  std::string arguments;
  size_t length = 0;
};

BuiltinCall parse_builtin_call(std::string_view s) {
  BuiltinCall r;
  size_t i = 0;
  const auto at_end = [&] {
    r.status = BuiltinCall::Status::Incomplete;
    return r;
  };
  const auto identifier = [&](std::string& out) {
    const size_t start = i;
    while (i < s.size() && (is_alnum(s[i]) || s[i] == '_')) ++i;
    if (i == start || is_digit(s[start])) return false;
    out.assign(s.substr(start, i - start));
    return true;
  };
  if (!identifier(r.name)) return i == s.size() ? at_end() : r;
  if (i == s.size()) return at_end();
  switch (match_at(s.substr(i), ".call(")) {
    case Match::Partial: return at_end();
    case Match::None: return r;
    case Match::Full: i += 6; break;
  }
  Json args = Json::object();
  for (bool first = true;; first = false) {
    i += count_ws(s, i);
    if (i == s.size()) return at_end();
    if (s[i] == ')') break;
    if (!first) {
      if (s[i] != ',') return r;
      ++i;
      i += count_ws(s, i);
      if (i == s.size()) return at_end();
    }
    std::string key;
    if (!identifier(key)) return i == s.size() ? at_end() : r;
    i += count_ws(s, i);
    if (i == s.size()) return at_end();
    if (s[i] != '=') return r;
    ++i;
    i += count_ws(s, i);
    if (i == s.size()) return at_end();
    if (s[i] == '"' || s[i] == '\'') {
      const char quote = s[i++];
      std::string value;
      for (;; ++i) {
        if (i >= s.size()) return at_end();
        char c = s[i];
        if (c == quote) break;
        if (c == '\\') {
          if (++i == s.size()) return at_end();
          c = s[i];
          c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        }
        value += c;
      }
      ++i;
      args[key] = value;
    } else {
      const size_t start = i;
      while (i < s.size() && s[i] != ',' && s[i] != ')' && !is_ws(s[i])) ++i;
      if (i == s.size()) return at_end();
      const std::string word(s.substr(start, i - start));
      if (word == "True" || word == "False") {
        args[key] = word == "True";
      } else if (word == "None") {
        args[key] = nullptr;
      } else {
        const auto number = Json::parse(word, nullptr, false);
        if (number.is_discarded() || !number.is_number()) return r;
        args[key] = number;
      }
    }
  }
  r.arguments = dump(args);
  r.length = i + 1;
  r.status = BuiltinCall::Status::Ok;
  return r;
}

// Call markers of each family (only looked for when tools are given).
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kToolCallToken = "<|tool_call|>";
constexpr std::string_view kPhi4Close = "<|/tool_call|>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
// What DeepSeek R1 distills are known to write for <｜tool▁calls▁begin｜> at times.
constexpr std::array<std::string_view, 4> kDsCallsBeginVariants = {
    "<｜tool_calls_begin｜>", "<｜tool calls begin｜>", "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>"};
// Granite's thinking mode wraps the answer in <response>...</response>.
constexpr std::string_view kGraniteResponseOpen = "<response>";
constexpr std::string_view kGraniteResponseClose = "</response>";

// Longest a lookahead (a name, a header) may grow before it is taken for text.
constexpr size_t kMaxLookahead = 256;

}  // namespace

// ---------------------------------------------------------------------------

struct StreamingAnswerParser::Impl {
  enum class State : uint8_t {
    ThinkOpen,       // may start with the thinking open tag
    Reasoning,       // inside the reasoning section
    Content,         // text, looking for call markers
    LeadingJson,     // Llama3 / Generic: the answer starts with '{'
    ObjectStart,     // whitespace, then a call object
    CallObject,      // inside a call object
    ArrayOpen,       // '[' of calls, or one call object
    ArrayItem,       // after '[' or ','
    ArrayNext,       // after a call in an array: ',' or ']'
    HermesClose,     // after the object: </tool_call>
    ToolCallClose,   // Granite / Phi-4: <|/tool_call|>
    Llama3Next,      // after a Llama 3 call: ';' or another object
    PythonTag,       // after <|python_tag|>
    RawPython,       // code after <|python_tag|>, to the end
    MistralBody,     // after [TOOL_CALLS]
    MistralName,     // name[ARGS] or name[CALL_ID]id[ARGS]
    ArgsOpen,        // whitespace, then the arguments object
    ArgsObject,      // inside an arguments object (name known)
    DsSection,       // inside <｜tool▁calls▁begin｜>
    DsHeader,        // after <｜tool▁call▁begin｜>: function<｜tool▁sep｜>NAME\n
    DsArgsOpen,      // ```json, then the arguments object
    DsArgsClose,     // ```, <｜tool▁call▁end｜>
    GenericClose,    // the '}' of {"tool_call(s)": ...} or {"response": ...}
    ResponseString,  // the string of {"response": "..."}
    EndCalls,        // back to content after calls
  };

  struct Marker {
    std::string_view text;
    State next;
    bool drop_only;  // removed from the content, not a call (Granite's <response>)
  };

  explicit Impl(const AnswerOptions& o) : options(o), rng(o.id_seed != 0 ? o.id_seed : std::random_device{}()) {
    if (options.thinking_open.empty() || options.thinking_close.empty()) options.thinking = false;
    state = !options.thinking ? State::Content : options.starts_in_thinking ? State::Reasoning : State::ThinkOpen;
    const bool tools = options.tools_given;
    switch (options.tool_format) {
      case ToolCallFormat::Hermes:
        if (tools) markers.push_back({kHermesOpen, State::ObjectStart, false});
        break;
      case ToolCallFormat::Llama3:
        if (tools) markers.push_back({kPythonTag, State::PythonTag, false});
        break;
      case ToolCallFormat::MistralNemo:
      case ToolCallFormat::Mistral:
        if (tools) markers.push_back({kMistralCalls, State::MistralBody, false});
        break;
      case ToolCallFormat::DeepSeekV3:
        if (tools) {
          markers.push_back({kDsCallsBegin, State::DsSection, false});
          for (const auto variant : kDsCallsBeginVariants) markers.push_back({variant, State::DsSection, false});
        }
        break;
      case ToolCallFormat::Granite:
      case ToolCallFormat::Phi4:
        if (tools) markers.push_back({kToolCallToken, State::ArrayOpen, false});
        break;
      case ToolCallFormat::None:
      case ToolCallFormat::Generic: break;
    }
    call_markers = !markers.empty();
    if (options.tool_format == ToolCallFormat::Granite && options.thinking) {
      markers.push_back({kGraniteResponseOpen, State::Content, true});
      markers.push_back({kGraniteResponseClose, State::Content, true});
    }
    leading_json = tools && (options.tool_format == ToolCallFormat::Llama3 ||
                             options.tool_format == ToolCallFormat::Generic);
  }

  // ---- input ----

  AnswerDelta run(std::string_view text) {
    if (pos > 0) {
      buf.erase(0, pos);
      pos = 0;
    }
    buf.append(text);
    while (step()) {
    }
    return std::exchange(out, AnswerDelta{});
  }

  std::string_view view() const { return std::string_view(buf).substr(pos); }
  void skip(size_t n) { pos += n; }
  void take_raw(size_t n) {
    call_raw.append(buf, pos, n);
    pos += n;
  }
  // Consumes leading whitespace into the call's raw text; true if something else follows.
  bool skip_raw_ws() {
    take_raw(count_ws(view()));
    return !view().empty();
  }

  // ---- output ----

  void emit_content(std::string_view s) {
    if (s.empty()) return;
    out.content += s;
    result.content += s;
    at_answer_start = false;
  }
  void emit_reasoning(std::string_view s) {
    if (s.empty()) return;
    out.reasoning += s;
    result.reasoning += s;
    reasoning_seen = true;
  }

  std::string new_id() {
    static constexpr std::string_view kAlnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    const bool nemo = options.tool_format == ToolCallFormat::MistralNemo;
    for (;;) {
      std::string id = nemo ? "" : "call_";
      for (int i = 0; i < (nemo ? 9 : 24); ++i) id += kAlnum[rng() % kAlnum.size()];
      if (ids.insert(id).second) return id;
    }
  }

  void commit(const std::string& name, const std::string& args) {
    committed = true;
    call_index = next_index++;
    call_id = new_id();
    call_name = name;
    out.calls.push_back({call_index, call_id, call_name, args});
    args_sent = args.size();
  }

  void send_args(const std::string& args) {
    if (args.size() <= args_sent) return;
    std::string piece = args.substr(args_sent);
    args_sent = args.size();
    if (!out.calls.empty() && out.calls.back().index == call_index) {
      out.calls.back().arguments += piece;
    } else {
      out.calls.push_back({call_index, "", "", std::move(piece)});
    }
  }

  void complete_call(const std::string& name, const std::string& args) {
    if (!committed) {
      commit(name, args);
    } else {
      send_args(args);
    }
    result.tool_calls.push_back({call_id, call_name, args});
    committed = false;
    call_raw.clear();
    ++calls_in_sequence;
    at_answer_start = false;
  }

  // What looked like a call is not one: its text, from the last safe point,
  // is content. The byte that broke it is still unread and is read as content.
  bool break_call() {
    const std::string raw = std::exchange(call_raw, {});
    committed = false;
    state = State::Content;
    skip_ws = false;
    at_answer_start = false;
    emit_content(raw);
    return true;
  }

  // Calls are over; what follows (after whitespace) is content.
  bool end_calls() {
    call_raw.clear();
    state = State::Content;
    skip_ws = true;
    at_answer_start = false;
    return true;
  }

  // More text is needed to decide; at the end of output, decide now.
  bool wait(bool after_complete_call) {
    if (!final_) return false;
    return after_complete_call ? end_calls() : break_call();
  }

  void enter_calls(State next) {
    state = next;
    calls_in_sequence = 0;
    committed = false;
    object_requires_args = false;
    const auto format = options.tool_format;
    after_object = format == ToolCallFormat::Hermes ? State::HermesClose : State::EndCalls;
    after_array = format == ToolCallFormat::Granite || format == ToolCallFormat::Phi4 ? State::ToolCallClose
                                                                                     : State::EndCalls;
  }

  void start_object(State after, bool require_args) {
    reader = CallObjectReader{};
    after_object = after;
    object_requires_args = require_args;
    state = State::CallObject;
  }

  // ---- the states ----

  bool step() {
    switch (state) {
      case State::ThinkOpen: return think_open();
      case State::Reasoning: return reasoning();
      case State::Content: return content();
      case State::LeadingJson: return leading_json_start();
      case State::ObjectStart: return object_start();
      case State::CallObject: return call_object();
      case State::ArrayOpen: return array_open();
      case State::ArrayItem: return array_item();
      case State::ArrayNext: return array_next();
      case State::HermesClose: return optional_close(kHermesClose);
      case State::ToolCallClose: return optional_close(kPhi4Close);
      case State::Llama3Next: return llama3_next();
      case State::PythonTag: return python_tag();
      case State::RawPython: return raw_python();
      case State::MistralBody: return mistral_body();
      case State::MistralName: return mistral_name();
      case State::ArgsOpen: return args_open();
      case State::ArgsObject: return args_object();
      case State::DsSection: return ds_section();
      case State::DsHeader: return ds_header();
      case State::DsArgsOpen: return ds_args_open();
      case State::DsArgsClose: return ds_args_close();
      case State::GenericClose: return generic_close();
      case State::ResponseString: return response_string();
      case State::EndCalls: return end_calls();
    }
    return false;
  }

  bool think_open() {
    const auto v = view();
    const size_t ws = count_ws(v);
    switch (match_at(v.substr(ws), options.thinking_open)) {
      case Match::Full:
        skip(ws + options.thinking_open.size());
        state = State::Reasoning;
        return true;
      case Match::Partial:
        if (!final_) return false;
        [[fallthrough]];
      case Match::None: state = State::Content; return true;
    }
    return false;
  }

  bool reasoning() {
    if (!reasoning_seen) {
      skip(count_ws(view()));
      if (view().empty()) return false;
    }
    const auto v = view();
    const auto& close = options.thinking_close;
    if (const size_t p = v.find(close); p != std::string_view::npos) {
      emit_reasoning(v.substr(0, trimmed_length(v.substr(0, p))));
      skip(p + close.size());
      state = State::Content;
      skip_ws = true;
      at_answer_start = true;
      return true;
    }
    size_t keep = 0;
    if (!final_) {
      for (size_t n = std::min(v.size(), close.size() - 1); n > 0; --n) {
        if (v.substr(v.size() - n) == std::string_view(close).substr(0, n)) {
          keep = n;
          break;
        }
      }
    }
    const size_t n = trimmed_length(v.substr(0, v.size() - keep));
    emit_reasoning(v.substr(0, n));
    skip(final_ ? v.size() : n);
    return false;
  }

  bool content() {
    if (skip_ws) {
      skip(count_ws(view()));
      if (view().empty()) return false;
      skip_ws = false;
    }
    auto v = view();
    if (v.empty()) return false;
    if (at_answer_start && leading_json) {
      const size_t ws = count_ws(v);
      if (ws == v.size() && !final_) return false;
      if (ws < v.size() && v[ws] == '{') {
        state = State::LeadingJson;
        return true;
      }
    }
    at_answer_start = false;

    size_t best = std::string_view::npos;
    const Marker* marker = nullptr;
    for (const auto& m : markers) {
      const size_t p = v.find(m.text);
      if (p < best || (p == best && p != std::string_view::npos && m.text.size() > marker->text.size())) {
        best = p;
        marker = &m;
      }
    }
    if (marker != nullptr) {
      const auto text = v.substr(0, best);
      if (marker->drop_only) {
        emit_content(text);
        skip(best + marker->text.size());
        return true;
      }
      const size_t body = trimmed_length(text);
      emit_content(text.substr(0, body));
      call_raw.assign(text.substr(body));
      call_raw += marker->text;
      skip(best + marker->text.size());
      enter_calls(marker->next);
      return true;
    }

    size_t emit = v.size();
    if (!final_) {
      size_t keep = 0;
      for (const auto& m : markers) {
        for (size_t n = std::min(v.size(), m.text.size() - 1); n > keep; --n) {
          if (v.substr(v.size() - n) == m.text.substr(0, n)) {
            keep = n;
            break;
          }
        }
      }
      emit -= keep;
      // Whitespace just before a call marker is dropped, so it waits to see what follows.
      if (call_markers) emit = trimmed_length(v.substr(0, emit));
    }
    emit_content(v.substr(0, emit));
    skip(emit);
    return false;
  }

  bool leading_json_start() {
    const auto all = view();
    const size_t open = count_ws(all);  // all[open] == '{'
    // The first key must come within a fixed window, so that the text decides, not how it was split.
    const auto v = all.substr(0, open + kMaxLookahead);
    const bool capped = all.size() >= open + kMaxLookahead;
    size_t i = open + 1 + count_ws(v, open + 1);
    const auto not_a_call = [&] {
      at_answer_start = false;
      state = State::Content;
      return true;
    };
    const auto need_more = [&] { return final_ || capped ? not_a_call() : false; };
    if (i >= v.size()) return need_more();
    if (v[i] != '"') return not_a_call();
    size_t end = i + 1;
    for (; end < v.size() && v[end] != '"'; ++end) {
      if (v[end] == '\\') ++end;
    }
    if (end >= v.size()) return need_more();
    std::string key;
    try {
      key = Json::parse(v.substr(i, end + 1 - i)).get<std::string>();
    } catch (const nlohmann::json::exception&) {
      return not_a_call();
    }
    const bool llama3 = options.tool_format == ToolCallFormat::Llama3;
    if (key == "name" || (llama3 && key == "type") || (!llama3 && (key == "arguments" || key == "parameters"))) {
      enter_calls(State::CallObject);
      take_raw(open);
      start_object(llama3 ? State::Llama3Next : State::EndCalls, true);
      return true;
    }
    if (llama3 || (key != "tool_calls" && key != "tool_call" && key != "response")) return not_a_call();
    // {"tool_calls": [...]}, {"tool_call": {...}} or {"response": "..."}
    i = end + 1 + count_ws(v, end + 1);
    if (i >= v.size()) return need_more();
    if (v[i] != ':') return not_a_call();
    i += 1 + count_ws(v, i + 1);
    if (i >= v.size()) return need_more();
    enter_calls(State::Content);
    if (key == "response") {
      if (v[i] != '"') return not_a_call();
      take_raw(i + 1);
      escape.clear();
      state = State::ResponseString;
    } else if (key == "tool_calls") {
      take_raw(i);
      after_array = State::GenericClose;
      object_requires_args = false;
      state = State::ArrayOpen;
    } else {
      take_raw(i);
      after_object = State::GenericClose;
      state = State::ObjectStart;
    }
    return true;
  }

  bool object_start() {
    if (!skip_raw_ws()) return wait(calls_in_sequence > 0);
    if (view()[0] != '{') return calls_in_sequence > 0 ? end_calls() : break_call();
    start_object(after_object, object_requires_args);
    return true;
  }

  bool call_object() {
    const auto v = view();
    for (size_t i = 0; i < v.size(); ++i) {
      const auto fed = reader.feed(v[i]);
      if (fed == CallObjectReader::Feed::Error) {
        take_raw(i);
        return break_call();
      }
      if (committed) {
        send_args(reader.args());
      } else if (reader.has_name() && reader.args_streaming()) {
        commit(reader.name(), reader.args());
      }
      if (fed == CallObjectReader::Feed::Complete) {
        take_raw(i + 1);
        if (!reader.has_name() || (!reader.has_args() && object_requires_args)) return break_call();
        const std::string args = reader.has_args() ? reader.args() : "{}";
        if (!Json::accept(args)) return break_call();
        complete_call(reader.name(), args);
        state = after_object;
        return true;
      }
    }
    take_raw(v.size());
    return wait(false);
  }

  bool array_open() {
    if (!skip_raw_ws()) return wait(false);
    const char c = view()[0];
    if (c == '[') {
      take_raw(1);
      state = State::ArrayItem;
      return true;
    }
    if (c == '{') {
      start_object(after_array, object_requires_args);
      return true;
    }
    return break_call();
  }

  bool array_item() {
    if (!skip_raw_ws()) return wait(calls_in_sequence > 0);
    const char c = view()[0];
    if (c == '{') {
      start_object(State::ArrayNext, object_requires_args);
      return true;
    }
    if (c == ']') {  // the end, after a trailing comma or of an empty list (shown as nothing)
      take_raw(1);
      call_raw.clear();
      state = after_array;
      return true;
    }
    return calls_in_sequence > 0 ? end_calls() : break_call();
  }

  bool array_next() {
    if (!skip_raw_ws()) return wait(true);
    const char c = view()[0];
    if (c == ',') {
      take_raw(1);
      state = State::ArrayItem;
      return true;
    }
    if (c == ']') {
      take_raw(1);
      state = after_array;
      return true;
    }
    return end_calls();
  }

  bool optional_close(std::string_view close) {
    if (!skip_raw_ws()) return wait(true);
    switch (match_at(view(), close)) {
      case Match::Full: skip(close.size()); return end_calls();
      case Match::Partial: return final_ ? end_calls() : false;
      case Match::None: return end_calls();
    }
    return false;
  }

  bool llama3_next() {
    if (!skip_raw_ws()) return wait(true);
    const char c = view()[0];
    if (c == ';') {
      take_raw(1);
      after_object = State::Llama3Next;
      object_requires_args = true;
      state = State::ObjectStart;
      return true;
    }
    if (c == '{') {
      start_object(State::Llama3Next, true);
      return true;
    }
    return end_calls();
  }

  bool python_tag() {
    if (!skip_raw_ws()) return wait(false);
    if (view()[0] == '{') {
      start_object(State::Llama3Next, true);
      return true;
    }
    const auto call = parse_builtin_call(view());
    switch (call.status) {
      case BuiltinCall::Status::Ok:
        take_raw(call.length);
        complete_call(call.name, call.arguments);
        return end_calls();
      case BuiltinCall::Status::Incomplete:
        if (!final_) return false;
        [[fallthrough]];
      case BuiltinCall::Status::Invalid: state = State::RawPython; return true;
    }
    return false;
  }

  // Code for the code interpreter: the rest of the output, run as `python`.
  bool raw_python() {
    if (!final_) return false;
    const auto v = view();
    const std::string code(v.substr(0, trimmed_length(v)));
    take_raw(v.size());
    if (code.empty()) return break_call();
    complete_call("python", dump(Json{{"code", code}}));
    return end_calls();
  }

  bool mistral_body() {
    if (!skip_raw_ws()) return wait(false);
    const char c = view()[0];
    if (c == '[' || c == '{') {
      after_array = State::EndCalls;
      object_requires_args = false;
      state = State::ArrayOpen;
      return true;
    }
    state = State::MistralName;
    return true;
  }

  bool mistral_name() {
    const auto v = view();
    size_t i = 0;
    while (i < v.size() && (is_alnum(v[i]) || v[i] == '_' || v[i] == '-' || v[i] == '.' || v[i] == ':')) ++i;
    if (i >= kMaxLookahead) return break_call();
    if (i == v.size()) return wait(false);
    if (i == 0) return break_call();
    const auto rest = v.substr(i);
    if (const auto args = match_at(rest, kMistralArgs); args != Match::None) {
      if (args == Match::Partial) return wait(false);
      direct_name.assign(v.substr(0, i));
      take_raw(i + kMistralArgs.size());
      after_args = State::EndCalls;
      state = State::ArgsOpen;
      return true;
    }
    switch (match_at(rest, kMistralCallId)) {
      case Match::Partial: return wait(false);
      case Match::None: return break_call();
      case Match::Full: break;
    }
    // name[CALL_ID]id[ARGS]: the model's id is not kept (ids are ours).
    size_t j = i + kMistralCallId.size();
    while (j < v.size() && is_alnum(v[j])) ++j;
    if (j >= kMaxLookahead) return break_call();
    switch (match_at(v.substr(j), kMistralArgs)) {
      case Match::Partial: return wait(false);
      case Match::None: return break_call();
      case Match::Full: break;
    }
    direct_name.assign(v.substr(0, i));
    take_raw(j + kMistralArgs.size());
    after_args = State::EndCalls;
    state = State::ArgsOpen;
    return true;
  }

  bool args_open() {
    if (!skip_raw_ws()) return wait(false);
    if (view()[0] != '{') return break_call();
    args_scanner.reset();
    direct_args.clear();
    state = State::ArgsObject;
    return true;
  }

  bool args_object() {
    const auto v = view();
    for (size_t i = 0; i < v.size(); ++i) {
      const char c = v[i];
      const bool in_string = args_scanner.in_string();
      const auto fed = args_scanner.feed(c);
      if (fed == JsonScanner::Step::Error || fed == JsonScanner::Step::DoneBefore) {
        take_raw(i);
        return break_call();
      }
      if (in_string || !is_ws(c)) direct_args += c;
      if (committed) {
        send_args(direct_args);
      } else {
        commit(direct_name, direct_args);
      }
      if (fed == JsonScanner::Step::Done) {
        take_raw(i + 1);
        complete_call(direct_name, direct_args);
        state = after_args;
        return true;
      }
    }
    take_raw(v.size());
    return wait(false);
  }

  bool ds_section() {
    if (!skip_raw_ws()) return wait(calls_in_sequence > 0);
    const auto v = view();
    for (const auto marker : {kDsCallsEnd, kDsCallBegin}) {
      switch (match_at(v, marker)) {
        case Match::Full:
          take_raw(marker.size());
          if (marker == kDsCallsEnd) return end_calls();
          state = State::DsHeader;
          return true;
        case Match::Partial: return wait(calls_in_sequence > 0);
        case Match::None: break;
      }
    }
    if (calls_in_sequence == 0) {  // <｜tool▁call▁begin｜> left out before the first call
      const auto m = match_at(v, "function");
      if (m == Match::Partial) return wait(false);
      if (m == Match::Full) {
        state = State::DsHeader;
        return true;
      }
    }
    return calls_in_sequence > 0 ? end_calls() : break_call();
  }

  // function<｜tool▁sep｜>NAME\n (V3, R1) or NAME<｜tool▁sep｜> (V3.1).
  bool ds_header() {
    const auto v = view();
    // Looked for in a fixed window, so that the text decides, not how it was split.
    const auto window = v.substr(0, kMaxLookahead);
    const bool capped = v.size() >= kMaxLookahead;
    const size_t sep = window.find(kDsSep);
    if (sep == std::string_view::npos) return capped ? break_call() : wait(false);
    const auto type = v.substr(0, sep);
    size_t end = sep + kDsSep.size();
    std::string_view name = type;
    if (type == "function") {
      const size_t newline = window.find('\n', end);
      if (newline == std::string_view::npos) return capped ? break_call() : wait(false);
      name = v.substr(end, newline - end);
      end = newline + 1;
      while (!name.empty() && is_ws(name.back())) name.remove_suffix(1);
    }
    if (name.empty() || name.find_first_of(" \t\n\r<>{}") != std::string_view::npos) return break_call();
    direct_name.assign(name);
    take_raw(end);
    state = State::DsArgsOpen;
    return true;
  }

  bool ds_args_open() {
    if (!skip_raw_ws()) return wait(false);
    const auto v = view();
    for (const std::string_view fence : {"```json", "```"}) {
      const auto m = match_at(v, fence);
      if (m == Match::Partial) return wait(false);
      if (m == Match::Full) {
        take_raw(fence.size());
        break;
      }
    }
    after_args = State::DsArgsClose;
    state = State::ArgsOpen;
    return true;
  }

  bool ds_args_close() {
    if (!skip_raw_ws()) return wait(true);
    auto v = view();
    if (const auto m = match_at(v, "```"); m == Match::Partial) {
      return wait(true);
    } else if (m == Match::Full) {
      take_raw(3);
      if (!skip_raw_ws()) return wait(true);
      v = view();
    }
    switch (match_at(v, kDsCallEnd)) {
      case Match::Partial: return wait(true);
      case Match::Full: take_raw(kDsCallEnd.size()); break;
      case Match::None: break;
    }
    call_raw.clear();
    state = State::DsSection;
    return true;
  }

  bool generic_close() {
    if (!skip_raw_ws()) return wait(true);
    if (view()[0] == '}') take_raw(1);
    return end_calls();
  }

  // The JSON string of {"response": "..."}, decoded as it arrives. Text once
  // shown is a safe point: a break gives back only what was not shown.
  bool response_string() {
    const auto v = view();
    std::string text;
    for (size_t i = 0; i < v.size(); ++i) {
      const char c = v[i];
      if (!escape.empty()) {
        escape += c;
        if (escape.size() < 2 || (escape[1] == 'u' && escape.size() < 6)) continue;
        if (escape[1] == 'u' && escape.size() < 12 && (escape[2] == 'd' || escape[2] == 'D') &&
            std::string_view("89abAB").find(escape[3]) != std::string_view::npos) {
          continue;  // a high surrogate: its low one follows
        }
        try {
          text += Json::parse("\"" + escape + "\"").get<std::string>();
        } catch (const std::exception&) {
          return broken_response(text, i);
        }
        escape.clear();
      } else if (c == '\\') {
        escape = "\\";
      } else if (c == '"') {
        show_response(text);
        skip(i + 1);
        state = State::GenericClose;
        return true;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return broken_response(text, i);
      } else {
        text += c;
      }
    }
    show_response(text);
    skip(v.size());
    if (!final_) return false;
    call_raw += std::exchange(escape, {});
    return break_call();
  }

  void show_response(const std::string& text) {
    if (text.empty()) return;
    emit_content(text);
    call_raw.clear();
  }

  // `at` is the byte that broke the string: the last of `escape` if one was read.
  bool broken_response(const std::string& text, size_t at) {
    show_response(text);
    if (!escape.empty()) call_raw += escape.substr(0, escape.size() - 1);
    escape.clear();
    skip(at);
    return break_call();
  }

  AnswerOptions options;
  std::mt19937_64 rng;
  std::vector<Marker> markers;
  bool call_markers = false;  // markers include call markers (not just Granite's drop markers)
  bool leading_json = false;  // a call may be the whole answer as a JSON object

  std::string buf;  // received text; buf[pos:] is not read yet
  size_t pos = 0;
  bool final_ = false;
  State state = State::Content;
  bool skip_ws = false;          // drop whitespace before the next content
  bool at_answer_start = true;   // nothing of the answer (after reasoning) shown yet
  bool reasoning_seen = false;   // reasoning text shown (its leading whitespace is dropped)

  std::string call_raw;  // the text of the call being read, since the last safe point
  int calls_in_sequence = 0;
  State after_object = State::EndCalls;
  State after_array = State::EndCalls;
  State after_args = State::EndCalls;
  bool object_requires_args = false;
  CallObjectReader reader;
  JsonScanner args_scanner;
  std::string direct_name, direct_args;  // calls whose name is text before the arguments object
  std::string escape;                    // an escape sequence of the response string, being read

  bool committed = false;  // the current call's first delta is sent
  int call_index = -1;
  int next_index = 0;
  size_t args_sent = 0;
  std::string call_id, call_name;
  std::set<std::string> ids;

  ParsedAnswer result;
  AnswerDelta out;
};

StreamingAnswerParser::StreamingAnswerParser(const AnswerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}

StreamingAnswerParser::StreamingAnswerParser(ToolCallFormat format, bool tools_given, bool thinking)
    : StreamingAnswerParser(AnswerOptions{.tool_format = format, .tools_given = tools_given, .thinking = thinking}) {}

StreamingAnswerParser::StreamingAnswerParser(StreamingAnswerParser&&) noexcept = default;
StreamingAnswerParser& StreamingAnswerParser::operator=(StreamingAnswerParser&&) noexcept = default;
StreamingAnswerParser::~StreamingAnswerParser() = default;

AnswerDelta StreamingAnswerParser::push(std::string_view text) {
  if (impl_->final_) return {};
  return impl_->run(text);
}

AnswerDelta StreamingAnswerParser::finish() {
  if (impl_->final_) return {};
  impl_->final_ = true;
  return impl_->run({});
}

const ParsedAnswer& StreamingAnswerParser::answer() const { return impl_->result; }

AnswerOptions answer_options(const TemplateTraits& traits, bool tools_given, std::string_view rendered_prompt) {
  AnswerOptions o;
  o.tool_format = traits.tool_format;
  o.tools_given = tools_given;
  o.thinking = traits.has_thinking;
  o.starts_in_thinking = prompt_opens_thinking(traits, rendered_prompt);
  if (traits.has_thinking) {
    o.thinking_open = traits.thinking_open;
    o.thinking_close = traits.thinking_close;
  }
  return o;
}

ParsedAnswer parse_answer(const AnswerOptions& options, std::string_view output) {
  StreamingAnswerParser parser(options);
  parser.push(output);
  parser.finish();
  return parser.answer();
}

ParsedAnswer parse_answer(ToolCallFormat format, std::string_view output, bool tools_given, bool thinking) {
  return parse_answer(AnswerOptions{.tool_format = format, .tools_given = tools_given, .thinking = thinking},
                      output);
}

}  // namespace m40::chat

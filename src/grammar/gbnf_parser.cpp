// A recursive-descent reader of GBNF, the grammar syntax of llama.cpp
// (grammars/README.md there), written from its description and behaviour.
#include "grammar/gbnf_parser.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "grammar/grammar.h"

namespace m40::grammar::detail {

void CodepointSet::normalize() {
  if (normalized_) return;
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<Range> merged;
  for (const Range& r : ranges_) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  ranges_ = std::move(merged);
  normalized_ = true;
}

CodepointSet CodepointSet::complement() const {
  CodepointSet out;
  char32_t next = 0;
  for (const Range& r : ranges_) {
    if (r.first > next) out.ranges_.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= kMaxCodepoint) out.ranges_.push_back({next, kMaxCodepoint});
  return out;
}

bool CodepointSet::contains(char32_t c) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), c,
                             [](char32_t v, const Range& r) { return v < r.first; });
  return it != ranges_.begin() && std::prev(it)->second >= c;
}

namespace {

// Repetition counts beyond this are refused (each repeat copies its element).
constexpr uint32_t kMaxRepeatCount = 100000;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  GbnfAst parse() {
    skip_space(true);
    while (!at_end()) {
      parse_rule();
      skip_space(true);
    }
    if (defined_.empty()) fail(0, "the grammar has no rules (expected `name ::= ...`)");
    for (const Reference& ref : references_) {
      if (!defined_[ref.symbol]) {
        fail_at(ref.line, ref.column, "undefined rule '" + names_[ref.symbol] + "'; define it with `" +
                                          names_[ref.symbol] + " ::= ...`");
      }
    }
    for (uint32_t id = 0; id < names_.size(); ++id) {
      if (!defined_[id]) fail(0, "undefined rule '" + names_[id] + "'");
    }
    GbnfAst ast;
    ast.rules = std::move(rules_);
    return ast;
  }

 private:
  struct Reference {
    uint32_t symbol;
    uint32_t line, column;
  };

  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  std::pair<uint32_t, uint32_t> location(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    const size_t start = line_starts_[line - 1];
    uint32_t column = 1;
    for (size_t i = start; i < offset && i < text_.size(); ++i) {
      if ((static_cast<uint8_t>(text_[i]) & 0xC0) != 0x80) ++column;  // count characters, not bytes
    }
    return {static_cast<uint32_t>(line), column};
  }

  [[noreturn]] void fail_at(uint32_t line, uint32_t column, const std::string& what) const {
    throw GrammarError("GBNF line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + what);
  }
  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    auto [line, column] = location(offset);
    fail_at(line, column, what);
  }

  std::string describe_here() const {
    if (at_end()) return "the end of the text";
    const char c = peek();
    if (c == '\n' || c == '\r') return "the end of the line";
    std::string quoted(1, '\'');
    quoted += text_[pos_];
    quoted += '\'';
    return quoted;
  }

  // Spaces, tabs and comments; newlines too when newline_ok.
  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  uint32_t symbol(std::string_view name) {
    auto [it, inserted] = symbols_.emplace(std::string(name), static_cast<uint32_t>(names_.size()));
    if (inserted) {
      names_.emplace_back(name);
      defined_.push_back(false);
      rules_.emplace_back();
      rules_.back().name = std::string(name);
    }
    return it->second;
  }

  std::string_view parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail(pos_, "expected a rule name (letters, digits and '-'), found " + describe_here());
    return text_.substr(start, pos_ - start);
  }

  void parse_rule() {
    const size_t start = pos_;
    const std::string_view name = parse_name();
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") {
      fail(pos_, "expected '::=' after the rule name '" + std::string(name) + "', found " + describe_here());
    }
    pos_ += 3;
    skip_space(true);
    const uint32_t id = symbol(name);
    auto [line, column] = location(start);
    if (defined_[id]) {
      fail(start, "rule '" + std::string(name) + "' is defined twice (first at line " +
                      std::to_string(rules_[id].line) + ")");
    }
    defined_[id] = true;
    rules_[id].line = line;
    rules_[id].column = column;
    rules_[id].body = parse_alternates(false);
    if (!at_end() && peek() != '\n' && peek() != '\r') {
      fail(pos_, "expected the end of the line after rule '" + std::string(name) + "', found " + describe_here());
    }
  }

  // At top level, a rule continues on the next line when that line starts with '|'.
  bool continues_on_next_line() {
    size_t probe = pos_;
    while (probe < text_.size()) {
      const char c = text_[probe];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++probe;
      } else if (c == '#') {
        while (probe < text_.size() && text_[probe] != '\n') ++probe;
      } else {
        break;
      }
    }
    if (probe < text_.size() && text_[probe] == '|' && probe > pos_) {
      pos_ = probe;
      return true;
    }
    return false;
  }

  Expr parse_alternates(bool nested) {
    if (++depth_ > kMaxNesting) fail(pos_, "parentheses nested deeper than " + std::to_string(kMaxNesting));
    auto [line, column] = location(pos_);
    Expr alt;
    alt.kind = Expr::Kind::kAlternation;
    alt.line = line;
    alt.column = column;
    alt.children.push_back(parse_sequence(nested));
    while (peek() == '|' || (!nested && continues_on_next_line())) {
      ++pos_;
      skip_space(true);
      alt.children.push_back(parse_sequence(nested));
    }
    --depth_;
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  uint32_t parse_count() {
    const size_t start = pos_;
    uint64_t value = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      value = value * 10 + static_cast<uint64_t>(peek() - '0');
      if (value > kMaxRepeatCount) fail(start, "repetition count above " + std::to_string(kMaxRepeatCount));
      ++pos_;
    }
    if (pos_ == start) fail(pos_, "expected a number in '{...}', found " + describe_here());
    return static_cast<uint32_t>(value);
  }

  Expr parse_sequence(bool nested) {
    auto [line, column] = location(pos_);
    Expr seq;
    seq.kind = Expr::Kind::kSequence;
    seq.line = line;
    seq.column = column;
    while (!at_end()) {
      const char c = peek();
      const size_t start = pos_;
      if (c == '"') {
        seq.children.push_back(parse_literal());
      } else if (c == '[') {
        seq.children.push_back(parse_class());
      } else if (c == '.') {
        ++pos_;
        seq.children.push_back(chars_expr(CodepointSet::all(), start));
      } else if (is_name_char(c)) {
        const std::string_view name = parse_name();
        Expr ref;
        ref.kind = Expr::Kind::kRuleRef;
        std::tie(ref.line, ref.column) = location(start);
        ref.rule = symbol(name);
        references_.push_back({ref.rule, ref.line, ref.column});
        seq.children.push_back(std::move(ref));
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        Expr group = parse_alternates(true);
        if (peek() != ')') fail(pos_, "expected ')' to close the '(' at " + where(start) + ", found " + describe_here());
        ++pos_;
        seq.children.push_back(std::move(group));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (seq.children.empty()) fail(pos_, std::string("'") + c + "' must follow an element to repeat");
        uint32_t min = 0;
        uint32_t max = kUnbounded;
        ++pos_;
        if (c == '+') {
          min = 1;
        } else if (c == '?') {
          max = 1;
        } else if (c == '{') {
          skip_space(nested);
          if (peek() != ',') min = parse_count();
          skip_space(nested);
          if (peek() == '}') {
            max = min;
          } else if (peek() == ',') {
            ++pos_;
            skip_space(nested);
            if (peek() != '}') max = parse_count();
            skip_space(nested);
          } else {
            fail(pos_, "expected ',' or '}' in the repetition, found " + describe_here());
          }
          if (peek() != '}') fail(pos_, "expected '}' to close the repetition, found " + describe_here());
          ++pos_;
          if (max < min) fail(start, "repetition {" + std::to_string(min) + "," + std::to_string(max) + "} has max < min");
        }
        Expr repeat;
        repeat.kind = Expr::Kind::kRepeat;
        repeat.line = seq.children.back().line;
        repeat.column = seq.children.back().column;
        repeat.min = min;
        repeat.max = max;
        repeat.children.push_back(std::move(seq.children.back()));
        seq.children.back() = std::move(repeat);
      } else if (c == '<' || c == '!') {
        fail(pos_, "token references (<...>) are not supported; write the text as a \"literal\"");
      } else {
        break;  // '|', ')', the end of the line, or something the caller reports
      }
      skip_space(nested);
    }
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    return seq;
  }

  std::string where(size_t offset) const {
    auto [line, column] = location(offset);
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }

  Expr chars_expr(CodepointSet set, size_t offset) const {
    Expr e;
    e.kind = Expr::Kind::kChars;
    e.chars = std::move(set);
    std::tie(e.line, e.column) = location(offset);
    return e;
  }

  uint32_t parse_hex(size_t digits, size_t escape_start) {
    uint32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char h = peek();
      uint32_t d;
      if (h >= '0' && h <= '9') {
        d = static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        d = static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        d = static_cast<uint32_t>(h - 'A' + 10);
      } else {
        fail(escape_start, "expected " + std::to_string(digits) + " hex digits in the escape");
      }
      value = value * 16 + d;
      ++pos_;
    }
    if (value > kMaxCodepoint) fail(escape_start, "code point above U+10FFFF in the escape");
    return value;
  }

  // One character of a literal or class: an escape or one UTF-8 character.
  char32_t parse_char() {
    const size_t start = pos_;
    const auto c = static_cast<uint8_t>(peek());
    if (c == '\\') {
      ++pos_;
      if (at_end()) fail(start, "unterminated escape");
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '\\': return '\\';
        case '"': return '"';
        case '[': return '[';
        case ']': return ']';
        case '-': return '-';
        case '/': return '/';
        case '\'': return '\'';
        case '^': return '^';
        case 'x': return parse_hex(2, start);
        case 'u': return parse_hex(4, start);
        case 'U': return parse_hex(8, start);
        default:
          fail(start, "unknown escape '\\" + std::string(1, e) + "' (known: \\n \\t \\r \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)");
      }
    }
    // UTF-8, strictly.
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || pos_ + len > text_.size()) fail(start, "invalid UTF-8 in the grammar text");
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < len; ++i) {
      const auto b = static_cast<uint8_t>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) fail(start, "invalid UTF-8 in the grammar text");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr char32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      fail(start, "invalid UTF-8 in the grammar text");
    }
    pos_ += len;
    return cp;
  }

  Expr parse_literal() {
    const size_t start = pos_;
    ++pos_;  // "
    Expr seq;
    seq.kind = Expr::Kind::kSequence;
    std::tie(seq.line, seq.column) = location(start);
    while (true) {
      if (at_end() || peek() == '\n' || peek() == '\r') fail(start, "unterminated string literal (missing '\"')");
      if (peek() == '"') break;
      const size_t char_start = pos_;
      seq.children.push_back(chars_expr(CodepointSet::single(parse_char()), char_start));
    }
    ++pos_;
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    return seq;
  }

  Expr parse_class() {
    const size_t start = pos_;
    ++pos_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodepointSet set;
    while (true) {
      if (at_end() || peek() == '\n' || peek() == '\r') fail(start, "unterminated character class (missing ']')");
      if (peek() == ']') break;
      const size_t item_start = pos_;
      const char32_t lo = parse_char();
      char32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail(item_start, "character range with its end before its start");
      }
      set.add(lo, hi);
    }
    ++pos_;
    set.normalize();
    if (negated) set = set.complement();
    return chars_expr(std::move(set), start);
  }

  static constexpr int kMaxNesting = 256;

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::vector<size_t> line_starts_;
  std::map<std::string, uint32_t, std::less<>> symbols_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<RuleDef> rules_;
  std::vector<Reference> references_;
};

}  // namespace

GbnfAst parse_gbnf_text(std::string_view text) { return Parser(text).parse(); }

}  // namespace m40::grammar::detail

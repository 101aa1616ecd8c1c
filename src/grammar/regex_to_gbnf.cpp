#include "grammar/regex_to_gbnf.h"

#include <cctype>
#include <cstdio>
#include <vector>

#include "grammar/gbnf_ast.h"
#include "grammar/grammar.h"

namespace m40::grammar::detail {

namespace {

CodepointSet make_set(std::initializer_list<std::pair<char32_t, char32_t>> ranges) {
  CodepointSet s;
  for (auto [lo, hi] : ranges) s.add(lo, hi);
  s.normalize();
  return s;
}

const CodepointSet& digits() {
  static const CodepointSet s = make_set({{'0', '9'}});
  return s;
}
const CodepointSet& word_chars() {
  static const CodepointSet s = make_set({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
  return s;
}
const CodepointSet& space_chars() {
  static const CodepointSet s = make_set({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                          {0xFEFF, 0xFEFF}});
  return s;
}
const CodepointSet& line_terminators() {
  static const CodepointSet s = make_set({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
  return s;
}

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*X", digits, v);
  return buf;
}

// One code point inside a GBNF literal or class.
std::string gbnf_char(char32_t c) {
  if (c < 0x80) {
    const bool plain = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= 0x20 && c < 0x7F && c != '"' && c != '\\' && c != ']' && c != '[' && c != '-' && c != '^');
    if (plain) return std::string(1, static_cast<char>(c));
    return "\\x" + hex(c, 2);
  }
  if (c <= 0xFFFF) return "\\u" + hex(c, 4);
  return "\\U" + hex(c, 8);
}

// The JSON escape of a character that cannot appear raw in a JSON string,
// as a GBNF literal.
std::string json_escape_literal(char32_t c) {
  switch (c) {
    case '"': return R"("\\\"")";
    case '\\': return R"("\\\\")";
    case '\b': return R"("\\b")";
    case '\f': return R"("\\f")";
    case '\n': return R"("\\n")";
    case '\r': return R"("\\r")";
    case '\t': return R"("\\t")";
    default: {
      std::string h = hex(c, 4);
      for (char& ch : h) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return "\"\\\\u" + h + "\"";
    }
  }
}

bool raw_in_json(char32_t c) { return c >= 0x20 && c != '"' && c != '\\' && c != 0x7F; }

// A set of decoded characters as the GBNF for their JSON encodings.
std::string set_to_gbnf(const CodepointSet& set) {
  std::vector<std::string> parts;
  CodepointSet raw;
  for (auto [lo, hi] : set.ranges()) {
    for (char32_t c = lo; c <= hi && c < 0x80; ++c) {
      if (!raw_in_json(c)) parts.push_back(json_escape_literal(c));
    }
    // Raw part: split around the characters JSON escapes.
    char32_t start = lo;
    for (char32_t c = lo; c <= hi && c < 0x80; ++c) {
      if (!raw_in_json(c)) {
        if (c > start) raw.add(start, c - 1);
        start = c + 1;
      }
    }
    if (start <= hi) raw.add(start, hi);
  }
  raw.normalize();
  std::string cls;
  if (!raw.empty()) {
    cls = "[";
    for (auto [lo, hi] : raw.ranges()) {
      cls += gbnf_char(lo);
      if (hi != lo) {
        cls += '-';
        cls += gbnf_char(hi);
      }
    }
    cls += "]";
    parts.insert(parts.begin(), cls);
  }
  if (parts.empty()) throw GrammarError("pattern: a character class that matches no character");
  if (parts.size() == 1) return parts[0];
  std::string out(1, '(');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += " | ";
    out += parts[i];
  }
  out += ')';
  return out;
}

std::string group(const std::string& inner) {
  std::string out(1, '(');
  out += inner.empty() ? std::string("\"\"") : inner;
  out += ')';
  return out;
}

std::string repeat_suffix(uint32_t m, uint32_t n) {
  std::string out(1, '{');
  out += std::to_string(m);
  if (n != m) {
    out += ',';
    if (n != UINT32_MAX) out += std::to_string(n);
  }
  out += '}';
  return out;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : p_(p) {}

  std::string parse(const std::string& any_char) {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    size_t end = p_.size();
    if (end > pos_ && p_[end - 1] == '$' && !escaped_at(end - 1)) {
      anchored_end = true;
      end -= 1;
    }
    end_ = end;
    std::string body = alternation();
    if (pos_ < end_) fail("unbalanced ')'");
    std::string out = "\"\\\"\" ";
    if (!anchored_start) out += any_char + "* ";
    out += '(';
    out += body.empty() ? std::string("\"\"") : body;
    out += ')';
    if (!anchored_end) out += " " + any_char + "*";
    return out + " \"\\\"\"";
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError("JSON schema pattern '" + std::string(p_) + "': " + what);
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw GrammarError("JSON schema pattern '" + std::string(p_) + "': " + what +
                       " is not supported (supported: literals, classes, ., groups, |, ? * + {m,n}, ^ and $ at the ends)");
  }

  bool escaped_at(size_t i) const {
    size_t backslashes = 0;
    while (i > backslashes && p_[i - 1 - backslashes] == '\\') ++backslashes;
    return backslashes % 2 == 1;
  }

  bool at_end() const { return pos_ >= end_; }
  char peek() const { return pos_ < end_ ? p_[pos_] : '\0'; }

  char32_t next_codepoint() {
    const auto c = static_cast<uint8_t>(p_[pos_]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || pos_ + len > end_) fail("invalid UTF-8");
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(p_[pos_ + i]) & 0x3F);
    pos_ += len;
    return cp;
  }

  std::string alternation() {
    if (++depth_ > 100) fail("nested too deeply");
    std::vector<std::string> alts{sequence()};
    while (peek() == '|') {
      ++pos_;
      alts.push_back(sequence());
    }
    --depth_;
    if (alts.size() == 1) return alts[0];
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) {
      if (i) out += " | ";
      out += alts[i].empty() ? std::string("\"\"") : alts[i];
    }
    return out;
  }

  std::string sequence() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      std::string atom_text = atom();
      atom_text = quantified(atom_text);
      if (!out.empty()) out += ' ';
      out += atom_text;
    }
    return out;
  }

  uint32_t read_number() {
    uint32_t v = 0;
    size_t start = pos_;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<uint32_t>(peek() - '0');
      if (v > 100000) fail("repetition count too large");
      ++pos_;
    }
    if (pos_ == start) return UINT32_MAX;
    return v;
  }

  std::string quantified(const std::string& atom) {
    std::string out = atom;
    while (!at_end()) {
      const char c = peek();
      std::string suffix;
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        suffix = std::string(1, c);
      } else if (c == '{') {
        const size_t save = pos_;
        ++pos_;
        const uint32_t m = read_number();
        uint32_t n = m;
        bool ok = m != UINT32_MAX;
        if (ok && peek() == ',') {
          ++pos_;
          n = read_number();  // UINT32_MAX: unbounded
        }
        if (!ok || peek() != '}') {
          pos_ = save;  // not a quantifier: a literal '{' (as ECMAScript reads it)
          return out;
        }
        ++pos_;
        if (n != UINT32_MAX && n < m) fail("{m,n} with n < m");
        suffix = repeat_suffix(m, n);
      } else {
        break;
      }
      if (peek() == '?') ++pos_;  // lazy: the same strings
      out = group(out) + suffix;
    }
    return out;
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        ++pos_;
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == '<' && pos_ + 1 < end_ && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
          while (!at_end() && peek() != '>') ++pos_;  // named group
          if (at_end()) fail("unterminated group name");
          ++pos_;
        } else {
          unsupported("lookaround and inline flags '(?" + std::string(1, peek()) + "'");
        }
      }
      std::string inner = alternation();
      if (peek() != ')') fail("missing ')'");
      ++pos_;
      return group(inner);
    }
    if (c == '[') return set_to_gbnf(char_class());
    if (c == '.') {
      ++pos_;
      return set_to_gbnf(line_terminators().complement());
    }
    if (c == '^' || c == '$') unsupported("an anchor inside the pattern");
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat before '" + std::string(1, c) + "'");
    if (c == '\\') {
      CodepointSet set;
      escape(set, false);
      return set_to_gbnf(set);
    }
    return set_to_gbnf(CodepointSet::single(next_codepoint()));
  }

  uint32_t hex_digits(size_t count) {
    uint32_t v = 0;
    for (size_t i = 0; i < count; ++i) {
      if (at_end()) fail("incomplete escape");
      const char h = peek();
      int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
      if (d < 0) fail("bad hex digit in escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After '\': adds what the escape matches to `set`.
  void escape(CodepointSet& set, bool in_class) {
    ++pos_;
    if (at_end()) fail("trailing backslash");
    const char e = peek();
    ++pos_;
    auto add_set = [&](const CodepointSet& s) {
      for (auto [lo, hi] : s.ranges()) set.add(lo, hi);
    };
    switch (e) {
      case 'd': add_set(digits()); break;
      case 'D': add_set(digits().complement()); break;
      case 'w': add_set(word_chars()); break;
      case 'W': add_set(word_chars().complement()); break;
      case 's': add_set(space_chars()); break;
      case 'S': add_set(space_chars().complement()); break;
      case 'n': set.add('\n', '\n'); break;
      case 't': set.add('\t', '\t'); break;
      case 'r': set.add('\r', '\r'); break;
      case 'f': set.add('\f', '\f'); break;
      case 'v': set.add('\v', '\v'); break;
      case '0': set.add(0, 0); break;
      case 'x': {
        const char32_t v = hex_digits(2);
        set.add(v, v);
        break;
      }
      case 'u': {
        char32_t v;
        if (peek() == '{') {
          ++pos_;
          v = 0;
          size_t n = 0;
          while (!at_end() && peek() != '}') {
            v = v * 16 + hex_digits(1);
            if (++n > 6 || v > kMaxCodepoint) fail("bad \\u{...} escape");
          }
          if (at_end()) fail("unterminated \\u{...} escape");
          ++pos_;
        } else {
          v = hex_digits(4);
        }
        set.add(v, v);
        break;
      }
      case 'b':
        if (in_class) {
          set.add('\b', '\b');
          break;
        }
        unsupported("the word boundary '\\b'");
      case 'B': unsupported("'\\B'");
      case 'p':
      case 'P': unsupported("Unicode property escapes '\\p{...}'");
      case 'k': unsupported("named backreferences '\\k<...>'");
      case 'c': unsupported("control escapes '\\cX'");
      default:
        if (e >= '1' && e <= '9') unsupported("backreferences '\\" + std::string(1, e) + "'");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) fail("unknown escape '\\" + std::string(1, e) + "'");
        --pos_;
        {
          const char32_t cp = next_codepoint();
          set.add(cp, cp);
        }
    }
    set.normalize();
  }

  CodepointSet char_class() {
    ++pos_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodepointSet set;
    while (true) {
      if (at_end()) fail("unterminated character class");
      if (peek() == ']') break;  // as in ECMAScript, [] is empty and [^] is any character
      // One item: a character (possibly escaped) or a class escape.
      auto item = [&](char32_t& single) -> bool {
        if (peek() == '\\') {
          CodepointSet s;
          escape(s, true);
          if (s.ranges().size() == 1 && s.ranges()[0].first == s.ranges()[0].second) {
            single = s.ranges()[0].first;
            return true;
          }
          for (auto [lo, hi] : s.ranges()) set.add(lo, hi);
          return false;
        }
        single = next_codepoint();
        return true;
      };
      char32_t lo = 0;
      if (!item(lo)) continue;
      if (peek() == '-' && pos_ + 1 < end_ && p_[pos_ + 1] != ']') {
        ++pos_;
        char32_t hi = 0;
        if (!item(hi)) fail("a range ending in a class escape");
        if (hi < lo) fail("character range out of order");
        set.add(lo, hi);
      } else {
        set.add(lo, lo);
      }
    }
    ++pos_;
    set.normalize();
    return negated ? set.complement() : set;
  }

  std::string_view p_;
  size_t pos_ = 0;
  size_t end_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string pattern_to_gbnf(std::string_view pattern, const std::string& any_char) {
  return RegexParser(pattern).parse(any_char);
}

}  // namespace m40::grammar::detail

// The rules follow Jinja2's documented behaviour (Template Designer
// Documentation, "Whitespace Control"; API, "trim_blocks", "lstrip_blocks",
// "keep_trailing_newline"):
// - a `-` after `{%`, `{{`, `{#` strips all whitespace (newlines too) before
//   the tag; a `-` before `%}`, `}}`, `#}` strips all whitespace after it;
// - trim_blocks removes the first newline after `%}` or `#}`;
// - lstrip_blocks removes spaces and tabs between the start of a line and a
//   `{%` or `{#` (never before `{{`), unless the tag starts with `{%+`;
// - `\r\n` and `\r` become `\n`, and a single newline ending the source is
//   dropped unless keep_trailing_newline is set.
#include "chat/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "chat/jinja/template_error.h"
#include "chat/jinja/unicode.h"

namespace m40::chat::jinja {

namespace {

std::string normalize_newlines(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_name_start(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80; }
bool is_name_char(unsigned char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string_view source, const LexOptions& options)
      : src_(normalize_newlines(source, options.keep_trailing_newline)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // the previous match ended a line (or nothing matched yet)
    const size_t n = src_.size();
    while (pos < n) {
      const size_t tag = find_tag_start(pos);
      if (tag == std::string::npos) {
        emit_data(pos, src_.substr(pos));
        break;
      }
      std::string text = src_.substr(pos, tag - pos);
      const char kind = src_[tag + 1];
      size_t q = tag + 2;
      char sign = 0;
      if (q < n && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      size_t raw_body = 0;
      const bool raw = kind == '%' && match_raw_begin(q, raw_body);

      apply_strip(text, sign, kind != '{', line_starting);
      if (!text.empty()) emit_data(pos, std::move(text));

      if (raw) {
        pos = lex_raw(tag, raw_body);
      } else if (kind == '#') {
        pos = lex_comment(tag, q);
      } else {
        pos = lex_tag(tag, q, kind == '%');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Token end;
    end.type = TokenType::End;
    locate(end, src_.size());
    tokens_.push_back(end);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& message) const {
    Token t;
    locate(t, pos);
    throw TemplateSyntaxError(message, t.line, t.column);
  }

  // Sets t's line and column (in code points, from 1) for the byte at pos.
  // Tokens come in source order, so the column is counted on from the last
  // position located when pos is further along the same line: counting from
  // the line start each time was quadratic on a long one-line template.
  // (Token positions are code-point boundaries, so the counts add up.)
  void locate(Token& t, size_t pos) const {
    const bool same_line = pos >= cursor_pos_ && (cursor_line_ + 1 >= line_starts_.size() ||
                                                  pos < line_starts_[cursor_line_ + 1]);
    if (same_line) {
      cursor_column_ += unicode::length(std::string_view(src_).substr(cursor_pos_, pos - cursor_pos_));
    } else {
      size_t lo = 0, hi = line_starts_.size();
      while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        if (line_starts_[mid] <= pos) lo = mid;
        else hi = mid;
      }
      const size_t start = line_starts_[lo];
      cursor_line_ = lo;
      cursor_column_ = unicode::length(std::string_view(src_).substr(start, pos - start)) + 1;
    }
    cursor_pos_ = pos;
    t.line = static_cast<int>(cursor_line_) + 1;
    t.column = static_cast<int>(cursor_column_);
  }

  void emit(TokenType type, size_t pos, std::string text) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    locate(t, pos);
    tokens_.push_back(std::move(t));
  }

  void emit_data(size_t pos, std::string text) { emit(TokenType::Data, pos, std::move(text)); }

  size_t find_tag_start(size_t pos) const {
    while (true) {
      const size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  // Python's \s at pos (Unicode whitespace); returns its byte length or 0.
  size_t space_at(size_t pos) const {
    const auto c = static_cast<unsigned char>(src_[pos]);
    if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) ? 1 : 0;
    size_t len = 1;
    while (pos + len < src_.size() && len < 4 && (static_cast<unsigned char>(src_[pos + len]) & 0xC0) == 0x80) ++len;
    const std::u32string cp = unicode::decode(std::string_view(src_).substr(pos, len));
    return (cp.size() == 1 && unicode::is_space(cp[0])) ? len : 0;
  }

  size_t skip_spaces(size_t pos) const {
    while (pos < src_.size()) {
      const size_t len = space_at(pos);
      if (len == 0) break;
      pos += len;
    }
    return pos;
  }

  static std::string rstrip_spaces(const std::string& text) {
    std::u32string cps = unicode::decode(text);
    size_t end = cps.size();
    while (end > 0 && unicode::is_space(cps[end - 1])) --end;
    cps.resize(end);
    return unicode::encode(cps);
  }

  void apply_strip(std::string& text, char sign, bool lstrip_applies, bool line_starting) const {
    if (sign == '-') {
      text = rstrip_spaces(text);
    } else if (sign != '+' && options_.lstrip_blocks && lstrip_applies) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        if (text.find_first_not_of(" \t", l_pos) == std::string::npos) text.resize(l_pos);
      }
    }
  }

  // `{%[-+]? raw [-]?%}` with q just past the sign; sets body to the first
  // byte after the tag.
  bool match_raw_begin(size_t q, size_t& body) const {
    size_t p = skip_spaces(q);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip_spaces(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      body = skip_spaces(p + 3);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      body = p + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t tag, size_t body) {
    size_t search = body;
    while (true) {
      const size_t p = src_.find("{%", search);
      if (p == std::string::npos) fail(tag, "missing end of raw directive ({% endraw %})");
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      size_t e = skip_spaces(q);
      if (src_.compare(e, 6, "endraw") == 0) {
        e = skip_spaces(e + 6);
        size_t after = std::string::npos;
        if (src_.compare(e, 3, "+%}") == 0) {
          after = e + 3;
        } else if (src_.compare(e, 3, "-%}") == 0) {
          after = skip_spaces(e + 3);
        } else if (src_.compare(e, 2, "%}") == 0) {
          after = e + 2;
          if (options_.trim_blocks && after < src_.size() && src_[after] == '\n') ++after;
        }
        if (after != std::string::npos) {
          std::string text = src_.substr(body, p - body);
          const bool line_starting = body > 0 && src_[body - 1] == '\n';
          apply_strip(text, sign, true, line_starting);
          if (!text.empty()) emit_data(body, std::move(text));
          return after;
        }
      }
      search = p + 2;
    }
  }

  size_t lex_comment(size_t tag, size_t q) {
    const size_t end = src_.find("#}", q);
    if (end == std::string::npos) fail(tag, "missing end of comment tag (#})");
    if (end > q && src_[end - 1] == '-') return skip_spaces(end + 2);
    if (end > q && src_[end - 1] == '+') return end + 2;
    size_t after = end + 2;
    if (options_.trim_blocks && after < src_.size() && src_[after] == '\n') ++after;
    return after;
  }

  // Tokens of a {{ }} or {% %} tag; returns the position after its end.
  size_t lex_tag(size_t tag, size_t pos, bool block) {
    emit(block ? TokenType::BlockBegin : TokenType::VariableBegin, tag, block ? "{%" : "{{");
    std::string balance;  // open brackets; a tag cannot end inside them
    const size_t n = src_.size();
    while (true) {
      pos = skip_spaces(pos);
      if (pos >= n) {
        fail(tag, std::string("unexpected end of template: the tag opened here has no ") + (block ? "%}" : "}}"));
      }
      if (balance.empty()) {
        if (block) {
          if (src_.compare(pos, 3, "-%}") == 0) {
            emit(TokenType::BlockEnd, pos, "%}");
            return skip_spaces(pos + 3);
          }
          if (src_.compare(pos, 3, "+%}") == 0) {
            emit(TokenType::BlockEnd, pos, "%}");
            return pos + 3;
          }
          if (src_.compare(pos, 2, "%}") == 0) {
            emit(TokenType::BlockEnd, pos, "%}");
            size_t after = pos + 2;
            if (options_.trim_blocks && after < n && src_[after] == '\n') ++after;
            return after;
          }
        } else {
          if (src_.compare(pos, 3, "-}}") == 0) {
            emit(TokenType::VariableEnd, pos, "}}");
            return skip_spaces(pos + 3);
          }
          if (src_.compare(pos, 2, "}}") == 0) {
            emit(TokenType::VariableEnd, pos, "}}");
            return pos + 2;
          }
        }
      }
      const char c = src_[pos];
      if (size_t len = match_float(pos); len > 0) {
        std::string digits;
        for (size_t i = pos; i < pos + len; ++i)
          if (src_[i] != '_') digits.push_back(src_[i]);
        Token t;
        t.type = TokenType::Float;
        t.text = src_.substr(pos, len);
        t.float_value = std::strtod(digits.c_str(), nullptr);
        locate(t, pos);
        tokens_.push_back(std::move(t));
        pos += len;
      } else if (is_digit(c)) {
        pos = lex_integer(pos);
      } else if (is_name_start(static_cast<unsigned char>(c))) {
        size_t end = pos;
        while (end < n && is_name_char(static_cast<unsigned char>(src_[end])) && space_at(end) == 0) ++end;
        emit(TokenType::Name, pos, src_.substr(pos, end - pos));
        pos = end;
      } else if (c == '"' || c == '\'') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos, balance);
      }
    }
  }

  // Length of a float literal at pos (Jinja's float_re), or 0.
  size_t match_float(size_t pos) const {
    const size_t n = src_.size();
    if (pos > 0 && src_[pos - 1] == '.') return 0;
    auto digits = [&](size_t p) -> size_t {  // (\d+_)*\d+
      size_t q = p;
      if (q >= n || !is_digit(src_[q])) return 0;
      while (true) {
        while (q < n && is_digit(src_[q])) ++q;
        if (q + 1 < n && src_[q] == '_' && is_digit(src_[q + 1])) {
          ++q;
          continue;
        }
        return q - p;
      }
    };
    size_t p = pos + digits(pos);
    if (p == pos) return 0;
    bool fraction = false;
    if (p < n && src_[p] == '.') {
      const size_t d = digits(p + 1);
      if (d > 0) {
        p += 1 + d;
        fraction = true;
      }
    }
    if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      const size_t d = digits(q);
      if (d > 0) return q + d - pos;
    }
    return fraction ? p - pos : 0;
  }

  size_t lex_integer(size_t pos) {
    const size_t n = src_.size();
    int base = 10;
    size_t p = pos;
    if (src_[p] == '0' && p + 1 < n && std::strchr("bBoOxX", src_[p + 1]) != nullptr && src_[p + 1] != '\0') {
      const char b = static_cast<char>(src_[p + 1] | 0x20);
      base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
      p += 2;
    }
    auto is_base_digit = [&](char c) {
      if (base == 2) return c == '0' || c == '1';
      if (base == 8) return c >= '0' && c <= '7';
      if (base == 16) return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
      return is_digit(c);
    };
    std::string digits;
    size_t q = p;
    while (q < n) {
      if (is_base_digit(src_[q])) {
        digits.push_back(src_[q++]);
      } else if (src_[q] == '_' && q + 1 < n && is_base_digit(src_[q + 1]) && (base != 10 || !digits.empty())) {
        ++q;
      } else {
        break;
      }
    }
    if (digits.empty()) {  // "0x" without digits: the 0 alone
      digits.assign(1, '0');
      q = pos + 1;
      base = 10;
    } else if (base == 10 && digits.size() > 1 && digits[0] == '0') {
      // Python allows only zeros after a leading 0 ("00" but not "012").
      size_t zeros = 0;
      while (zeros < digits.size() && digits[zeros] == '0') ++zeros;
      if (zeros < digits.size()) {
        digits.assign(1, '0');
        q = pos + 1;
      }
    }
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(digits.c_str(), &end, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
      fail(pos, "integer literal too large: " + src_.substr(pos, q - pos));
    }
    Token t;
    t.type = TokenType::Integer;
    t.text = src_.substr(pos, q - pos);
    t.int_value = static_cast<int64_t>(v);
    locate(t, pos);
    tokens_.push_back(std::move(t));
    return q;
  }

  // A quoted string with Python's escape sequences (Jinja decodes string
  // literals with Python's "unicode-escape" codec).
  size_t lex_string(size_t pos) {
    const char quote = src_[pos];
    const size_t n = src_.size();
    std::string value;
    size_t p = pos + 1;
    auto hex_value = [&](size_t start, size_t count, const char* what) -> char32_t {
      if (start + count > n) fail(p, std::string("truncated ") + what + " escape in string literal");
      char32_t v = 0;
      for (size_t i = 0; i < count; ++i) {
        const char c = src_[start + i];
        int d = -1;
        if (is_digit(c)) d = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') d = (c | 0x20) - 'a' + 10;
        if (d < 0) fail(p, std::string("truncated ") + what + " escape in string literal");
        v = v * 16 + static_cast<char32_t>(d);
      }
      return v;
    };
    while (true) {
      if (p >= n) fail(pos, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= n) fail(pos, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'n': value.push_back('\n'); break;
        case 'r': value.push_back('\r'); break;
        case 't': value.push_back('\t'); break;
        case 'v': value.push_back('\v'); break;
        case 'x':
          unicode::append(value, hex_value(p, 2, "\\xXX"));
          p += 2;
          break;
        case 'u':
          unicode::append(value, hex_value(p, 4, "\\uXXXX"));
          p += 4;
          break;
        case 'U': {
          const char32_t cp = hex_value(p, 8, "\\UXXXXXXXX");
          if (cp > 0x10FFFF) fail(p, "illegal Unicode character in string literal");
          unicode::append(value, cp);
          p += 8;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k) v = v * 8 + static_cast<char32_t>(src_[p++] - '0');
            unicode::append(value, v);
          } else if (e == 'N') {
            fail(p - 2, "\\N{...} escapes are not supported in string literals");
          } else {  // unknown escapes stay as written
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    emit(TokenType::String, pos, std::move(value));
    return p + 1;
  }

  size_t lex_operator(size_t pos, std::string& balance) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (src_.compare(pos, 2, op) == 0) {
        emit(TokenType::Operator, pos, op);
        return pos + 2;
      }
    }
    const char c = src_[pos];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == '\0') {
      std::string shown;
      if (static_cast<unsigned char>(c) < 0x80) {
        shown = std::string(1, c);
      } else {
        shown = unicode::encode(unicode::decode(std::string_view(src_).substr(pos, 4)).substr(0, 1));
      }
      fail(pos, "unexpected character '" + shown + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c);
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (balance.empty()) fail(pos, std::string("unexpected '") + c + "'");
      if (balance.back() != open) {
        const char expected = balance.back() == '(' ? ')' : balance.back() == '[' ? ']' : '}';
        fail(pos, std::string("unexpected '") + c + "', expected '" + expected + "'");
      }
      balance.pop_back();
    }
    emit(TokenType::Operator, pos, std::string(1, c));
    return pos + 1;
  }

  std::string src_;
  LexOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  // The last position located, its line (from 0) and column (from 1).
  mutable size_t cursor_pos_ = 0;
  mutable size_t cursor_line_ = 0;
  mutable size_t cursor_column_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace m40::chat::jinja

#include "chat/jinja/unicode.h"

#include "common/unicode.h"

namespace m40::chat::unicode {

namespace {

// Length of a UTF-8 sequence from its first byte, 0 if it cannot start one.
int sequence_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int len = sequence_length(c);
    bool ok = len > 0 && i + static_cast<size_t>(len) <= s.size();
    char32_t cp = 0;
    if (ok) {
      if (len == 1) {
        cp = c;
      } else {
        cp = c & (0xFF >> (len + 1));
        for (int k = 1; k < len && ok; ++k) {
          const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
          if (!is_continuation(cc)) ok = false;
          cp = (cp << 6) | (cc & 0x3F);
        }
        // Overlong forms, surrogates and values past U+10FFFF are invalid.
        if (ok && ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
                   (cp >= 0xD800 && cp <= 0xDFFF))) {
          ok = false;
        }
      }
    }
    if (ok) {
      out.push_back(cp);
      i += static_cast<size_t>(len);
    } else {
      out.push_back(0xDC00 + c);  // surrogateescape
      ++i;
    }
  }
  return out;
}

void append(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {  // an escaped invalid byte: give it back
    out.push_back(static_cast<char>(cp - 0xDC00));
  } else if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) append(out, cp);
  return out;
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode(s).size();
}

bool is_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_line_break(char32_t cp) {
  switch (cp) {
    case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x85: case 0x2028:
    case 0x2029:
      return true;
    default:
      return false;
  }
}

bool is_upper(char32_t c) { return (m40::unicode::str_flags(c) & m40::unicode::kUpper) != 0; }
bool is_lower(char32_t c) { return (m40::unicode::str_flags(c) & m40::unicode::kLower) != 0; }
bool is_alpha(char32_t c) { return (m40::unicode::flags(c) & m40::unicode::kLetter) != 0; }
bool is_digit(char32_t c) { return (m40::unicode::str_flags(c) & m40::unicode::kDigit) != 0; }
bool is_decimal(char32_t c) { return (m40::unicode::str_flags(c) & m40::unicode::kDecimal) != 0; }
bool is_numeric(char32_t c) { return (m40::unicode::str_flags(c) & m40::unicode::kNumeric) != 0; }

namespace {

void append_mapped(std::string& out, const m40::unicode::Mapped& m) {
  for (char32_t c : m) append(out, c);
}

bool is_cased(char32_t c) { return (m40::unicode::str_flags(c) & m40::unicode::kCased) != 0; }
bool is_case_ignorable(char32_t c) { return (m40::unicode::str_flags(c) & m40::unicode::kCaseIgnorable) != 0; }

// CPython's lower_ucs4: the full lowercase of text[i], where a capital sigma
// is final (ς) after a cased letter and not before one, case-ignorable
// characters skipped either way.
void append_lower(std::string& out, const std::u32string& text, size_t i) {
  if (text[i] != 0x3A3) {
    append_mapped(out, m40::unicode::lower(text[i]));
    return;
  }
  size_t j = i;
  while (j > 0 && is_case_ignorable(text[j - 1])) --j;
  bool final_sigma = j > 0 && is_cased(text[j - 1]);
  if (final_sigma) {
    size_t k = i + 1;
    while (k < text.size() && is_case_ignorable(text[k])) ++k;
    final_sigma = k == text.size() || !is_cased(text[k]);
  }
  append(out, final_sigma ? char32_t{0x3C2} : char32_t{0x3C3});
}

}  // namespace

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out.push_back((c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c);
    return out;
  }
  for (char32_t cp : decode(s)) append_mapped(out, m40::unicode::upper(cp));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out.push_back((c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c);
    return out;
  }
  const std::u32string cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) append_lower(out, cps, i);
  return out;
}

std::string casefold(std::string_view s) {
  if (is_ascii(s)) return lower(s);
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : decode(s)) append_mapped(out, m40::unicode::casefold(cp));
  return out;
}

std::string title(std::string_view s) {  // CPython's do_title
  std::string out;
  out.reserve(s.size());
  const std::u32string cps = decode(s);
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_cased) {
      append_lower(out, cps, i);
    } else {
      append_mapped(out, m40::unicode::title(cps[i]));
    }
    previous_cased = is_cased(cps[i]);
  }
  return out;
}

std::string capitalize(std::string_view s) {  // CPython's do_capitalize (3.8+: title case first)
  std::string out;
  out.reserve(s.size());
  const std::u32string cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      append_mapped(out, m40::unicode::title(cps[i]));
    } else {
      append_lower(out, cps, i);
    }
  }
  return out;
}

std::string swapcase(std::string_view s) {  // CPython's do_swapcase
  std::string out;
  out.reserve(s.size());
  const std::u32string cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    if (is_upper(cps[i])) {
      append_lower(out, cps, i);
    } else if (is_lower(cps[i])) {
      append_mapped(out, m40::unicode::upper(cps[i]));
    } else {
      append(out, cps[i]);
    }
  }
  return out;
}

bool isupper(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    const uint8_t f = m40::unicode::str_flags(c);
    if (f & (m40::unicode::kLower | m40::unicode::kTitle)) return false;
    if (f & m40::unicode::kUpper) cased = true;
  }
  return cased;
}

bool islower(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    const uint8_t f = m40::unicode::str_flags(c);
    if (f & (m40::unicode::kUpper | m40::unicode::kTitle)) return false;
    if (f & m40::unicode::kLower) cased = true;
  }
  return cased;
}

bool istitle(std::string_view s) {
  bool cased = false;
  bool previous_cased = false;
  for (char32_t c : decode(s)) {
    const uint8_t f = m40::unicode::str_flags(c);
    if (f & (m40::unicode::kUpper | m40::unicode::kTitle)) {
      if (previous_cased) return false;
      previous_cased = cased = true;
    } else if (f & m40::unicode::kLower) {
      if (!previous_cased) return false;
      previous_cased = cased = true;
    } else {
      previous_cased = false;
    }
  }
  return cased;
}

}  // namespace m40::chat::unicode

// Code-point helpers for the Jinja interpreter: Python's str operates on code
// points, our strings are UTF-8. Invalid bytes decode to U+DC80..U+DCFF (as
// Python's "surrogateescape" does) and encode back to the same byte, so no
// input is ever lost or rejected.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace m40::chat::unicode {

std::u32string decode(std::string_view utf8);
std::string encode(std::u32string_view text);
void append(std::string& out, char32_t cp);

// Number of code points (Python len(str)).
size_t length(std::string_view utf8);
inline bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// Python str.isspace() for one code point (also what re's \s matches).
bool is_space(char32_t cp);
// Line boundaries of Python str.splitlines().
bool is_line_break(char32_t cp);

// Python's str predicates for one code point, from the shared Unicode tables
// (common/unicode.h).
bool is_upper(char32_t cp);    // str.isupper() (Uppercase)
bool is_lower(char32_t cp);    // str.islower() (Lowercase)
bool is_alpha(char32_t cp);    // str.isalpha(): a letter (\p{L})
bool is_digit(char32_t cp);    // str.isdigit()
bool is_decimal(char32_t cp);  // str.isdecimal()
bool is_numeric(char32_t cp);  // str.isnumeric()

// Python's str case methods on UTF-8 text, with the full case mappings
// ("ß".upper() == "SS") and, where lower() applies, the final-sigma rule
// ("ΑΣ".lower() == "ας").
std::string upper(std::string_view utf8);
std::string lower(std::string_view utf8);
std::string casefold(std::string_view utf8);
std::string title(std::string_view utf8);
std::string capitalize(std::string_view utf8);
std::string swapcase(std::string_view utf8);
bool isupper(std::string_view utf8);
bool islower(std::string_view utf8);
bool istitle(std::string_view utf8);

}  // namespace m40::chat::unicode

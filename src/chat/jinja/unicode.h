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

// Simple case mapping: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic.
// Enough for the text chat templates transform; other scripts are unchanged.
char32_t to_upper(char32_t cp);
char32_t to_lower(char32_t cp);
bool is_upper(char32_t cp);
bool is_lower(char32_t cp);
bool is_alpha(char32_t cp);
bool is_digit(char32_t cp);

// Python str.upper() / str.lower() (with the 'ß' -> "SS" expansion).
std::string upper(std::string_view utf8);
std::string lower(std::string_view utf8);

}  // namespace m40::chat::unicode

// UTF-8 helpers for the tokenizers: strict validation, replacement of invalid
// bytes with U+FFFD, and the GPT-2 byte-to-unicode map of byte-level BPE.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace m40::tokenizer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the sequence a lead byte announces, the way llama.cpp splits text
// into symbols: 1 for ASCII and for a stray continuation byte.
inline size_t lead_length(uint8_t lead) {
  static constexpr uint8_t kTable[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kTable[lead >> 4];
}

// Length of the well-formed character at s[i] (Unicode table 3-7: no
// overlongs, no surrogates, nothing above U+10FFFF), or 0 if the bytes there
// do not start one.
size_t valid_length(std::string_view s, size_t i);

// Whether every byte of s belongs to a well-formed character.
bool is_valid(std::string_view s);

// Copies s to out with every byte that does not start a well-formed character
// replaced by U+FFFD (one replacement per bad byte, as llama.cpp does).
void sanitize(std::string_view s, std::string& out);

// How many bytes at the end of s form the unfinished start of a character
// that more bytes could still complete (0 to 3). Used by the streaming
// detokenizer to hold back a character split across tokens.
size_t incomplete_tail(std::string_view s);

// Decodes the well-formed character at s[i] and advances i. s must be valid.
char32_t decode(std::string_view s, size_t& i);

void append(std::string& out, char32_t cp);

// GPT-2's byte-level alphabet: every byte maps to a printable code point
// (printable Latin-1 bytes to themselves, the rest to U+0100 and up), so any
// byte string becomes a string of "visible" characters for BPE.
const std::array<char32_t, 256>& byte_to_codepoint();
// The byte a code point of that alphabet stands for, or -1.
int codepoint_to_byte(char32_t cp);

}  // namespace m40::tokenizer::utf8

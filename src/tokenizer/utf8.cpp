#include "tokenizer/utf8.h"

#include <cstring>

namespace m40::tokenizer::utf8 {

namespace {

inline bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Bounds of the second byte for a lead byte (Unicode table 3-7); the other
// continuation bytes are always 0x80..0xBF.
struct SecondByteRange {
  uint8_t lo, hi;
};
inline SecondByteRange second_byte_range(uint8_t lead) {
  switch (lead) {
    case 0xE0: return {0xA0, 0xBF};  // no overlongs
    case 0xED: return {0x80, 0x9F};  // no surrogates
    case 0xF0: return {0x90, 0xBF};  // no overlongs
    case 0xF4: return {0x80, 0x8F};  // nothing above U+10FFFF
    default: return {0x80, 0xBF};
  }
}

// Expected length for a lead byte, 0 if it can never start a character.
inline size_t expected_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;  // continuation byte or overlong 2-byte lead
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

}  // namespace

size_t valid_length(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  const uint8_t lead = p[i];
  const size_t len = expected_length(lead);
  if (len <= 1) return len;
  if (i + len > n) return 0;
  const SecondByteRange r = second_byte_range(lead);
  if (p[i + 1] < r.lo || p[i + 1] > r.hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (!is_continuation(p[i + k])) return 0;
  }
  return len;
}

bool is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs, eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ULL) != 0) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t len = valid_length(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void sanitize(std::string_view s, std::string& out) {
  out.clear();
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = valid_length(s, i);
    if (len == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
}

size_t incomplete_tail(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  // A character is at most 4 bytes: its lead is among the last 3 bytes.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const uint8_t b = p[i];
    if (is_continuation(b)) continue;
    const size_t len = expected_length(b);
    if (len <= back) return 0;  // ASCII, an invalid lead, or a complete character
    // The bytes present must be a valid beginning of that character.
    if (back >= 2) {
      const SecondByteRange r = second_byte_range(b);
      if (p[i + 1] < r.lo || p[i + 1] > r.hi) return 0;
    }
    return back;
  }
  return 0;
}

char32_t decode(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t b0 = p[i];
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t cp = (char32_t(b0 & 0x1F) << 6) | char32_t(p[i + 1] & 0x3F);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const char32_t cp = (char32_t(b0 & 0x0F) << 12) | (char32_t(p[i + 1] & 0x3F) << 6) | char32_t(p[i + 2] & 0x3F);
    i += 3;
    return cp;
  }
  const char32_t cp = (char32_t(b0 & 0x07) << 18) | (char32_t(p[i + 1] & 0x3F) << 12) |
                      (char32_t(p[i + 2] & 0x3F) << 6) | char32_t(p[i + 3] & 0x3F);
  i += 4;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

const std::array<char32_t, 256>& byte_to_codepoint() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

int codepoint_to_byte(char32_t cp) {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t{};
    t.fill(-1);
    const auto& forward = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) t[forward[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

}  // namespace m40::tokenizer::utf8

// The shared Unicode tables (common/unicode.h) against what Python 3.11's
// str methods give for one character, on scripts beyond Latin, Greek and
// Cyrillic.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/unicode.h"

namespace m40::unicode {
namespace {

std::u32string text(const Mapped& m) { return std::u32string(m.begin(), m.end()); }

TEST(TokenizerUnicode, LowerAndUpperOfEveryCasedScript) {
  struct Pair {
    char32_t upper, lower;
  };
  // Latin, Latin-1, Greek, Cyrillic; Armenian, Georgian Asomtavruli and
  // Mtavruli; Cherokee, Deseret, Glagolitic; fullwidth Latin, Adlam, Old
  // Hungarian, Medefaidrin.
  const Pair pairs[] = {
      {U'A', U'a'},     {0xC0, 0xE0},       {0x391, 0x3B1},     {0x410, 0x430},
      {0x531, 0x561},   {0x10A0, 0x2D00},   {0x1C90, 0x10D0},   {0x13A0, 0xAB70},
      {0x10400, 0x10428}, {0x2C00, 0x2C30}, {0xFF21, 0xFF41},   {0x1E900, 0x1E922},
      {0x10C80, 0x10CC0}, {0x16E40, 0x16E60},
  };
  for (const Pair& p : pairs) {
    EXPECT_EQ(text(lower(p.upper)), std::u32string(1, p.lower)) << std::hex << static_cast<uint32_t>(p.upper);
    EXPECT_EQ(text(upper(p.lower)), std::u32string(1, p.upper)) << std::hex << static_cast<uint32_t>(p.lower);
    EXPECT_EQ(to_lower(p.upper), p.lower);
    EXPECT_TRUE(str_flags(p.upper) & kUpper);
    EXPECT_TRUE(str_flags(p.lower) & kLower);
  }
  // Python folds Cherokee to its capitals.
  EXPECT_EQ(text(casefold(0xAB70)), U"\u13A0");
}

TEST(TokenizerUnicode, FullMappingsExpand) {
  EXPECT_EQ(text(upper(0xDF)), U"SS");
  EXPECT_EQ(text(title(0xDF)), U"Ss");
  EXPECT_EQ(text(casefold(0xDF)), U"ss");
  EXPECT_EQ(text(lower(0xDF)), U"\u00DF");
  EXPECT_EQ(text(lower(0x130)), U"i\u0307");
  EXPECT_EQ(to_lower(0x130), U'i');
  EXPECT_EQ(text(upper(0x390)), U"\u0399\u0308\u0301");
  EXPECT_EQ(text(title(0x1C6)), U"\u01C5");  // ǆ -> ǅ, where upper() gives Ǆ
  EXPECT_EQ(text(upper(0x1C6)), U"\u01C4");
  EXPECT_EQ(text(title(0x10D0)), U"\u10D0");  // Mkhedruli has no titlecase
}

TEST(TokenizerUnicode, StrProperties) {
  EXPECT_EQ(str_flags(0x1C5) & (kUpper | kLower | kTitle | kCased), kTitle | kCased);  // ǅ
  EXPECT_TRUE(str_flags(0xAA) & kLower);                                            // ª: Lowercase, no mapping
  EXPECT_TRUE(str_flags(0x301) & kCaseIgnorable);
  EXPECT_TRUE(str_flags(U'\'') & kCaseIgnorable);
  EXPECT_FALSE(str_flags(U' ') & (kCased | kCaseIgnorable));
  EXPECT_EQ(str_flags(0x663) & (kDigit | kDecimal | kNumeric), kDigit | kDecimal | kNumeric);  // ٣
  EXPECT_EQ(str_flags(0xB2) & (kDigit | kDecimal | kNumeric), kDigit | kNumeric);              // ²
  EXPECT_EQ(str_flags(0xBD) & (kDigit | kDecimal | kNumeric), kNumeric);                       // ½
  EXPECT_TRUE(flags(0x10D0) & kLetter);
}

}  // namespace
}  // namespace m40::unicode

// Unicode character facts shared by the tokenizer and the Jinja engine:
// general categories and White_Space, the properties behind Python's str
// predicates, Python's case mappings (str.lower(), upper(), title(),
// casefold() of one character, SpecialCasing's expansions included) and the
// first character of the NFD decomposition. The tables are generated from
// Python's unicodedata by gen_unicode_data.py (unicode_data.cpp records the
// Python and Unicode versions), so both agree with Python on every script.
#pragma once

#include <cstddef>
#include <cstdint>

namespace m40::unicode {

enum CategoryFlag : uint8_t {
  kNumber = 1 << 0,       // \p{N}
  kLetter = 1 << 1,       // \p{L}
  kSeparator = 1 << 2,    // \p{Z}
  kMark = 1 << 3,         // \p{M}
  kPunctuation = 1 << 4,  // \p{P}
  kSymbol = 1 << 5,       // \p{S}
  kControl = 1 << 6,      // \p{C}: control, format, private use, unassigned
  kWhiteSpace = 1 << 7,   // Unicode White_Space
};
uint8_t flags(char32_t cp);

// What Python's str predicates answer for one character, and the case
// properties str.title(), str.istitle() and the final-sigma rule of
// str.lower() use.
enum StrFlag : uint8_t {
  kUpper = 1 << 0,          // str.isupper() (Uppercase)
  kLower = 1 << 1,          // str.islower() (Lowercase)
  kTitle = 1 << 2,          // Titlecase_Letter (Lt)
  kCased = 1 << 3,          // Cased
  kCaseIgnorable = 1 << 4,  // Case_Ignorable
  kDigit = 1 << 5,          // str.isdigit()
  kDecimal = 1 << 6,        // str.isdecimal()
  kNumeric = 1 << 7,        // str.isnumeric()
};
uint8_t str_flags(char32_t cp);

// One character's case mapping: one to three code points.
struct Mapped {
  char32_t cp[3];
  size_t size;
  const char32_t* begin() const { return cp; }
  const char32_t* end() const { return cp + size; }
};
Mapped lower(char32_t cp);     // Python chr(cp).lower()
Mapped upper(char32_t cp);     // chr(cp).upper(): "ß" -> "SS"
Mapped title(char32_t cp);     // chr(cp).title(): "ß" -> "Ss", "ǆ" -> "ǅ"
Mapped casefold(char32_t cp);  // chr(cp).casefold(): "ß" -> "ss"

// The first character of chr(cp).lower() (the simple lowercase mapping for
// all but U+0130, whose lower() is "i" + U+0307).
char32_t to_lower(char32_t cp);

// The first character of cp's canonical decomposition ("é" -> "e").
char32_t nfd_first(char32_t cp);

}  // namespace m40::unicode

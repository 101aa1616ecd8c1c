// Internal: Unicode character facts for the WordPiece tokenizer (categories,
// White_Space, simple lowercase, first character of the NFD decomposition),
// generated into unicode_data.cpp by gen_unicode_data.py.
#pragma once

#include <cstddef>
#include <cstdint>

namespace m40::tokenizer::unicode {

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

struct CategoryRange {
  char32_t first;  // up to the next range's first
  uint8_t flags;
};
struct CodePointPair {
  char32_t from, to;
};
struct NfdRange {
  char32_t first, last, value;
};

extern const CategoryRange kCategoryRanges[];
extern const size_t kCategoryRangeCount;
extern const CodePointPair kLowercase[];
extern const size_t kLowercaseCount;
extern const NfdRange kNfdFirst[];
extern const size_t kNfdFirstCount;

uint8_t flags(char32_t cp);
char32_t to_lower(char32_t cp);
// The first character of cp's canonical decomposition ("é" -> "e").
char32_t nfd_first(char32_t cp);

}  // namespace m40::tokenizer::unicode

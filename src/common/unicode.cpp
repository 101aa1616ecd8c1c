// Lookups in the generated Unicode tables (unicode_data.cpp).
#include <algorithm>

#include "tokenizer/unicode_data.h"

namespace m40::tokenizer::unicode {

uint8_t flags(char32_t cp) {
  const CategoryRange* end = kCategoryRanges + kCategoryRangeCount;
  const CategoryRange* it =
      std::upper_bound(kCategoryRanges, end, cp, [](char32_t c, const CategoryRange& r) { return c < r.first; });
  return it == kCategoryRanges ? uint8_t{0} : (it - 1)->flags;
}

char32_t to_lower(char32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  const CodePointPair* end = kLowercase + kLowercaseCount;
  const CodePointPair* it =
      std::lower_bound(kLowercase, end, cp, [](const CodePointPair& p, char32_t c) { return p.from < c; });
  return it != end && it->from == cp ? it->to : cp;
}

char32_t nfd_first(char32_t cp) {
  if (cp < 0xC0) return cp;
  const NfdRange* end = kNfdFirst + kNfdFirstCount;
  const NfdRange* it = std::upper_bound(kNfdFirst, end, cp, [](char32_t c, const NfdRange& r) { return c < r.first; });
  if (it == kNfdFirst) return cp;
  --it;
  return cp <= it->last ? it->value : cp;
}

}  // namespace m40::tokenizer::unicode

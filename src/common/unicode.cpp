// Lookups in the generated Unicode tables (unicode_data.cpp).
#include "common/unicode.h"

#include <algorithm>

#include "common/unicode_tables.h"

namespace m40::unicode {

namespace {

uint8_t range_flags(const FlagRange* ranges, size_t count, char32_t cp) {
  const FlagRange* end = ranges + count;
  const FlagRange* it = std::upper_bound(ranges, end, cp, [](char32_t c, const FlagRange& r) { return c < r.first; });
  return it == ranges ? uint8_t{0} : (it - 1)->flags;
}

// The entry for cp, or nullptr.
const CaseMapping* find(const CaseMapping* table, size_t count, char32_t cp) {
  const CaseMapping* end = table + count;
  const CaseMapping* it = std::lower_bound(table, end, cp, [](const CaseMapping& m, char32_t c) { return m.from < c; });
  return it != end && it->from == cp ? it : nullptr;
}

Mapped expand(char32_t to) {
  if (to < kExpansionBase) return Mapped{{to, 0, 0}, 1};
  const CaseExpansion& e = kCaseExpansions[to - kExpansionBase];
  return Mapped{{e.cp[0], e.cp[1], e.cp[2]}, e.size};
}

Mapped map(const CaseMapping* table, size_t count, char32_t cp) {
  const CaseMapping* m = find(table, count, cp);
  return m != nullptr ? expand(m->to) : Mapped{{cp, 0, 0}, 1};
}

}  // namespace

uint8_t flags(char32_t cp) { return range_flags(kCategoryRanges, kCategoryRangesCount, cp); }
uint8_t str_flags(char32_t cp) { return range_flags(kStrRanges, kStrRangesCount, cp); }

Mapped lower(char32_t cp) {
  if (cp < 0x80) return Mapped{{cp >= 'A' && cp <= 'Z' ? cp + 32 : cp, 0, 0}, 1};
  return map(kLowercase, kLowercaseCount, cp);
}

Mapped upper(char32_t cp) {
  if (cp < 0x80) return Mapped{{cp >= 'a' && cp <= 'z' ? cp - 32 : cp, 0, 0}, 1};
  return map(kUppercase, kUppercaseCount, cp);
}

Mapped title(char32_t cp) {
  const CaseMapping* m = find(kTitlecase, kTitlecaseCount, cp);
  return m != nullptr ? expand(m->to) : upper(cp);
}

Mapped casefold(char32_t cp) {
  const CaseMapping* m = find(kCasefold, kCasefoldCount, cp);
  return m != nullptr ? expand(m->to) : lower(cp);
}

char32_t to_lower(char32_t cp) { return lower(cp).cp[0]; }

char32_t nfd_first(char32_t cp) {
  if (cp < 0xC0) return cp;
  const NfdRange* end = kNfdFirst + kNfdFirstCount;
  const NfdRange* it = std::upper_bound(kNfdFirst, end, cp, [](char32_t c, const NfdRange& r) { return c < r.first; });
  if (it == kNfdFirst) return cp;
  --it;
  return cp <= it->last ? it->value : cp;
}

}  // namespace m40::unicode

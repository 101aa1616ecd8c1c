// Internal: the generated tables behind unicode.h (unicode_data.cpp, written
// by gen_unicode_data.py), read through the lookups of unicode.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace m40::unicode {

struct FlagRange {
  char32_t first;  // up to the next range's first
  uint8_t flags;
};
// A case mapping of one code point: `to` is the mapped code point, or
// kExpansionBase + i for the several code points of kCaseExpansions[i].
struct CaseMapping {
  char32_t from, to;
};
inline constexpr char32_t kExpansionBase = 0x110000;
struct CaseExpansion {
  char32_t cp[3];
  uint8_t size;
};
struct NfdRange {
  char32_t first, last, value;
};

extern const FlagRange kCategoryRanges[];  // CategoryFlag
extern const size_t kCategoryRangesCount;
extern const FlagRange kStrRanges[];  // StrFlag
extern const size_t kStrRangesCount;
// Sorted by `from`; title and casefold hold only where they differ from
// upper and lower.
extern const CaseMapping kLowercase[];
extern const size_t kLowercaseCount;
extern const CaseMapping kUppercase[];
extern const size_t kUppercaseCount;
extern const CaseMapping kTitlecase[];
extern const size_t kTitlecaseCount;
extern const CaseMapping kCasefold[];
extern const size_t kCasefoldCount;
extern const CaseExpansion kCaseExpansions[];
extern const size_t kCaseExpansionCount;
extern const NfdRange kNfdFirst[];
extern const size_t kNfdFirstCount;

}  // namespace m40::unicode

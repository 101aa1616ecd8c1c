// The parsed form of a GBNF text, before compilation: one expression tree per
// rule. Internal to the grammar library (the parser writes it, the compiler
// reads it).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace m40::grammar::detail {

inline constexpr char32_t kMaxCodepoint = 0x10FFFF;

// A set of Unicode code points as sorted, disjoint, non-adjacent ranges.
class CodepointSet {
 public:
  using Range = std::pair<char32_t, char32_t>;  // inclusive

  static CodepointSet single(char32_t c) {
    CodepointSet s;
    s.ranges_.push_back({c, c});
    return s;
  }
  static CodepointSet all() {
    CodepointSet s;
    s.ranges_.push_back({0, kMaxCodepoint});
    return s;
  }

  void add(char32_t lo, char32_t hi) {
    ranges_.push_back({lo, hi});
    normalized_ = false;
  }
  // Sorts and merges; call after add() before reading.
  void normalize();
  CodepointSet complement() const;  // within [0, U+10FFFF]
  const std::vector<Range>& ranges() const { return ranges_; }
  bool empty() const { return ranges_.empty(); }
  bool contains(char32_t c) const;
  bool operator==(const CodepointSet& other) const { return ranges_ == other.ranges_; }

 private:
  std::vector<Range> ranges_;
  bool normalized_ = true;
};

inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

struct Expr {
  enum class Kind : uint8_t {
    kAlternation,  // children: one of them
    kSequence,     // children: each in turn (empty: matches "")
    kChars,        // one code point of `chars`
    kRuleRef,      // the rule `rule`
    kRepeat,       // children[0] between min and max times
  };
  Kind kind = Kind::kSequence;
  std::vector<Expr> children;
  CodepointSet chars;
  uint32_t rule = 0;
  uint32_t min = 0;
  uint32_t max = 0;  // kUnbounded for * and +
  // Where the expression starts in the source (1-based), for messages.
  uint32_t line = 0;
  uint32_t column = 0;
};

struct RuleDef {
  std::string name;
  Expr body;
  uint32_t line = 0;
  uint32_t column = 0;
};

struct GbnfAst {
  std::vector<RuleDef> rules;  // in order of definition
};

}  // namespace m40::grammar::detail

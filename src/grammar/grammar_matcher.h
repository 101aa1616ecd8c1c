// Matching text against a Grammar, one piece at a time: the set of pushdown
// stacks the text so far can be in. Bytes may stop in the middle of a UTF-8
// character (as tokens do); the rest of it can come with the next call.
//
//   GrammarMatcher m(parse_gbnf(R"(root ::= [0-9]+ "." [0-9]+)"));
//   m.accept("3.1");   // true
//   m.can_end();       // true: "3.1" is a whole match
//   m.accept("x");     // false, and the state is unchanged
//
// Copies share the (append-only) memo of computed steps, so copying is cheap;
// a matcher and its copies belong to one thread.
#pragma once

#include <memory>
#include <string_view>

#include "grammar/grammar.h"

namespace m40::grammar {

namespace detail {
class StackStore;
}

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Consumes the bytes if the grammar allows them all here (the text may end
  // inside a character); otherwise returns false and changes nothing.
  bool accept(std::string_view bytes);
  // Consumes one code point (UTF-8 encoded); false and no change if not allowed.
  bool accept_codepoint(char32_t c);
  // Whether accept(bytes) would succeed, without consuming anything.
  bool allows(std::string_view bytes) const;

  // The text so far is a complete match of the root rule (more may follow).
  bool can_end() const;
  // Complete, and nothing more can follow.
  bool finished() const;
  // The text so far ends inside a UTF-8 character.
  bool inside_character() const { return pending_continuation_ > 0; }
  // Number of alternative stacks the text so far can be in.
  size_t stack_count() const;

  void reset();

  // Whether `text` as a whole matches the grammar's root rule.
  static bool matches(std::shared_ptr<const Grammar> grammar, std::string_view text);

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<detail::StackStore> store_;
  uint32_t config_ = 0;
  int pending_continuation_ = 0;
};

}  // namespace m40::grammar

// Grammars for constrained decoding: GBNF (llama.cpp's grammar syntax) parsed
// and compiled into a pushdown automaton over UTF-8 bytes. See docs/grammar.md.
//
//   auto g = m40::grammar::parse_gbnf(R"(root ::= "yes" | "no")");
//
// A Grammar is immutable once built and may be shared between threads and
// sequences; the per-sequence state lives in GrammarMatcher / TokenConstraint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace m40::grammar {

// A grammar or JSON schema that cannot be used, or a token a grammar does not
// allow. The message is one line saying what is wrong and where.
class GrammarError : public Error {
 public:
  using Error::Error;
};

namespace detail {
struct Automaton;
}

class Grammar {
 public:
  explicit Grammar(std::shared_ptr<const detail::Automaton> automaton, std::string source, std::string root);
  ~Grammar();

  // The GBNF text and the root rule the grammar was built from.
  const std::string& source() const { return source_; }
  const std::string& root() const { return root_; }
  // Rule names of the source, in order of first appearance.
  const std::vector<std::string>& rule_names() const;
  // Size of the compiled automaton (states with byte transitions or calls).
  size_t state_count() const;

  const detail::Automaton& automaton() const { return *automaton_; }

 private:
  std::shared_ptr<const detail::Automaton> automaton_;
  std::string source_;
  std::string root_;
};

// Parses GBNF: `name ::= alternatives` rules (a rule ends at the end of its
// line unless a parenthesis is open, or the next line starts with `|`),
// `# comments`, `|`, `( )`, `*` `+` `?` `{m}` `{m,}` `{m,n}`, "literals" with
// \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [a-z] / [^"\\] classes, `.`
// (any character) and rule references (names of letters, digits and `-`).
// Throws GrammarError naming the line and column of a syntax error, an
// undefined rule, a missing root rule or a left-recursive rule.
std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, std::string_view root = "root");

}  // namespace m40::grammar

// Rule expressions (GbnfAst) -> Automaton: checks (root present, no left
// recursion, something can match), small and single-use rules inlined into
// their callers, repetitions copied out (long bounded ones made counted
// loops), epsilon moves removed, states that can never finish pruned and
// equivalent states merged.
#pragma once

#include <memory>
#include <string_view>

#include "grammar/automaton.h"
#include "grammar/gbnf_ast.h"

namespace m40::grammar::detail {

struct CompileOptions {
  // Long bounded repetitions as counted loops (off: always copied, the plain
  // form the tests check the counted one against).
  bool counted_loops = true;
};

// Throws GrammarError for a missing root, left recursion, a grammar that
// matches nothing, or one too large to compile.
std::shared_ptr<const Automaton> compile_grammar(const GbnfAst& ast, std::string_view root,
                                                 const CompileOptions& options = {});

}  // namespace m40::grammar::detail

// GBNF text -> rule expressions (GbnfAst), with every rule reference resolved.
#pragma once

#include <string_view>

#include "grammar/gbnf_ast.h"

namespace m40::grammar::detail {

// Throws GrammarError "GBNF line L, column C: ..." for a syntax error, a rule
// defined twice or a reference to a rule that is not defined.
GbnfAst parse_gbnf_text(std::string_view text);

}  // namespace m40::grammar::detail

// Jinja2 parser: tokens into a Template tree. Supports the statements chat
// templates use (if/elif/else, for with else/filter/recursive, set, block
// set, macro, call, filter, with, break/continue, raw, generation) and the
// whole expression grammar. include/import/extends/block are refused:
// transformers renders a template on its own, without a loader.
#pragma once

#include <string_view>

#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"

namespace m40::chat::jinja {

// Nesting deeper than this (brackets, operators, blocks) is a syntax error
// rather than a risk to the stack.
inline constexpr int kMaxParseDepth = 200;
// Expression trees higher than this (a long chain `a + b + c + ...` builds
// one without nesting in the source) are refused too.
inline constexpr int kMaxExprDepth = 400;

// Throws TemplateSyntaxError with the line and column of the offending token.
Template parse(std::string_view source, const LexOptions& options = {});

}  // namespace m40::chat::jinja

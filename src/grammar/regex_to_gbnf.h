// JSON schema `pattern` (a subset of ECMAScript regular expressions) -> GBNF
// for the JSON string literal whose decoded value the pattern matches.
#pragma once

#include <string>
#include <string_view>

namespace m40::grammar::detail {

// Supported: literals, escapes (\d \w \s and their negations, \n \t \r \f \v
// \0 \xHH \uHHHH \u{H...}, escaped punctuation), classes [a-z] [^...], `.`,
// groups ( ) (?: ) (?<name> ), `|`, quantifiers ? * + {m} {m,} {m,n} (lazy
// forms too: same language), ^ at the start and $ at the end. A side without
// its anchor matches any text there, as in JSON Schema. Characters JSON must
// escape (", \, control characters) are matched in their escaped form.
// `any_char` is the name of a rule matching one JSON-encoded character.
// Throws GrammarError naming the unsupported feature (lookaround,
// backreferences, \b, \p{...}, anchors elsewhere) or the syntax error.
std::string pattern_to_gbnf(std::string_view pattern, const std::string& any_char);

}  // namespace m40::grammar::detail

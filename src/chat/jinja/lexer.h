// Jinja2 lexer: template text into data and tag tokens, with Jinja2's
// whitespace control (`-` and `+` in delimiters, trim_blocks, lstrip_blocks,
// newline normalization and the dropped trailing newline).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace m40::chat::jinja {

enum class TokenType {
  Data,           // literal text between tags
  VariableBegin,  // {{
  VariableEnd,    // }}
  BlockBegin,     // {%
  BlockEnd,       // %}
  Name,
  String,  // text holds the unescaped value
  Integer,
  Float,
  Operator,  // text holds the operator: + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . : | , ;
  End,
};

struct Token {
  TokenType type = TokenType::End;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
  int column = 1;
};

// transformers renders with trim_blocks and lstrip_blocks on and
// keep_trailing_newline off; these are the defaults.
struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateSyntaxError (with line and column) on text that is not
// valid Jinja at the token level.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options = {});

}  // namespace m40::chat::jinja

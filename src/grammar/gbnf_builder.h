// Writing GBNF: a collection of named rules, JSON schemas compiled into it
// under unique rule names, and the common JSON grammars.
//
//   GbnfBuilder b;
//   std::string answer = b.add_json_schema(schema, "answer");
//   std::string text = b.build("\"Answer: \" " + answer);   // root ::= "Answer: " answer
//
// JSON values follow llama.cpp's whitespace convention: optional limited
// whitespace (`space ::= | " " | "\n"{1,2} [ \t]{0,20}`) between tokens, none
// before or after the whole value.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace m40::grammar {

namespace detail {
class SchemaCompiler;
}

class GbnfBuilder {
 public:
  // Compiles a JSON schema; returns the name of the rule that matches one
  // JSON value of it. Throws GrammarError naming the keyword (and where in
  // the schema) for what it cannot express. See docs/grammar.md for coverage.
  std::string add_json_schema(const nlohmann::ordered_json& schema, std::string_view name_hint = "value");
  // Adds a rule `name ::= body` (body: GBNF on one line); returns the name
  // actually used: name_hint made a valid name, with a number appended when a
  // different rule has it. Adding the same name and body again returns the
  // existing rule.
  std::string add_rule(std::string_view name_hint, std::string_view body);
  // The whole grammar text, with `root ::= root_body` first.
  std::string build(std::string_view root_body) const;

 private:
  friend class detail::SchemaCompiler;

  // A unique name whose body comes later (for recursive rules).
  std::string reserve_rule(std::string_view name_hint);
  void define_rule(const std::string& name, std::string body);

  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string, std::less<>> primitives_;  // JSON building blocks -> rule name
};

// The grammar whose root is one JSON value of `schema`.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// Any JSON object (OpenAI response_format json_object, Ollama format "json").
std::string json_object_gbnf();
// A GBNF string literal matching exactly `text` (quoted, escaped). Throws
// GrammarError if text is not valid UTF-8.
std::string gbnf_literal(std::string_view text);

}  // namespace m40::grammar

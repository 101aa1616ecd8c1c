// JSON schema -> GBNF rules in a GbnfBuilder (GbnfBuilder::add_json_schema).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "grammar/gbnf_builder.h"

namespace m40::grammar::detail {

class SchemaCompiler {
 public:
  SchemaCompiler(GbnfBuilder& builder, const nlohmann::ordered_json& document);
  // The rule matching one JSON value of the document's root schema.
  std::string compile(std::string_view name_hint);

  // The shared JSON building blocks ("space", "char", "string", "number",
  // "integer", "boolean", "null", "value", "object", "array"), added to the
  // builder on first use.
  static std::string primitive(GbnfBuilder& builder, std::string_view which);

 private:
  using json = nlohmann::ordered_json;

  std::string visit(const json& schema, const std::string& name, const std::string& path);
  std::string visit_typed(const json& schema, const std::string& type, const std::string& name, const std::string& path);
  std::string object_rule(const json& schema, const std::string& name, const std::string& path);
  std::string array_rule(const json& schema, const std::string& name, const std::string& path);
  std::string string_rule(const json& schema, const std::string& name, const std::string& path);
  std::string integer_rule(const json& schema, const std::string& name, const std::string& path);
  std::string number_rule(const json& schema, const std::string& name, const std::string& path);
  std::string ref_rule(const std::string& ref, const std::string& path);
  const json& resolve_ref(const std::string& ref, const std::string& path) const;
  // The schema with its $ref (if any) replaced by the target merged in.
  json without_ref(const json& schema, const std::string& path, int depth);
  json merge(json into, const json& other, const std::string& path);
  std::string prim(std::string_view which) { return primitive(builder_, which); }

  GbnfBuilder& builder_;
  const json& document_;
  std::map<std::string, std::string> ref_rules_;
  int depth_ = 0;
};

}  // namespace m40::grammar::detail

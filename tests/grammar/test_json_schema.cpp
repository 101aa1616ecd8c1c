// The JSON schema compiler, keyword by keyword: texts each schema must
// accept and must refuse (checked with the compiled grammar), recursion
// through $ref, and the refusal of what it cannot express.
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace m40::grammar {
namespace {

using json = nlohmann::ordered_json;

// Checks every text against the schema's grammar.
void expect_schema(const char* schema, std::initializer_list<const char*> accepted,
                   std::initializer_list<const char*> refused) {
  SCOPED_TRACE(schema);
  std::shared_ptr<const Grammar> g;
  ASSERT_NO_THROW(g = parse_gbnf(json_schema_to_gbnf(json::parse(schema)))) << json_schema_to_gbnf(json::parse(schema));
  for (const char* text : accepted) EXPECT_TRUE(GrammarMatcher::matches(g, text)) << "should accept: " << text;
  for (const char* text : refused) EXPECT_FALSE(GrammarMatcher::matches(g, text)) << "should refuse: " << text;
}

std::string error_of(const char* schema) {
  try {
    json_schema_to_gbnf(json::parse(schema));
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JsonSchema, PrimitiveTypes) {
  expect_schema(R"({"type": "string"})", {R"("")", R"("hi")", R"("a\"b\\c\n\u00e9")", "\"héllo 世界\""},
                {R"(hi)", R"("a"b")", "\"a\nb\"", R"("\x")", R"("\u12")"});
  expect_schema(R"({"type": "integer"})", {"0", "-7", "1234567890123456"}, {"01", "-0.5", "1e3", "+1", "12345678901234567", "-"});
  expect_schema(R"({"type": "number"})", {"0", "-1.5", "3.25e-10", "1E+3", "42"}, {".5", "1.", "--1", "1e", "0x10"});
  expect_schema(R"({"type": "boolean"})", {"true", "false"}, {"True", "1", "null"});
  expect_schema(R"({"type": "null"})", {"null"}, {"nil", "\"null\""});
}

TEST(JsonSchema, TypeLists) {
  expect_schema(R"({"type": ["string", "null"]})", {R"("x")", "null"}, {"1", "true"});
  expect_schema(R"({"type": ["integer", "boolean"], "minimum": 3})", {"3", "99", "true"}, {"2", "null"});
}

TEST(JsonSchema, EmptySchemaAndTrueAreAnyValue) {
  for (const char* schema : {"{}", "true", R"({"description": "anything at all"})"}) {
    expect_schema(schema, {"1", R"("s")", "null", R"({"a": [1, {"b": false}]})", "[]", "{}"}, {"", "nul", "{", "[1,]"});
  }
}

TEST(JsonSchema, ObjectPropertiesInDeclaredOrderWithOptionalOnesOmittable) {
  const char* schema = R"({
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
    "required": ["b"]
  })";
  expect_schema(schema,
                {R"({"b": "x"})", R"({"a": 1, "b": "x"})", R"({"b": "x", "c": true})", R"({"a": 1, "b": "x", "c": false})",
                 "{ \"a\" : 1 ,\n  \"b\" : \"x\" }"},
                {"{}", R"({"a": 1})", R"({"b": "x", "a": 1})", R"({"b": 1})", R"({"b": "x", "d": 1})", R"({"b": "x",})",
                 R"({"b": "x", "b": "y"})"});
}

TEST(JsonSchema, AllPropertiesOptional) {
  const char* schema = R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})";
  expect_schema(schema, {"{}", R"({"a": 1})", R"({"b": 2})", R"({"a": 1, "b": 2})"}, {R"({"b": 2, "a": 1})", R"({"c": 1})", R"({,"a": 1})"});
}

TEST(JsonSchema, RequiredWithoutPropertiesTakesAnyValue) {
  expect_schema(R"({"type": "object", "required": ["id"], "properties": {}})", {R"({"id": [1]})", R"({"id": "x"})"}, {"{}"});
}

TEST(JsonSchema, AdditionalProperties) {
  // Without properties: any object.
  expect_schema(R"({"type": "object"})", {"{}", R"({"x": 1, "y": {"z": []}})"}, {"[]", R"({"x"})"});
  // With properties and nothing said: only those (llama.cpp's reading).
  expect_schema(R"({"type": "object", "properties": {"a": {"type": "integer"}}})", {R"({"a": 1})"}, {R"({"a": 1, "b": 2})"});
  // false: only the declared ones.
  expect_schema(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false})", {R"({"a": 1})", "{}"},
                {R"({"b": 1})"});
  // true: others after the declared ones, with any value, under other names.
  expect_schema(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true})",
                {R"({"a": 1, "b": [true]})", R"({"zz": null})", R"({"ab": 1})", R"({"": 1})"}, {R"({"a": "x"})", R"({"b": 1, "a": 1})"});
  // A schema: their values must match it.
  expect_schema(R"({"type": "object", "additionalProperties": {"type": "integer"}})", {R"({"x": 1, "y": 2})", "{}"}, {R"({"x": "1"})"});
}

TEST(JsonSchema, EnumAndConst) {
  expect_schema(R"({"enum": ["red", "green", 3, null, {"k": [1]}]})", {R"("red")", R"("green")", "3", "null", R"({"k":[1]})"},
                {R"("blue")", "4", R"("Red")"});
  expect_schema(R"({"type": "string", "enum": ["a", 1]})", {R"("a")"}, {"1"});  // values of another type are dropped
  expect_schema(R"({"const": "fixed"})", {R"("fixed")"}, {R"("other")"});
  expect_schema(R"({"const": 42})", {"42"}, {"42.0", "43"});
}

TEST(JsonSchema, ArraysItemsAndLengths) {
  expect_schema(R"({"type": "array", "items": {"type": "integer"}})", {"[]", "[1]", "[1, 2, 3]", "[ 1 ,2 ]"}, {"[1,]", "[\"a\"]", "[,1]"});
  expect_schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})", {"[1, 2]", "[1, 2, 3]"},
                {"[]", "[1]", "[1, 2, 3, 4]"});
  expect_schema(R"({"type": "array", "maxItems": 0})", {"[]"}, {"[1]"});
  expect_schema(R"({"type": "array", "minItems": 1})", {R"([1, "a", null])"}, {"[]"});
}

TEST(JsonSchema, TuplesWithPrefixItems) {
  expect_schema(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
                {"[]", R"(["a"])", R"(["a", 1])"}, {R"([1])", R"(["a", 1, 2])", R"(["a", "b"])"});
  expect_schema(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2, "items": {"type": "boolean"}})",
                {R"(["a", 1])", R"(["a", 1, true, false])"}, {R"(["a"])", R"(["a", 1, 2])"});
  // The older form: items as a list, additionalItems for the rest.
  expect_schema(R"({"type": "array", "items": [{"const": 1}, {"const": 2}], "additionalItems": false, "minItems": 2})", {"[1, 2]"},
                {"[1]", "[1, 2, 3]", "[2, 1]"});
}

TEST(JsonSchema, NestedObjectsAndArrays) {
  const char* schema = R"({
    "type": "object",
    "properties": {
      "user": {"type": "object", "properties": {"id": {"type": "integer"}, "roles": {"type": "array", "items": {"enum": ["r", "w"]}}},
               "required": ["id", "roles"]}
    },
    "required": ["user"]
  })";
  expect_schema(schema, {R"({"user": {"id": 1, "roles": ["r", "w"]}})", R"({"user": {"id": 1, "roles": []}})"},
                {R"({"user": {"id": 1}})", R"({"user": {"id": 1, "roles": ["x"]}})"});
}

TEST(JsonSchema, AnyOfAndOneOf) {
  expect_schema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})", {"1", R"("ab")"}, {R"("abc")", "true"});
  expect_schema(R"({"oneOf": [{"const": "a"}, {"const": "b"}]})", {R"("a")", R"("b")"}, {R"("c")"});
  // Keywords beside anyOf apply to every alternative.
  expect_schema(R"({"type": "object", "properties": {"k": {"type": "integer"}}, "anyOf": [{"required": ["k"]}, {"properties": {"j": {"type": "null"}}, "required": ["j"]}]})",
                {R"({"k": 1})", R"({"k": 1, "j": null})", R"({"j": null})"}, {"{}"});
}

TEST(JsonSchema, AllOfMergesObjects) {
  const char* schema = R"({
    "allOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"properties": {"b": {"type": "string"}}, "required": ["b"]},
      {"properties": {"a": {"minimum": 5}}}
    ]
  })";
  expect_schema(schema, {R"({"a": 5, "b": "x"})"}, {R"({"a": 4, "b": "x"})", R"({"a": 5})", R"({"b": "x"})"});
  // A single member with a reference (how pydantic attaches a description).
  expect_schema(R"({"$defs": {"c": {"enum": ["x", "y"]}}, "allOf": [{"$ref": "#/$defs/c"}], "description": "a colour"})", {R"("x")"},
                {R"("z")"});
}

TEST(JsonSchema, RefsToDefsAndDefinitions) {
  expect_schema(R"({"$defs": {"id": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/$defs/id"}})",
                {"[1, 2]"}, {"[0]"});
  expect_schema(R"({"definitions": {"s": {"type": "string"}}, "type": "object", "properties": {"n": {"$ref": "#/definitions/s"}}, "required": ["n"]})",
                {R"({"n": "x"})"}, {R"({"n": 1})"});
}

TEST(JsonSchema, RecursiveRefs) {
  const char* schema = R"({
    "$defs": {"tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}, "required": ["kids"]}},
    "$ref": "#/$defs/tree"
  })";
  expect_schema(schema, {R"({"kids": []})", R"({"kids": [{"kids": [{"kids": []}]}, {"kids": []}]})"}, {R"({"kids": [{}]})", "{}"});
  // "#" is the whole schema.
  expect_schema(R"({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}})", {"[1, [2, [3]], []]"}, {"[1, [\"a\"]]"});
}

TEST(JsonSchema, StringLengths) {
  expect_schema(R"({"type": "string", "minLength": 2, "maxLength": 3})", {R"("ab")", R"("abc")", R"("é世")", R"("a\nb")"},
                {R"("a")", R"("abcd")"});
  expect_schema(R"({"type": "string", "minLength": 1})", {R"("x")", R"("xyzxyz")"}, {R"("")"});
}

TEST(JsonSchema, StringFormats) {
  expect_schema(R"({"type": "string", "format": "date"})", {R"("2024-02-29")"}, {R"("2024-2-29")", R"("2024-13-01")", R"("2024-01-32")"});
  expect_schema(R"({"type": "string", "format": "time"})", {R"("23:59:60Z")", R"("08:30:00.123+02:00")"}, {R"("24:00:00Z")", R"("08:30")"});
  expect_schema(R"({"type": "string", "format": "date-time"})", {R"("2024-02-29T08:30:00Z")", R"("2024-02-29t08:30:00-05:00")"},
                {R"("2024-02-29")", R"("2024-02-29T08:30:00")"});
  expect_schema(R"({"type": "string", "format": "uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
                {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  expect_schema(R"({"type": "string", "format": "email"})", {R"("a.b+c@example.co.uk")"}, {R"("no-at-sign")", R"("a@b")"});
  expect_schema(R"({"type": "string", "format": "ipv4"})", {R"("192.168.0.255")"}, {R"("256.1.1.1")", R"("1.2.3")"});
  // Other formats are annotations: any string.
  expect_schema(R"({"type": "string", "format": "hostname"})", {R"("anything goes")"}, {"1"});
}

TEST(JsonSchema, StringPatterns) {
  expect_schema(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})", {R"("AB-123")"}, {R"("AB-12")", R"("ab-123")", R"("AB-1234")"});
  expect_schema(R"({"type": "string", "pattern": "^(cat|dog)s?$"})", {R"("cat")", R"("dogs")"}, {R"("cow")", R"("catss")"});
  expect_schema(R"({"type": "string", "pattern": "^a.c$"})", {R"("abc")", R"("a\"c")", R"("aéc")"}, {R"("a\nc")", R"("ac")"});
  expect_schema(R"({"type": "string", "pattern": "^[^0-9]+(x|y)?$"})", {R"("abc")", R"("abx")"}, {R"("a1")"});
  // Without anchors a pattern may match anywhere in the string.
  expect_schema(R"({"type": "string", "pattern": "\\d+"})", {R"("abc123def")", R"("7")"}, {R"("abc")"});
  expect_schema(R"({"type": "string", "pattern": "^\\w+@\\w+\\.com$"})", {R"("joe@mail.com")"}, {R"("joe@mail.org")"});
  // Characters JSON escapes are matched escaped.
  expect_schema(R"({"type": "string", "pattern": "^a\"b\\\\c$"})", {R"("a\"b\\c")"}, {R"("a"b\c")"});
}

TEST(JsonSchema, IntegerRanges) {
  expect_schema(R"({"type": "integer", "minimum": 0})", {"0", "7", "1234567"}, {"-1", "-0"});
  expect_schema(R"({"type": "integer", "minimum": 1, "maximum": 12})", {"1", "9", "10", "12"}, {"0", "13", "01", "100"});
  expect_schema(R"({"type": "integer", "minimum": -20, "maximum": -3})", {"-20", "-3", "-15"}, {"-2", "-21", "0", "3"});
  expect_schema(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100})", {"1", "99"}, {"0", "100"});
  expect_schema(R"({"type": "integer", "maximum": 5})", {"5", "0", "-123456"}, {"6", "50"});
  expect_schema(R"({"type": "integer", "minimum": 995, "maximum": 1005})", {"995", "999", "1000", "1005"}, {"994", "1006", "99"});
  // Every value in a range, and its neighbours.
  auto g = parse_gbnf(json_schema_to_gbnf(json::parse(R"({"type": "integer", "minimum": -37, "maximum": 1250})")));
  for (int v = -60; v <= 1300; ++v) {
    EXPECT_EQ(GrammarMatcher::matches(g, std::to_string(v)), v >= -37 && v <= 1250) << v;
  }
}

TEST(JsonSchema, NumberBounds) {
  expect_schema(R"({"type": "number", "minimum": 0, "maximum": 1})", {"0", "0.25", "1", "1.000"}, {"1.5", "-0.1", "2", "1.01"});
  expect_schema(R"({"type": "number", "minimum": 0})", {"0", "12.5", "1000000"}, {"-1", "-0.5"});
  expect_schema(R"({"type": "number", "exclusiveMinimum": 0})", {"0.5", "3"}, {"0", "0.0", "-1"});
  expect_schema(R"({"type": "number", "maximum": 10})", {"10", "-5.5", "9.99"}, {"10.5", "11"});
  EXPECT_NE(error_of(R"({"type": "number", "minimum": 0.5})").find("'minimum' on a number must be a whole number"), std::string::npos);
}

TEST(JsonSchema, Nullable) {
  expect_schema(R"({"type": "string", "nullable": true})", {R"("x")", "null"}, {"1"});
}

TEST(JsonSchema, DescriptiveKeywordsAreIgnored) {
  expect_schema(R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "$comment": "c", "title": "T",
                    "description": "D", "examples": [1], "default": 2, "type": "integer", "deprecated": false})",
                {"1"}, {"\"1\""});
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedByName) {
  EXPECT_EQ(error_of(R"({"not": {"type": "string"}})"), "JSON schema at '#': unsupported keyword 'not'");
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}})"),
            "JSON schema at '/properties/a': unsupported keyword 'multipleOf'");
  EXPECT_EQ(error_of(R"({"type": "object", "patternProperties": {"^x": {}}})"), "JSON schema at '#': unsupported keyword 'patternProperties'");
  EXPECT_EQ(error_of(R"({"type": "array", "uniqueItems": true})"), "JSON schema at '#': unsupported keyword 'uniqueItems'");
  EXPECT_EQ(error_of(R"({"type": "object", "minProperties": 1})"), "JSON schema at '#': unsupported keyword 'minProperties'");
  EXPECT_EQ(error_of(R"({"if": {}, "then": {}})"), "JSON schema at '#': unsupported keyword 'if'");
  EXPECT_NE(error_of(R"({"$ref": "https://example.com/s.json"})").find("only references within it"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref": "#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "pattern": "^(?=a)b$"})").find("lookaround"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "pattern": "^(a)\\1$"})").find("backreferences"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "pattern": "\\bword"})").find("word boundary"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "pattern": "a^b"})").find("an anchor inside the pattern"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "frob"})").find("unknown type 'frob'"), std::string::npos);
  EXPECT_NE(error_of("false").find("matches nothing"), std::string::npos);
  // uniqueItems: false changes nothing and is accepted.
  EXPECT_EQ(error_of(R"({"type": "array", "uniqueItems": false})"), "(no error)");
}

TEST(GbnfBuilder, RulesGetUniqueValidNames) {
  GbnfBuilder b;
  EXPECT_EQ(b.add_rule("my rule!", R"("a")"), "my-rule");
  EXPECT_EQ(b.add_rule("my rule!", R"("a")"), "my-rule");  // the same rule again
  EXPECT_EQ(b.add_rule("my-rule", R"("b")"), "my-rule-2");
  EXPECT_EQ(b.add_rule("root", R"("c")"), "root-2");       // root is build()'s
  EXPECT_EQ(b.add_rule("", R"("d")"), "rule");
  const std::string text = b.build("my-rule my-rule-2");
  EXPECT_EQ(text.rfind("root ::= my-rule my-rule-2\n", 0), 0u) << text;
  EXPECT_TRUE(test::matches(text, "ab"));
}

TEST(GbnfBuilder, SchemasAndHandWrittenRulesCombine) {
  GbnfBuilder b;
  const std::string answer = b.add_json_schema(json::parse(R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})"),
                                               "answer");
  const std::string count = b.add_json_schema(json::parse(R"({"type": "integer", "minimum": 0})"), "count");
  const std::string text = b.build(gbnf_literal("Answer: ") + " " + answer + " " + gbnf_literal("\n") + " " + count);
  EXPECT_TRUE(test::matches(text, "Answer: {\"ok\": true}\n3")) << text;
  EXPECT_FALSE(test::matches(text, "Answer: {\"ok\": 1}\n3")) << text;
}

TEST(GbnfBuilder, LiteralsAreEscaped) {
  EXPECT_EQ(gbnf_literal("a\"b\\c\nd\te\x01 é"), R"("a\"b\\c\nd\te\x01 é")");
  for (const char* text : {"plain", "quote \" and \\ backslash", "tab\tnewline\n", "控制\x7F", ""}) {
    EXPECT_TRUE(test::matches("root ::= " + gbnf_literal(text), text)) << text;
  }
  EXPECT_THROW(gbnf_literal("\xC3"), GrammarError);
}

TEST(GbnfBuilder, JsonObjectGrammar) {
  const std::string text = json_object_gbnf();
  for (const char* ok : {"{}", R"({"a": 1})", "{ \"a\" : [1, 2.5e3, \"x\", null, true, {\"b\": {}}] }", "{\n  \"k\": \"v\"\n}"}) {
    EXPECT_TRUE(test::matches(text, ok)) << ok;
  }
  for (const char* bad : {"[]", "1", R"({"a" 1})", R"({a: 1})", R"({"a": 1,})", " {}", "{} "}) {
    EXPECT_FALSE(test::matches(text, bad)) << bad;
  }
}

}  // namespace
}  // namespace m40::grammar

// What each JSON schema keyword becomes. The shapes follow llama.cpp's
// json-schema-to-grammar (the same whitespace rule, properties in declared
// order, $ref targets as named rules so they may recurse), written anew with
// these differences: optional properties may be left out anywhere (not only
// after the required ones), keywords that would change the accepted set are
// refused rather than ignored, and `pattern` is matched on the decoded string.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/regex_to_gbnf.h"

namespace m40::grammar::detail {

namespace {

using json = nlohmann::ordered_json;

// Annotations: they describe, they do not constrain.
const std::set<std::string, std::less<>> kAnnotations = {
    "title",        "description",     "examples",         "example",       "default",   "$schema",
    "$id",          "$comment",        "$anchor",          "$dynamicAnchor", "$vocabulary", "deprecated",
    "readOnly",     "writeOnly",       "$defs",            "definitions",   "contentEncoding",
    "contentMediaType", "contentSchema", "discriminator",  "xml",           "externalDocs", "propertyOrdering",
};

// Assertions this compiler cannot express: refused by name.
const std::set<std::string, std::less<>> kRefused = {
    "not",           "if",            "then",        "else",        "dependentRequired", "dependentSchemas",
    "dependencies",  "patternProperties", "propertyNames", "minProperties", "maxProperties", "multipleOf",
    "contains",      "minContains",   "maxContains", "$dynamicRef", "$recursiveRef",
};

const std::set<std::string, std::less<>> kTypes = {"null", "boolean", "object", "array", "string", "number", "integer"};

constexpr int64_t kMaxMagnitude = 9999999999999999;  // 16 digits, as the unbounded integer rule allows

std::string sanitize(std::string_view name) {
  std::string out;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw GrammarError("JSON schema at '" + (path.empty() ? std::string("#") : path) + "': " + what);
}

std::string json_literal(const json& value, const std::string& path) {
  try {
    return gbnf_literal(value.dump());
  } catch (const json::exception& e) {
    fail(path, std::string("cannot write the value: ") + e.what());
  }
}

bool value_has_type(const json& v, const std::string& type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  return false;
}

// The types a schema allows: its "type", else what its keywords imply
// (empty: any).
std::vector<std::string> schema_types(const json& s, const std::string& path) {
  std::vector<std::string> types;
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array()) {
      for (const json& e : t) {
        if (!e.is_string()) fail(path, "'type' must be a string or a list of strings");
        types.push_back(e.get<std::string>());
      }
    } else {
      fail(path, "'type' must be a string or a list of strings");
    }
    for (const std::string& name : types) {
      if (!kTypes.count(name)) fail(path, "unknown type '" + name + "'");
    }
    return types;
  }
  auto any_of = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
  };
  if (any_of({"properties", "required", "additionalProperties"})) types.push_back("object");
  if (any_of({"items", "prefixItems", "minItems", "maxItems", "additionalItems"})) types.push_back("array");
  if (any_of({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
  if (any_of({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
  return types;
}

// The constraining part of a schema (annotations dropped).
json constraints(const json& s) {
  json out = json::object();
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (!kAnnotations.count(it.key())) out[it.key()] = it.value();
  }
  return out;
}

// --- integers as digit patterns -------------------------------------------

int digit_count(uint64_t v) { return v < 10 ? 1 : 1 + digit_count(v / 10); }

uint64_t pow10(int n) {
  uint64_t v = 1;
  while (n-- > 0) v *= 10;
  return v;
}

// Decimal strings of equal length from x to y (x <= y), leading zeros allowed.
std::string same_length_range(const std::string& x, const std::string& y) {
  if (x.empty()) return "";
  size_t i = 0;
  while (i < x.size() && x[i] == y[i]) ++i;
  std::string prefix = i > 0 ? "\"" + x.substr(0, i) + "\"" : "";
  if (i == x.size()) return prefix;
  const std::string xr = x.substr(i + 1), yr = y.substr(i + 1);
  const size_t n = xr.size();
  auto digit_class = [](char lo, char hi) {
    return lo == hi ? "[" + std::string(1, lo) + "]" : "[" + std::string(1, lo) + "-" + std::string(1, hi) + "]";
  };
  auto any_digits = [&]() { return n == 0 ? std::string() : " [0-9]{" + std::to_string(n) + "}"; };
  const bool x_rest_zero = xr.find_first_not_of('0') == std::string::npos;
  const bool y_rest_nine = yr.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  char mid_lo = x[i], mid_hi = y[i];
  if (!x_rest_zero) {
    alts.push_back("[" + std::string(1, x[i]) + "] (" + same_length_range(xr, std::string(n, '9')) + ")");
    ++mid_lo;
  }
  if (!y_rest_nine) --mid_hi;
  if (mid_lo <= mid_hi) alts.push_back(digit_class(mid_lo, mid_hi) + any_digits());
  if (!y_rest_nine) alts.push_back("[" + std::string(1, y[i]) + "] (" + same_length_range(std::string(n, '0'), yr) + ")");
  std::string body = alts.size() == 1 ? alts[0] : "(" + join(alts, " | ") + ")";
  return prefix.empty() ? body : prefix + " " + body;
}

// Non-negative integers in [a, b] (b: none for unbounded), no leading zeros.
std::string non_negative_range(uint64_t a, std::optional<uint64_t> b) {
  std::vector<std::string> parts;
  const int last = b ? digit_count(*b) : digit_count(a);
  for (int len = digit_count(a); len <= last; ++len) {
    const uint64_t lo = std::max<uint64_t>(a, len == 1 ? 0 : pow10(len - 1));
    const uint64_t hi = b ? std::min<uint64_t>(*b, pow10(len) - 1) : pow10(len) - 1;
    if (lo <= hi) parts.push_back(same_length_range(std::to_string(lo), std::to_string(hi)));
  }
  if (!b && last < 16) parts.push_back("[1-9] [0-9]{" + std::to_string(last) + ",15}");
  return parts.size() == 1 ? parts[0] : "(" + join(parts, " | ") + ")";
}

std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi, const std::string& path) {
  std::vector<std::string> parts;
  if (!lo || *lo < 0) {
    const int64_t top = hi ? std::min<int64_t>(*hi, -1) : -1;  // the negatives go up to here
    if (!lo) {
      parts.push_back("\"-\" " + non_negative_range(static_cast<uint64_t>(-top), std::nullopt));
    } else if (*lo <= top) {
      parts.push_back("\"-\" " + non_negative_range(static_cast<uint64_t>(-top), static_cast<uint64_t>(-*lo)));
    }
  }
  if (!hi || *hi >= 0) {
    const uint64_t from = lo ? static_cast<uint64_t>(std::max<int64_t>(*lo, 0)) : 0;
    if (!hi) {
      parts.push_back(non_negative_range(from, std::nullopt));
    } else if (static_cast<int64_t>(from) <= *hi) {
      parts.push_back(non_negative_range(from, static_cast<uint64_t>(*hi)));
    }
  }
  if (parts.empty()) fail(path, "the bounds leave no integer");
  return parts.size() == 1 ? parts[0] : "(" + join(parts, " | ") + ")";
}

// A numeric bound as a clamped integer: `round_up` for lower bounds.
std::optional<int64_t> integer_bound(const json& v, bool round_up, const std::string& path, const char* key) {
  if (!v.is_number()) fail(path, std::string("'") + key + "' must be a number");
  const double d = v.get<double>();
  if (std::abs(d) > static_cast<double>(kMaxMagnitude)) return std::nullopt;  // beyond 16 digits: no limit left
  if (v.is_number_integer()) return v.get<int64_t>();
  return static_cast<int64_t>(round_up ? std::ceil(d) : std::floor(d));
}

// A JSON string (with quotes) whose content is none of `names`.
std::string not_strings(const std::vector<std::string>& names, const std::string& char_rule, const std::string& path) {
  struct Node {
    std::map<char, Node> children;
    bool end = false;
  };
  Node root;
  for (const std::string& n : names) {
    for (char c : n) {
      const auto b = static_cast<uint8_t>(c);
      if (c == '"' || c == '\\' || b < 0x20 || b >= 0x80) {
        fail(path, "additional properties next to a property name with non-ASCII or escaped characters are not supported");
      }
    }
    Node* node = &root;
    for (char c : n) node = &node->children[c];
    node->end = true;
  }
  std::function<std::string(const Node&)> visit = [&](const Node& node) {
    std::vector<std::string> alts;
    std::string excluded;
    for (const auto& [c, child] : node.children) {
      excluded += std::string(1, c);
      const std::string lit = gbnf_literal(std::string(1, c));
      if (child.children.empty()) {
        alts.push_back(lit + " " + char_rule + "+");
      } else {
        const std::string inner = visit(child);
        alts.push_back(lit + " " + (child.end ? "(" + inner + ")" : "(" + inner + ")?"));
      }
    }
    std::string cls = "[^\"\\\\\\x00-\\x1F\\x7F";
    for (char c : excluded) {
      if (c == ']' || c == '-' || c == '^' || c == '[') {
        cls += "\\x" + std::string(1, "0123456789ABCDEF"[static_cast<uint8_t>(c) >> 4]) +
               std::string(1, "0123456789ABCDEF"[c & 15]);
      } else {
        cls += c;
      }
    }
    cls += "]";
    alts.push_back(cls + " " + char_rule + "*");
    alts.push_back("\"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) " + char_rule + "*");
    return join(alts, " | ");
  };
  const std::string body = visit(root);
  return "\"\\\"\" " + (root.end ? "(" + body + ")" : "(" + body + ")?") + " \"\\\"\"";
}

// Shared string formats: the text inside the quotes.
const std::map<std::string, std::string, std::less<>> kFormats = {
    {"date", R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))"},
    {"time",
     R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" ([0-5] [0-9] | "60") ("." [0-9]{1,9})? ([Zz] | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
    {"uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
    // Plausible addresses, not RFC 5322: a local part, @, dotted domain labels.
    {"email", R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+ ("." [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)* "@" [A-Za-z0-9] [A-Za-z0-9-]* ("." [A-Za-z0-9] [A-Za-z0-9-]*)+)"},
};

}  // namespace

SchemaCompiler::SchemaCompiler(GbnfBuilder& builder, const json& document) : builder_(builder), document_(document) {}

std::string SchemaCompiler::primitive(GbnfBuilder& b, std::string_view which) {
  if (auto it = b.primitives_.find(which); it != b.primitives_.end()) return it->second;
  std::string name;
  auto p = [&](std::string_view w) { return primitive(b, w); };
  if (which == "space") {
    name = b.add_rule("space", R"(| " " | "\n"{1,2} [ \t]{0,20})");
  } else if (which == "char") {
    name = b.add_rule("char", R"([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))");
  } else if (which == "string") {
    name = b.add_rule("string", "\"\\\"\" " + p("char") + "* \"\\\"\"");
  } else if (which == "integral-part") {
    name = b.add_rule("integral-part", "[0] | [1-9] [0-9]{0,15}");
  } else if (which == "number") {
    const std::string ip = p("integral-part");
    name = b.add_rule("number", "\"-\"? " + ip + " (\".\" [0-9]{1,16})? ([eE] [-+]? " + ip + ")?");
  } else if (which == "integer") {
    name = b.add_rule("integer", "\"-\"? " + p("integral-part"));
  } else if (which == "boolean") {
    name = b.add_rule("boolean", "\"true\" | \"false\"");
  } else if (which == "null") {
    name = b.add_rule("null", "\"null\"");
  } else if (which == "ipv4-octet") {
    name = b.add_rule("ipv4-octet", R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])");
  } else if (which == "value" || which == "object" || which == "array") {
    // Mutually recursive: names first, then bodies.
    const std::string value = b.reserve_rule("value");
    const std::string object = b.reserve_rule("object");
    const std::string array = b.reserve_rule("array");
    b.primitives_["value"] = value;
    b.primitives_["object"] = object;
    b.primitives_["array"] = array;
    const std::string sp = p("space"), str = p("string");
    b.define_rule(value, object + " | " + array + " | " + str + " | " + p("number") + " | " + p("boolean") + " | " + p("null"));
    b.define_rule(object, "\"{\" " + sp + " (" + str + " " + sp + " \":\" " + sp + " " + value + " (" + sp + " \",\" " + sp +
                              " " + str + " " + sp + " \":\" " + sp + " " + value + ")* " + sp + ")? \"}\"");
    b.define_rule(array, "\"[\" " + sp + " (" + value + " (" + sp + " \",\" " + sp + " " + value + ")* " + sp + ")? \"]\"");
    return b.primitives_.at(std::string(which));
  } else {
    throw GrammarError("no JSON building block named '" + std::string(which) + "'");
  }
  b.primitives_[std::string(which)] = name;
  return name;
}

std::string SchemaCompiler::compile(std::string_view name_hint) {
  std::string name = sanitize(name_hint);
  if (name.empty()) name = "value";
  return visit(document_, name, "");
}

const SchemaCompiler::json& SchemaCompiler::resolve_ref(const std::string& ref, const std::string& path) const {
  if (ref.empty() || ref[0] != '#') {
    fail(path, "$ref '" + ref + "' points outside the schema; only references within it (#/$defs/...) are supported");
  }
  try {
    const json::json_pointer pointer(ref.substr(1));
    if (!document_.contains(pointer)) fail(path, "$ref '" + ref + "' does not resolve to anything in the schema");
    return document_.at(pointer);
  } catch (const json::exception&) {
    fail(path, "$ref '" + ref + "' is not a valid JSON pointer");
  }
}

std::string SchemaCompiler::ref_rule(const std::string& ref, const std::string& path) {
  if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return it->second;
  const json& target = resolve_ref(ref, path);
  std::string hint = "ref";
  if (const size_t slash = ref.rfind('/'); slash != std::string::npos && slash + 1 < ref.size()) {
    hint = sanitize(ref.substr(slash + 1));
    if (hint.empty()) hint = "ref";
  }
  const std::string name = builder_.reserve_rule(hint);
  ref_rules_[ref] = name;
  const std::string body = visit(target, name + "-value", ref);
  builder_.define_rule(name, body);
  return name;
}

SchemaCompiler::json SchemaCompiler::without_ref(const json& schema, const std::string& path, int depth) {
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) fail(path, "the schema `false` matches nothing");
    return json::object();
  }
  if (!schema.is_object()) fail(path, "a schema must be an object or a boolean");
  if (!schema.contains("$ref")) return schema;
  if (depth > 32) fail(path, "$ref chain too long (a reference cycle?)");
  if (!schema["$ref"].is_string()) fail(path, "'$ref' must be a string");
  const std::string ref = schema["$ref"].get<std::string>();
  json rest = schema;
  rest.erase("$ref");
  return merge(without_ref(resolve_ref(ref, path), ref, depth + 1), rest, path);
}

SchemaCompiler::json SchemaCompiler::merge(json into, const json& other_in, const std::string& path) {
  const json other = without_ref(other_in, path, 0);
  for (auto it = other.begin(); it != other.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (kAnnotations.count(key)) continue;
    if (!into.contains(key)) {
      into[key] = v;
      continue;
    }
    json& mine = into[key];
    if (mine == v) continue;
    if (key == "properties") {
      for (auto p = v.begin(); p != v.end(); ++p) {
        if (mine.contains(p.key())) {
          mine[p.key()] = json{{"allOf", json::array({mine[p.key()], p.value()})}};
        } else {
          mine[p.key()] = p.value();
        }
      }
    } else if (key == "required") {
      for (const json& r : v) {
        if (std::find(mine.begin(), mine.end(), r) == mine.end()) mine.push_back(r);
      }
    } else if (key == "type") {
      auto as_set = [&](const json& t) {
        std::set<std::string> s;
        if (t.is_string()) {
          s.insert(t.get<std::string>());
        } else {
          for (const json& e : t) s.insert(e.get<std::string>());
        }
        return s;
      };
      const auto a = as_set(mine), b = as_set(v);
      json both = json::array();
      for (const std::string& t : a) {
        if (b.count(t) || (t == "integer" && b.count("number"))) both.push_back(t);
        else if (t == "number" && b.count("integer")) both.push_back("integer");
      }
      if (both.empty()) fail(path, "allOf: the types never overlap");
      mine = both.size() == 1 ? both[0] : both;
    } else if (key == "minimum" || key == "minLength" || key == "minItems" || key == "exclusiveMinimum") {
      if (mine.is_number() && v.is_number()) mine = std::max(mine.get<double>(), v.get<double>());
      else fail(path, "allOf: conflicting '" + key + "'");
    } else if (key == "maximum" || key == "maxLength" || key == "maxItems" || key == "exclusiveMaximum") {
      if (mine.is_number() && v.is_number()) mine = std::min(mine.get<double>(), v.get<double>());
      else fail(path, "allOf: conflicting '" + key + "'");
    } else if (key == "enum") {
      json both = json::array();
      for (const json& e : mine) {
        if (std::find(v.begin(), v.end(), e) != v.end()) both.push_back(e);
      }
      mine = both;
    } else if (key == "allOf") {
      for (const json& e : v) mine.push_back(e);
    } else if (key == "anyOf" || key == "oneOf") {
      // (a1 | a2) and (b1 | b2): every pairing.
      json product = json::array();
      for (const json& a : mine) {
        for (const json& b : v) product.push_back(json{{"allOf", json::array({a, b})}});
      }
      if (product.size() > 64) fail(path, "allOf of anyOf lists with too many combinations");
      mine = product;
    } else {
      fail(path, "allOf: conflicting values for '" + key + "'");
    }
  }
  return into;
}

std::string SchemaCompiler::visit(const json& schema, const std::string& name, const std::string& path) {
  struct Depth {
    int& d;
    explicit Depth(int& depth) : d(depth) { ++d; }
    ~Depth() { --d; }
  } guard(depth_);
  if (depth_ > 128) fail(path, "schema nested too deeply");

  if (schema.is_boolean()) {
    if (schema.get<bool>()) return prim("value");
    fail(path, "the schema `false` matches nothing");
  }
  if (!schema.is_object()) fail(path, "a schema must be an object or a boolean");
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string& key = it.key();
    if (kRefused.count(key)) fail(path, "unsupported keyword '" + key + "'");
    if (key == "uniqueItems" && it.value() == true) fail(path, "unsupported keyword 'uniqueItems'");
    if ((key == "unevaluatedProperties" || key == "unevaluatedItems") && it.value() != false) {
      fail(path, "unsupported keyword '" + key + "' (only `false` is supported)");
    }
  }

  if (schema.contains("$ref")) {
    if (!schema["$ref"].is_string()) fail(path, "'$ref' must be a string");
    json rest = constraints(schema);
    rest.erase("$ref");
    if (rest.empty()) return ref_rule(schema["$ref"].get<std::string>(), path);
    return visit(without_ref(schema, path, 0), name, path);
  }
  if (schema.contains("allOf")) {
    if (!schema["allOf"].is_array()) fail(path, "'allOf' must be a list");
    json merged = schema;
    merged.erase("allOf");
    for (const json& member : schema["allOf"]) merged = merge(std::move(merged), member, path + "/allOf");
    return visit(merged, name, path);
  }
  if (schema.contains("anyOf") || schema.contains("oneOf")) {
    // oneOf is read as anyOf: the alternatives of a schema meant for
    // generation are normally exclusive already.
    if (schema.contains("anyOf") && schema.contains("oneOf")) {
      json both = schema;
      both.erase("anyOf");
      both.erase("oneOf");
      both["allOf"] = json::array({json{{"anyOf", schema["anyOf"]}}, json{{"anyOf", schema["oneOf"]}}});
      return visit(both, name, path);
    }
    const char* key = schema.contains("anyOf") ? "anyOf" : "oneOf";
    const json& alts = schema[key];
    if (!alts.is_array() || alts.empty()) fail(path, std::string("'") + key + "' must be a non-empty list");
    json base = constraints(schema);
    base.erase(key);
    std::vector<std::string> rules;
    for (size_t i = 0; i < alts.size(); ++i) {
      const std::string alt_path = path + "/" + key + "/" + std::to_string(i);
      const json alt = base.empty() ? alts[i] : merge(base, alts[i], alt_path);
      rules.push_back(visit(alt, name + "-" + std::to_string(i), alt_path));
    }
    return builder_.add_rule(name, join(rules, " | "));
  }
  if (schema.contains("nullable")) {
    json rest = schema;
    rest.erase("nullable");
    if (schema["nullable"] != true) return visit(rest, name, path);
    return builder_.add_rule(name, visit(rest, name + "-value", path) + " | " + prim("null"));
  }

  const std::vector<std::string> types = schema_types(schema, path);
  if (schema.contains("const")) {
    const json& value = schema["const"];
    if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(value, t); })) {
      fail(path, "'const' does not have the schema's type");
    }
    return builder_.add_rule(name, json_literal(value, path));
  }
  if (schema.contains("enum")) {
    if (!schema["enum"].is_array()) fail(path, "'enum' must be a list");
    std::vector<std::string> alts;
    for (const json& value : schema["enum"]) {
      if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(value, t); })) {
        continue;
      }
      alts.push_back(json_literal(value, path));
    }
    if (alts.empty()) fail(path, "no 'enum' value has the schema's type");
    return builder_.add_rule(name, join(alts, " | "));
  }
  if (types.empty()) return prim("value");
  if (types.size() == 1) return visit_typed(schema, types[0], name, path);
  std::vector<std::string> alts;
  for (const std::string& t : types) alts.push_back(visit_typed(schema, t, name + "-" + t, path));
  return builder_.add_rule(name, join(alts, " | "));
}

std::string SchemaCompiler::visit_typed(const json& schema, const std::string& type, const std::string& name,
                                        const std::string& path) {
  if (type == "null") return prim("null");
  if (type == "boolean") return prim("boolean");
  if (type == "string") return string_rule(schema, name, path);
  if (type == "integer") return integer_rule(schema, name, path);
  if (type == "number") return number_rule(schema, name, path);
  if (type == "object") return object_rule(schema, name, path);
  return array_rule(schema, name, path);
}

std::string SchemaCompiler::object_rule(const json& schema, const std::string& name, const std::string& path) {
  std::vector<std::pair<std::string, json>> props;
  if (schema.contains("properties")) {
    if (!schema["properties"].is_object()) fail(path, "'properties' must be an object");
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) props.emplace_back(it.key(), it.value());
  }
  std::set<std::string> required;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) fail(path, "'required' must be a list of names");
    for (const json& r : schema["required"]) {
      if (!r.is_string()) fail(path, "'required' must be a list of names");
      required.insert(r.get<std::string>());
      // A required name without a declared schema takes any value.
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r.get<std::string>(); })) {
        props.emplace_back(r.get<std::string>(), json::object());
      }
    }
  }
  // llama.cpp's reading of a missing additionalProperties: any object when
  // no properties are declared, only the declared ones otherwise.
  bool additional = props.empty();
  json additional_schema = json::object();
  if (schema.contains("additionalProperties")) {
    const json& ap = schema["additionalProperties"];
    if (ap.is_boolean()) {
      additional = ap.get<bool>();
    } else if (ap.is_object()) {
      additional = true;
      additional_schema = ap;
    } else {
      fail(path, "'additionalProperties' must be a boolean or a schema");
    }
  }

  const std::string sp = prim("space");
  const std::string comma = sp + " \",\" " + sp + " ";
  std::vector<std::string> kv;
  std::vector<bool> is_required;
  for (const auto& [prop, prop_schema] : props) {
    const std::string prop_name = name + "-" + (sanitize(prop).empty() ? std::string("prop") : sanitize(prop));
    const std::string value = visit(prop_schema, prop_name, path + "/properties/" + pointer_token(prop));
    kv.push_back(builder_.add_rule(prop_name + "-kv", json_literal(json(prop), path) + " " + sp + " \":\" " + sp + " " + value));
    is_required.push_back(required.count(prop) > 0);
  }
  std::string additional_kv;
  if (additional) {
    std::vector<std::string> names;
    for (const auto& p : props) names.push_back(p.first);
    const std::string key = names.empty() ? prim("string")
                                          : builder_.add_rule(name + "-additional-key", not_strings(names, prim("char"), path));
    const std::string value = visit(additional_schema, name + "-additional-value", path + "/additionalProperties");
    additional_kv = builder_.add_rule(name + "-additional-kv", key + " " + sp + " \":\" " + sp + " " + value);
  }

  // rest(i): what may follow once something has been written and the
  // properties before i are done; a rule, made when first needed.
  const size_t n = kv.size();
  const std::string additional_tail = additional ? "(" + comma + additional_kv + ")*" : "";
  std::vector<std::string> rest_rules(n + 1);
  std::function<std::string(size_t)> rest = [&](size_t i) -> std::string {
    if (i == n) return additional_tail;
    if (rest_rules[i].empty()) {
      const std::string part = is_required[i] ? comma + kv[i] : "(" + comma + kv[i] + ")?";
      const std::string after = rest(i + 1);
      rest_rules[i] = builder_.add_rule(name + "-rest-" + std::to_string(i), after.empty() ? part : part + " " + after);
    }
    return rest_rules[i];
  };
  // The first property written: any optional one before the first required.
  std::vector<std::string> firsts;
  size_t first_required = n;
  for (size_t j = 0; j < n; ++j) {
    const std::string after = rest(j + 1);
    firsts.push_back(after.empty() ? kv[j] : kv[j] + " " + after);
    if (is_required[j]) {
      first_required = j;
      break;
    }
  }
  if (first_required == n && additional) firsts.push_back(additional_kv + " " + additional_tail);
  std::string body;
  if (firsts.empty()) {
    body = "\"{\" " + sp + " \"}\"";
  } else if (first_required < n) {
    body = "\"{\" " + sp + " (" + join(firsts, " | ") + ") " + sp + " \"}\"";
  } else {
    body = "\"{\" " + sp + " ((" + join(firsts, " | ") + ") " + sp + ")? \"}\"";
  }
  return builder_.add_rule(name, body);
}

std::string SchemaCompiler::array_rule(const json& schema, const std::string& name, const std::string& path) {
  std::vector<std::string> prefix;
  json rest_schema = json::object();  // {} any, null none
  bool rest_allowed = true;
  auto set_rest = [&](const json& s) {
    if (s.is_boolean()) {
      rest_allowed = s.get<bool>();
    } else {
      rest_schema = s;
    }
  };
  if (schema.contains("prefixItems") || (schema.contains("items") && schema["items"].is_array())) {
    const bool modern = schema.contains("prefixItems");
    const json& items = modern ? schema["prefixItems"] : schema["items"];
    if (!items.is_array()) fail(path, "'prefixItems' must be a list of schemas");
    for (size_t i = 0; i < items.size(); ++i) {
      prefix.push_back(visit(items[i], name + "-tuple-" + std::to_string(i), path + (modern ? "/prefixItems/" : "/items/") + std::to_string(i)));
    }
    const char* rest_key = modern ? "items" : "additionalItems";
    if (schema.contains(rest_key)) {
      set_rest(schema[rest_key]);
    } else if (schema.contains("unevaluatedItems")) {
      rest_allowed = false;
    }
  } else if (schema.contains("items")) {
    set_rest(schema["items"]);
  }
  auto count = [&](const char* key, uint64_t fallback) -> uint64_t {
    if (!schema.contains(key)) return fallback;
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(path, std::string("'") + key + "' must be a non-negative integer");
    return v.get<uint64_t>();
  };
  const uint64_t kUnboundedCount = UINT64_MAX;
  const uint64_t min = count("minItems", 0);
  uint64_t max = count("maxItems", kUnboundedCount);
  if (!rest_allowed) max = std::min<uint64_t>(max, prefix.size());
  if (min > max) fail(path, "minItems is above the number of items allowed");
  if (prefix.size() > max) prefix.resize(max);
  const std::string sp = prim("space");
  const std::string comma = sp + " \",\" " + sp + " ";

  const size_t k = prefix.size();
  std::string tail;  // the items after the prefix, each preceded by a comma when something came before
  if (max > k) {
    const std::string item = visit(rest_schema, name + "-item", path + "/items");
    const uint64_t rmin = min > k ? min - k : 0;
    const uint64_t rmax = max == kUnboundedCount ? kUnboundedCount : max - k;
    if (rmax > 100000 && rmax != kUnboundedCount) fail(path, "'maxItems' above 100000 is not supported");
    if (min > 100000) fail(path, "'minItems' above 100000 is not supported");
    auto reps = [&](uint64_t lo, uint64_t hi) {
      if (hi == kUnboundedCount) return lo == 0 ? std::string("*") : lo == 1 ? std::string("+") : "{" + std::to_string(lo) + ",}";
      if (lo == 0 && hi == 1) return std::string("?");
      return "{" + std::to_string(lo) + (lo == hi ? "" : "," + std::to_string(hi)) + "}";
    };
    if (k > 0) {
      tail = "(" + comma + item + ")" + reps(rmin, rmax);
    } else {
      // The first item has no comma before it.
      const uint64_t more_min = rmin > 0 ? rmin - 1 : 0;
      const uint64_t more_max = rmax == kUnboundedCount ? kUnboundedCount : rmax - 1;
      tail = item + (more_max == 0 ? "" : " (" + comma + item + ")" + reps(more_min, more_max));
      if (rmin == 0) tail = "(" + tail + ")?";
    }
  }
  for (size_t i = k; i-- > 0;) {
    std::string cur = (i == 0 ? "" : comma) + prefix[i] + (tail.empty() ? "" : " " + tail);
    tail = i >= min ? "(" + cur + ")?" : cur;
  }
  const std::string body = tail.empty() ? "\"[\" " + sp + " \"]\"" : "\"[\" " + sp + " " + tail + " " + sp + " \"]\"";
  return builder_.add_rule(name, body);
}

std::string SchemaCompiler::string_rule(const json& schema, const std::string& name, const std::string& path) {
  const bool has_length = schema.contains("minLength") || schema.contains("maxLength");
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) fail(path, "'pattern' must be a string");
    if (has_length) fail(path, "'pattern' together with 'minLength'/'maxLength' is not supported");
    return builder_.add_rule(name, pattern_to_gbnf(schema["pattern"].get<std::string>(), prim("char")));
  }
  if (schema.contains("format") && schema["format"].is_string()) {
    std::string format = schema["format"].get<std::string>();
    if (format == "date-time" || format.starts_with("uuid")) format = format == "date-time" ? "date-time" : "uuid";
    // The quotes go in the same rule as the content: a called rule that
    // could end after any letter would leave every token there to be
    // checked against the caller (see docs/grammar.md).
    std::string content;
    if (format == "date-time") {
      content = "(" + kFormats.at("date") + ") [Tt ] (" + kFormats.at("time") + ")";
    } else if (format == "ipv4") {
      const std::string octet = prim("ipv4-octet");
      content = octet + " \".\" " + octet + " \".\" " + octet + " \".\" " + octet;
    } else if (auto it = kFormats.find(format); it != kFormats.end()) {
      content = it->second;
    }
    if (!content.empty()) {
      if (has_length) fail(path, "'format' together with 'minLength'/'maxLength' is not supported");
      return builder_.add_rule(format + "-string", "\"\\\"\" " + content + " \"\\\"\"");
    }
    // Other formats are annotations (JSON Schema's default): any string.
  }
  if (has_length) {
    auto count = [&](const char* key, uint64_t fallback) -> uint64_t {
      if (!schema.contains(key)) return fallback;
      const json& v = schema[key];
      if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(path, std::string("'") + key + "' must be a non-negative integer");
      if (v.get<uint64_t>() > 100000) fail(path, std::string("'") + key + "' above 100000 is not supported");
      return v.get<uint64_t>();
    };
    const uint64_t lo = count("minLength", 0);
    const uint64_t hi = count("maxLength", UINT64_MAX);
    if (lo > hi) fail(path, "minLength is above maxLength");
    const std::string reps = hi == UINT64_MAX ? "{" + std::to_string(lo) + ",}" : "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
    return builder_.add_rule(name, "\"\\\"\" " + prim("char") + reps + " \"\\\"\"");
  }
  return prim("string");
}

std::string SchemaCompiler::integer_rule(const json& schema, const std::string& name, const std::string& path) {
  std::optional<int64_t> lo, hi;
  auto tighten_lo = [&](std::optional<int64_t> v) {
    if (v) lo = lo ? std::max(*lo, *v) : *v;
  };
  auto tighten_hi = [&](std::optional<int64_t> v) {
    if (v) hi = hi ? std::min(*hi, *v) : *v;
  };
  const bool draft4_exclusive_min = schema.contains("exclusiveMinimum") && schema["exclusiveMinimum"].is_boolean();
  const bool draft4_exclusive_max = schema.contains("exclusiveMaximum") && schema["exclusiveMaximum"].is_boolean();
  if (schema.contains("minimum")) {
    auto v = integer_bound(schema["minimum"], true, path, "minimum");
    if (v && draft4_exclusive_min && schema["exclusiveMinimum"] == true && static_cast<double>(*v) == schema["minimum"].get<double>()) ++*v;
    tighten_lo(v);
  }
  if (schema.contains("maximum")) {
    auto v = integer_bound(schema["maximum"], false, path, "maximum");
    if (v && draft4_exclusive_max && schema["exclusiveMaximum"] == true && static_cast<double>(*v) == schema["maximum"].get<double>()) --*v;
    tighten_hi(v);
  }
  if (schema.contains("exclusiveMinimum") && !draft4_exclusive_min) {
    const json& v = schema["exclusiveMinimum"];
    auto b = integer_bound(v, false, path, "exclusiveMinimum");  // floor, then the next integer
    if (b) tighten_lo(*b + 1);
  }
  if (schema.contains("exclusiveMaximum") && !draft4_exclusive_max) {
    auto b = integer_bound(schema["exclusiveMaximum"], true, path, "exclusiveMaximum");
    if (b) tighten_hi(*b - 1);
  }
  if (!lo && !hi) return prim("integer");
  return builder_.add_rule(name, integer_range(lo, hi, path));
}

std::string SchemaCompiler::number_rule(const json& schema, const std::string& name, const std::string& path) {
  const bool bounded = schema.contains("minimum") || schema.contains("maximum") || schema.contains("exclusiveMinimum") ||
                       schema.contains("exclusiveMaximum");
  if (!bounded) return prim("number");
  // Bounds on non-integers are expressed for whole-number limits only:
  // [lo, hi] with the integral part in range and the fraction limited at hi.
  auto whole = [&](const char* key) -> std::optional<int64_t> {
    if (!schema.contains(key)) return std::nullopt;
    const json& v = schema[key];
    if (v.is_boolean()) fail(path, std::string("draft-4 boolean '") + key + "' on a number is not supported");
    if (!v.is_number() || std::floor(v.get<double>()) != v.get<double>() || std::abs(v.get<double>()) > 1e15) {
      fail(path, std::string("'") + key + "' on a number must be a whole number (other bounds are not supported)");
    }
    return static_cast<int64_t>(v.get<double>());
  };
  std::optional<int64_t> lo = whole("minimum"), hi = whole("maximum");
  std::optional<int64_t> xlo = whole("exclusiveMinimum"), xhi = whole("exclusiveMaximum");
  if (xlo && lo && *lo > *xlo) xlo.reset();
  if (xhi && hi && *hi < *xhi) xhi.reset();
  if (xlo) lo.reset();
  if (xhi) hi.reset();
  const std::string frac = "(\".\" [0-9]{1,16})?";
  const std::string zero_frac = "(\".\" \"0\"{1,16})?";
  const std::string nonzero_frac = "(\".\" [0-9]{0,15} [1-9])";
  const std::optional<int64_t> low = lo ? lo : xlo;
  const std::optional<int64_t> high = hi ? hi : xhi;
  if ((low && *low < 0) || (high && *high < 0)) {
    fail(path, "number bounds below zero are not supported (integer bounds are)");
  }
  if (low && high && *low > *high) fail(path, "the bounds leave no number");
  std::vector<std::string> alts;
  // Integral parts strictly between the bounds take any fraction.
  const int64_t inner_lo = low ? *low + 1 : 0;
  const std::optional<int64_t> inner_hi = high ? std::optional<int64_t>(*high - 1) : std::nullopt;
  if (!inner_hi || inner_lo <= *inner_hi) alts.push_back(integer_range(inner_lo, inner_hi, path) + " " + frac);
  // The low integral part: any fraction when inclusive, a non-zero one when exclusive.
  if (low && (!high || *low < *high)) alts.push_back("\"" + std::to_string(*low) + "\" " + (lo ? frac : nonzero_frac));
  // The high integral part: only a zero fraction, and only when inclusive.
  if (high && hi && (!low || *high > *low || (lo && *high == *low))) {
    alts.push_back("\"" + std::to_string(*high) + "\" " + zero_frac);
  }
  // No lower bound: every negative number too.
  if (!low) alts.push_back("\"-\" " + prim("integral-part") + " " + frac);
  if (alts.empty()) fail(path, "the bounds leave no number");
  return builder_.add_rule(name, "(" + join(alts, " | ") + ")");
}

}  // namespace m40::grammar::detail

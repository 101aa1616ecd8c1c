#include "grammar/gbnf_builder.h"

#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace m40::grammar {

namespace {

std::string valid_name(std::string_view hint) {
  std::string out;
  for (char c : hint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (ok) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "rule" : out;
}

}  // namespace

std::string GbnfBuilder::add_rule(std::string_view name_hint, std::string_view body) {
  const std::string base = valid_name(name_hint);
  for (int i = 1;; ++i) {
    const std::string name = i == 1 ? base : base + "-" + std::to_string(i);
    if (name == "root") continue;
    auto it = index_.find(name);
    if (it == index_.end()) {
      index_.emplace(name, rules_.size());
      rules_.emplace_back(name, std::string(body));
      return name;
    }
    if (rules_[it->second].second == body) return name;
  }
}

std::string GbnfBuilder::reserve_rule(std::string_view name_hint) {
  const std::string base = valid_name(name_hint);
  for (int i = 1;; ++i) {
    const std::string name = i == 1 ? base : base + "-" + std::to_string(i);
    if (name == "root" || index_.count(name)) continue;
    index_.emplace(name, rules_.size());
    rules_.emplace_back(name, std::string());
    return name;
  }
}

void GbnfBuilder::define_rule(const std::string& name, std::string body) { rules_[index_.at(name)].second = std::move(body); }

std::string GbnfBuilder::add_json_schema(const nlohmann::ordered_json& schema, std::string_view name_hint) {
  return detail::SchemaCompiler(*this, schema).compile(name_hint);
}

std::string GbnfBuilder::build(std::string_view root_body) const {
  std::string out = "root ::= ";
  out += root_body;
  out += '\n';
  for (const auto& [name, body] : rules_) {
    out += name;
    out += " ::= ";
    out += body;
    out += '\n';
  }
  return out;
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  GbnfBuilder builder;
  const std::string value = builder.add_json_schema(schema, "value");
  return builder.build(value);
}

std::string json_object_gbnf() {
  GbnfBuilder builder;
  return builder.build(detail::SchemaCompiler::primitive(builder, "object"));
}

std::string gbnf_literal(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    if (b >= 0x80) {
      // Copy a whole, well-formed UTF-8 character.
      const size_t len = (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
      bool ok = len != 0 && i + len <= text.size();
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<uint8_t>(text[i + k]) & 0xC0) == 0x80;
      if (!ok) throw GrammarError("gbnf_literal: the text is not valid UTF-8");
      out.append(text.substr(i, len));
      i += len - 1;
    } else if (text[i] == '"' || text[i] == '\\') {
      out += '\\';
      out += text[i];
    } else if (text[i] == '\n') {
      out += "\\n";
    } else if (text[i] == '\r') {
      out += "\\r";
    } else if (text[i] == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7F) {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
    } else {
      out += text[i];
    }
  }
  out += '"';
  return out;
}

}  // namespace m40::grammar

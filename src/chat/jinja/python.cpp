#include "chat/jinja/python.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <unordered_set>

#include "chat/jinja/unicode.h"

namespace m40::chat::jinja {

// ------------------------------------------------------------------ List, Dict

namespace {
void check_depth(int depth) {
  if (depth > kMaxValueDepth) {
    throw Failure("lists and dicts nested more than " + std::to_string(kMaxValueDepth) + " levels deep");
  }
}
}  // namespace

Value Value::list(std::vector<Value> items, bool is_tuple) {
  int depth = 0;
  for (const auto& item : items) depth = std::max(depth, value_depth(item));
  check_depth(depth + 1);
  return Value(std::make_shared<const List>(List{std::move(items), is_tuple, depth + 1}));
}

void Dict::set(Value key, Value value) {
  check_hashable(key);
  depth_ = std::max(depth_, std::max(value_depth(key), value_depth(value)) + 1);
  check_depth(depth_);
  if (key.is_string()) {
    auto it = string_index_.find(key.as_string());
    if (it != string_index_.end()) {
      items_[it->second].second = std::move(value);
      return;
    }
    string_index_.emplace(key.as_string(), items_.size());
    items_.emplace_back(std::move(key), std::move(value));
    return;
  }
  for (auto& item : items_) {
    if (!item.first.is_string() && equal(item.first, key)) {
      item.second = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

const Value* Dict::find(const std::string& key) const {
  auto it = string_index_.find(key);
  return it == string_index_.end() ? nullptr : &items_[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  check_hashable(key);
  if (key.is_string()) return find(key.as_string());
  for (const auto& item : items_) {
    if (!item.first.is_string() && equal(item.first, key)) return &item.second;
  }
  return nullptr;
}

// ------------------------------------------------------------------ basics

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return false;
    case Value::Kind::Bool:
      return v.as_bool();
    case Value::Kind::Int:
      return v.as_int() != 0;
    case Value::Kind::Float:
      return v.as_float() != 0.0;
    case Value::Kind::String:
      return !v.as_string().empty();
    case Value::Kind::List:
      return !v.as_list().items.empty();
    case Value::Kind::Dict:
      return v.as_dict().size() != 0;
    case Value::Kind::Function:
    case Value::Kind::Object:
      return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return v.as_list().is_tuple ? "tuple" : "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Function: return "function";
    case Value::Kind::Object: return v.as_object().type_name();
  }
  return "object";
}

std::string object_description(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

[[noreturn]] void fail_undefined(const Value& v) {
  const std::string& hint = v.undefined_hint();
  throw Failure(hint.empty() ? "undefined value" : hint);
}

namespace {
// Each tuple once: a tuple holding another twice, nested deep, is shared.
void check_hashable_at(const Value& key, std::unordered_set<const List*>& checked) {
  if ((key.is_list() && !key.as_list().is_tuple) || key.is_dict() || key.is_object()) {
    throw Failure("unhashable type: '" + type_name(key) + "'");
  }
  if (key.is_tuple() && checked.insert(&key.as_list()).second) {
    for (const auto& item : key.as_list().items) check_hashable_at(item, checked);
  }
}
}  // namespace

void check_hashable(const Value& key) {
  std::unordered_set<const List*> checked;
  check_hashable_at(key, checked);
}

// ------------------------------------------------------------------ printing

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci is "[-]D[.DDD]e[+-]XX": split into sign, digits and exponent.
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    pos = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  // Python switches to exponent notation below 1e-4 and from 1e16 on.
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
    return out;
  }
  if (exponent < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exponent - 1), '0');
    out += digits;
    return out;
  }
  const auto int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) {
    out += digits;
    out.append(int_digits - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
  }
  return out;
}

namespace {

// Python's str.isprintable() for one non-ASCII code point (approximate:
// controls, format characters, separators other than space, surrogates and
// private use are not printable).
bool is_printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD || c == 0x1680 || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F)) return false;
  if (c >= 0xD800 && c <= 0xF8FF) return false;
  if (c >= 0xFFF9 && c <= 0xFFFB) return false;
  return c <= 0x10FFFF;
}

void append_hex(std::string& out, const char* prefix, uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%s%0*x", prefix, digits, value);
  out += buf;
}

}  // namespace

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : unicode::decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (is_printable(c)) {
      unicode::append(out, c);
    } else if (c < 0x100) {
      append_hex(out, "\\x", c, 2);
    } else if (c < 0x10000) {
      append_hex(out, "\\u", c, 4);
    } else {
      append_hex(out, "\\U", c, 8);
    }
  }
  out.push_back(quote);
  return out;
}

namespace {

thread_local size_t text_limit = SIZE_MAX;

void check_text(const std::string& out) {
  if (out.size() > text_limit) {
    throw LimitFailure("the text of a value exceeds the limit of " + std::to_string(text_limit) + " bytes");
  }
}

// Appends str(v), or repr(v), to out, checking the size after every item so
// that text growing past the limit stops as soon as it gets there.
void append_text(std::string& out, const Value& v, bool as_repr) {
  switch (v.kind()) {
    case Value::Kind::String:
      if (as_repr) out += string_repr(v.as_string());
      else out += v.as_string();
      break;
    case Value::Kind::Undefined:
      if (as_repr) out += "Undefined";
      break;
    case Value::Kind::List: {
      const List& l = v.as_list();
      out += l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i > 0) out += ", ";
        append_text(out, l.items[i], true);
      }
      if (l.is_tuple && l.items.size() == 1) out += ",";
      out += l.is_tuple ? ")" : "]";
      break;
    }
    case Value::Kind::Dict: {
      out += "{";
      bool first = true;
      for (const auto& [key, value] : v.as_dict().items()) {
        if (!first) out += ", ";
        first = false;
        append_text(out, key, true);
        out += ": ";
        append_text(out, value, true);
      }
      out += "}";
      break;
    }
    default: out += str(v); break;
  }
  check_text(out);
}

}  // namespace

std::string str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.as_bool() ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return float_repr(v.as_float());
    case Value::Kind::String: return v.as_string();
    case Value::Kind::List:
    case Value::Kind::Dict: {
      std::string out;
      append_text(out, v, false);
      return out;
    }
    case Value::Kind::Function: return "<function " + v.as_function().name + ">";
    case Value::Kind::Object: {
      std::string out = v.as_object().repr();
      check_text(out);
      return out;
    }
  }
  return "";
}

std::string repr(const Value& v) {
  if (v.is_string()) return string_repr(v.as_string());
  if (v.is_undefined()) return "Undefined";
  return str(v);
}

// ------------------------------------------------------------------ comparing

namespace {

thread_local uint64_t compare_limit = UINT64_MAX;
thread_local uint64_t compare_visits = 0;

void count_compare_visit() {
  if (++compare_visits > compare_limit) {
    throw LimitFailure("comparing values exceeded the budget of " + std::to_string(compare_limit) +
                       " list and dict visits (are they lists nested in themselves many times?)");
  }
}

// Pairs of lists or dicts (a's, b's) already found equal.
struct PairHash {
  size_t operator()(const std::pair<const void*, const void*>& p) const {
    return std::hash<const void*>()(p.first) * 31 + std::hash<const void*>()(p.second);
  }
};
using EqualPairs = std::unordered_set<std::pair<const void*, const void*>, PairHash>;

bool equal_at(const Value& a, const Value& b, EqualPairs& known) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_integral() == b.as_integral();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.as_string() == b.as_string();
    case Value::Kind::List: {
      const List& la = a.as_list();
      const List& lb = b.as_list();
      if (la.is_tuple != lb.is_tuple || la.items.size() != lb.items.size()) return false;
      if (&la == &lb || known.contains({&la, &lb})) return true;
      count_compare_visit();
      for (size_t i = 0; i < la.items.size(); ++i)
        if (!equal_at(la.items[i], lb.items[i], known)) return false;
      known.insert({&la, &lb});
      return true;
    }
    case Value::Kind::Dict: {
      const Dict& da = a.as_dict();
      const Dict& db = b.as_dict();
      if (da.size() != db.size()) return false;
      if (&da == &db || known.contains({&da, &db})) return true;
      count_compare_visit();
      for (const auto& [key, value] : da.items()) {
        const Value* other = db.find(key);
        if (other == nullptr || !equal_at(value, *other, known)) return false;
      }
      known.insert({&da, &db});
      return true;
    }
    case Value::Kind::Function:
      return &a.as_function() == &b.as_function();
    case Value::Kind::Object:
      return &a.as_object() == &b.as_object();
    default:
      return false;
  }
}

}  // namespace

ValueLimits::ValueLimits(size_t max_text_bytes, uint64_t max_compare_visits)
    : saved_text_limit_(text_limit), saved_compare_limit_(compare_limit), saved_compare_visits_(compare_visits) {
  text_limit = max_text_bytes;
  compare_limit = max_compare_visits;
  compare_visits = 0;
}
ValueLimits::~ValueLimits() {
  text_limit = saved_text_limit_;
  compare_limit = saved_compare_limit_;
  compare_visits = saved_compare_visits_;
}

bool equal(const Value& a, const Value& b) {
  EqualPairs known;
  return equal_at(a, b, known);
}

bool less(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_integral() < b.as_integral();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& la = a.as_list().items;
    const auto& lb = b.as_list().items;
    for (size_t i = 0; i < la.size() && i < lb.size(); ++i) {
      if (!equal(la[i], lb[i])) return less(la[i], lb[i], op);
    }
    return la.size() < lb.size();
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  throw Failure("'" + std::string(op) + "' not supported between instances of '" + type_name(a) + "' and '" +
                type_name(b) + "'");
}

// ------------------------------------------------------------------ containers

size_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return unicode::length(v.as_string());
    case Value::Kind::List: return v.as_list().items.size();
    case Value::Kind::Dict: return v.as_dict().size();
    default: throw Failure("object of type '" + type_name(v) + "' has no len()");
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::String: {
      std::vector<Value> out;
      const std::string& s = v.as_string();
      if (unicode::is_ascii(s)) {
        out.reserve(s.size());
        for (char c : s) out.emplace_back(std::string(1, c));
      } else {
        for (char32_t cp : unicode::decode(s)) {
          std::string one;
          unicode::append(one, cp);
          out.emplace_back(std::move(one));
        }
      }
      return out;
    }
    case Value::Kind::List:
      return v.as_list().items;
    case Value::Kind::Dict: {
      std::vector<Value> out;
      out.reserve(v.as_dict().size());
      for (const auto& item : v.as_dict().items()) out.push_back(item.first);
      return out;
    }
    default:
      throw Failure("'" + type_name(v) + "' object is not iterable");
  }
}

// ------------------------------------------------------------------ JSON

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  auto escape_cp = [&](char32_t c) {
    switch (c) {
      case '"': out += "\\\""; return;
      case '\\': out += "\\\\"; return;
      case '\n': out += "\\n"; return;
      case '\r': out += "\\r"; return;
      case '\t': out += "\\t"; return;
      case '\b': out += "\\b"; return;
      case '\f': out += "\\f"; return;
      default: break;
    }
    if (c < 0x20) {
      append_hex(out, "\\u", c, 4);
    } else if (c < 0x80 || !ensure_ascii) {
      unicode::append(out, c);
    } else if (c < 0x10000) {
      append_hex(out, "\\u", c, 4);
    } else {
      const char32_t v = c - 0x10000;
      append_hex(out, "\\u", 0xD800 + (v >> 10), 4);
      append_hex(out, "\\u", 0xDC00 + (v & 0x3FF), 4);
    }
  };
  if (unicode::is_ascii(s)) {
    for (char c : s) escape_cp(static_cast<unsigned char>(c));
  } else {
    for (char32_t c : unicode::decode(s)) escape_cp(c);
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

std::string json_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::String: return key.as_string();
    case Value::Kind::Int: return std::to_string(key.as_int());
    case Value::Kind::Float: return json_float(key.as_float());
    case Value::Kind::Bool: return key.as_bool() ? "true" : "false";
    case Value::Kind::None: return "null";
    default: throw Failure("keys must be str, int, float, bool or None, not " + type_name(key));
  }
}

void json_value(std::string& out, const Value& v, const JsonFormat& f, int depth) {
  auto newline = [&](int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *f.indent;
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: out += json_float(v.as_float()); return;
    case Value::Kind::String: json_string(out, v.as_string(), f.ensure_ascii); return;
    case Value::Kind::List: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += f.item_separator;
        if (f.indent) newline(depth + 1);
        json_value(out, items[i], f, depth + 1);
        check_text(out);
      }
      if (f.indent) newline(depth);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      const auto& items = v.as_dict().items();
      if (items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      entries.reserve(items.size());
      for (const auto& [key, value] : items) entries.emplace_back(json_key(key), &value);
      if (f.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out.push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += f.item_separator;
        if (f.indent) newline(depth + 1);
        json_string(out, entries[i].first, f.ensure_ascii);
        out += f.key_separator;
        json_value(out, *entries[i].second, f, depth + 1);
        check_text(out);
      }
      if (f.indent) newline(depth);
      out.push_back('}');
      return;
    }
    default:
      throw Failure("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonFormat& format) {
  std::string out;
  json_value(out, v, format, 0);
  check_text(out);
  return out;
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) throw Failure("JSON nested more than " + std::to_string(kMaxValueDepth) + " levels deep");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(None{});
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json_at(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [key, value] : j.items()) d.set(Value(key), from_json_at(value, depth + 1));
      return make_dict(std::move(d));
    }
    default:
      return Value(None{});
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

}  // namespace m40::chat::jinja

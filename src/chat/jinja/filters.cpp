// Jinja2's builtin filters and tests, with transformers' tojson (Python
// json.dumps, no HTML escaping, ensure_ascii off by default).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "chat/jinja/builtins.h"
#include "chat/jinja/format.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/python.h"
#include "chat/jinja/unicode.h"

namespace m40::chat::jinja {

namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

// ------------------------------------------------------------ helpers

std::string soft_str(const Value& v) { return str(v); }

int64_t int_param(const Value& v, const char* what) {
  if (!v.is_integral()) {
    throw Failure(std::string(what) + ": '" + type_name(v) + "' object cannot be interpreted as an integer");
  }
  return v.as_integral();
}

// A key made of digits as an int index, when it fits in one.
Value digits_key(const std::string& part) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(part.c_str(), &end, 10);
  if (errno == ERANGE || end != part.c_str() + part.size()) return Value(part);
  return Value(static_cast<int64_t>(v));
}

Value call_method(Interpreter& in, const Value& object, const std::string& name, std::vector<Value> args) {
  CallArgs a;
  a.positional = std::move(args);
  return in.call(get_attr(object, name), a);
}

// Jinja2's make_attrgetter: "a.b.0" looks up each part as an item (a part
// of digits as an integer index).
Value lookup_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value v = item;
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(v, digits ? digits_key(part) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value ignore_case(const Value& v) { return v.is_string() ? Value(unicode::lower(v.as_string())) : v; }

std::vector<Value> sorted(std::vector<Value> items, bool reverse, const std::function<Value(const Value&)>& key) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (auto& item : items) keyed.emplace_back(key(item), std::move(item));
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? less(b.first, a.first, "<") : less(a.first, b.first, "<");
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& k : keyed) out.push_back(std::move(k.second));
  return out;
}

// select / reject / selectattr / rejectattr
Value select_or_reject(Interpreter& in, const Value& input, CallArgs& a, bool select, bool by_attribute) {
  size_t off = 0;
  Value attribute;
  if (by_attribute) {
    if (a.positional.empty()) throw Failure("Missing parameter for attribute name");
    attribute = a.positional[0];
    off = 1;
  }
  std::string test;
  CallArgs test_args;
  const bool has_test = a.positional.size() > off;
  if (has_test) {
    test = str(a.positional[off]);
    test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(off) + 1, a.positional.end());
    test_args.keyword = a.keyword;
  }
  std::vector<Value> out;
  for (const auto& item : in.iterate(input)) {
    in.step();
    const Value subject = by_attribute ? lookup_path(item, attribute) : item;
    bool ok;
    if (has_test) {
      CallArgs args = test_args;
      ok = apply_test(in, test, subject, args);
    } else {
      ok = truthy(subject);
    }
    if (ok == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

double parse_python_float(const std::string& text, bool& ok) {
  std::string s;
  for (char c : text) {
    if (c != '_') s.push_back(c);
  }
  // Python accepts surrounding whitespace, inf/infinity/nan in any case.
  size_t b = 0, e = s.size();
  while (b < e && unicode::is_space(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && unicode::is_space(static_cast<unsigned char>(s[e - 1]))) --e;
  s = s.substr(b, e - b);
  ok = false;
  if (s.empty()) return 0.0;
  const std::string lower = unicode::lower(s);
  const std::string body = (lower[0] == '+' || lower[0] == '-') ? lower.substr(1) : lower;
  const double sign = lower[0] == '-' ? -1.0 : 1.0;
  if (body == "inf" || body == "infinity") {
    ok = true;
    return sign * HUGE_VAL;
  }
  if (body == "nan") {
    ok = true;
    return std::nan("");
  }
  for (char c : body) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == '+' || c == '-')) return 0.0;
  }
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  ok = end == s.c_str() + s.size();
  return v;
}

bool parse_python_int(const std::string& text, int64_t base, int64_t& out) {
  std::string s = text;
  size_t b = 0, e = s.size();
  while (b < e && unicode::is_space(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && unicode::is_space(static_cast<unsigned char>(s[e - 1]))) --e;
  s = s.substr(b, e - b);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s = s.substr(1);
  }
  if (s.size() > 1 && s[0] == '0') {
    const char p = static_cast<char>(s[1] | 0x20);
    const int64_t prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed != 0 && (base == 0 || base == prefixed)) {
      base = prefixed;
      s = s.substr(2);
    }
  }
  if (base == 0) base = 10;
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && s[i - 1] != '_') continue;
    digits.push_back(s[i]);
  }
  if (digits.empty() || base < 2 || base > 36) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (errno == ERANGE || end != digits.c_str() + digits.size()) return false;
  out = negative ? -v : v;
  return true;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// ------------------------------------------------------------ filters

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("abs", a, {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_integral()) {
    const int64_t i = v.as_integral();
    if (i == INT64_MIN) throw Failure("integer overflow");
    return Value(i < 0 ? -i : i);
  }
  if (v.is_undefined()) fail_undefined(v);
  throw Failure("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b("attr", a, {"name"}, 1);
  const std::string name = str(b.get(0));
  // Attributes only: a dict's keys are not attributes.
  if (v.is_dict()) {
    Value method = get_attr(v, name);
    if (!method.is_function() && !(method.is_undefined() && method.undefined_hint().find("unsafe") != std::string::npos)) {
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    return method;
  }
  if (v.is_undefined()) fail_undefined(v);
  return get_attr(v, name);
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("batch", a, {"linecount", "fill_with"}, 1);
  const Value& count_v = b.get(0);
  if (!count_v.is_integral() || count_v.as_integral() <= 0) throw Failure("batch() linecount must be a positive int");
  const auto count = static_cast<size_t>(count_v.as_integral());
  std::vector<Value> out, current;
  for (const auto& item : in.iterate(v)) {
    current.push_back(item);
    if (current.size() == count) {
      out.push_back(Value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (b.has(1) && !b.get(1).is_none()) {
      while (current.size() < count) current.push_back(b.get(1));
    }
    out.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs("capitalize", a, {});
  return call_method(in, Value(soft_str(v)), "capitalize", {});
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("center", a, {"width"});
  return call_method(in, Value(soft_str(v)), "center", {b.get_or(0, Value(80))});
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (truthy(b.get_or(1, Value(false))) && !truthy(v))) return b.get_or(0, Value(""));
  return v;
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw Failure("dictsort() needs a mapping, not " + type_name(v));
  const bool case_sensitive = truthy(b.get_or(0, Value(false)));
  const std::string by = str(b.get_or(1, Value("key")));
  if (by != "key" && by != "value") throw Failure("You can only sort by either \"key\" or \"value\"");
  const size_t pos = by == "key" ? 0 : 1;
  std::vector<Value> items;
  for (const auto& [key, value] : v.as_dict().items()) items.push_back(Value::list({key, value}, true));
  return Value::list(sorted(std::move(items), truthy(b.get_or(2, Value(false))), [&](const Value& item) {
    const Value& k = item.as_list().items[pos];
    return case_sensitive ? k : ignore_case(k);
  }));
}

Value f_escape(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("escape", a, {});
  return Value(html_escape(soft_str(v)));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs("first", a, {});
  if (v.is_list()) {
    const auto& items = v.as_list().items;
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  const std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b("float", a, {"default"});
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    bool ok = false;
    const double d = parse_python_float(v.as_string(), ok);
    if (ok) return Value(d);
  }
  return b.get_or(0, Value(0.0));
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.positional.empty() && !a.keyword.empty()) {
    throw Failure("can't handle positional and keyword arguments at the same time");
  }
  Value args;
  if (!a.keyword.empty()) {
    Dict d;
    for (const auto& [key, value] : a.keyword) d.set(Value(key), value);
    args = make_dict(std::move(d));
  } else {
    args = Value::list(a.positional, true);
  }
  std::string out = percent_format(soft_str(v), args);
  in.check_size(out.size());
  return Value(std::move(out));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("indent", a, {"width", "first", "blank"});
  const Value width = b.get_or(0, Value(4));
  std::string indention;
  if (width.is_string()) {
    indention = width.as_string();
  } else if (width.is_integral()) {
    in.check_size(static_cast<size_t>(std::max<int64_t>(0, width.as_integral())));
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, width.as_integral())), ' ');
  } else {
    throw Failure("indent() width must be an int or a str");
  }
  const bool first = truthy(b.get_or(1, Value(false)));
  const bool blank = truthy(b.get_or(2, Value(false)));
  const Value lines_v = call_method(in, Value(soft_str(v) + "\n"), "splitlines", {});
  const auto& lines = lines_v.as_list().items;
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i > 0) {
      out += "\n";
      if (blank || !line.empty()) out += indention;
    }
    out += line;
    in.check_size(out.size());
  }
  if (first) out = indention + out;
  return Value(std::move(out));
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b("int", a, {"default", "base"});
  const Value fallback = b.get_or(0, Value(0));
  if (v.is_integral()) return Value(v.as_integral());
  if (v.is_float()) {
    const double d = v.as_float();
    if (std::isnan(d) || std::isinf(d) || std::fabs(d) >= 9.2e18) throw Failure("cannot convert float to integer");
    return Value(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_string()) {
    const int64_t base = b.has(1) ? int_param(b.get(1), "int() base") : 10;
    int64_t out = 0;
    if (parse_python_int(v.as_string(), base, out)) return Value(out);
    bool ok = false;
    const double d = parse_python_float(v.as_string(), ok);
    if (ok && !std::isnan(d) && !std::isinf(d) && std::fabs(d) < 9.2e18) {
      return Value(static_cast<int64_t>(std::trunc(d)));
    }
  }
  return fallback;
}

Value f_items(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs("items", a, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw Failure("Can only get item pairs from a mapping.");
  return call_method(in, v, "items", {});
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("join", a, {"d", "attribute"});
  const std::string sep = soft_str(b.get_or(0, Value("")));
  std::string out;
  bool first = true;
  for (const auto& item : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += soft_str(b.has(1) && !b.get(1).is_none() ? lookup_path(item, b.get(1)) : item);
    in.check_size(out.size());
  }
  return Value(std::move(out));
}

Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs("last", a, {});
  if (v.is_list()) {
    const auto& items = v.as_list().items;
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  const std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("length", a, {});
  return Value(static_cast<int64_t>(length(v)));
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs("list", a, {});
  if (v.is_list() && !v.is_tuple()) return v;
  return Value::list(in.iterate(v));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("lower", a, {});
  return Value(unicode::lower(soft_str(v)));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (a.positional.empty()) {
    Value attribute, fallback(None{});
    bool have_attribute = false;
    for (const auto& [key, value] : a.keyword) {
      if (key == "attribute") {
        attribute = value;
        have_attribute = true;
      } else if (key == "default") {
        fallback = value;
      } else {
        throw Failure("Unexpected keyword argument '" + key + "'");
      }
    }
    if (!have_attribute) throw Failure("map requires a filter argument");
    for (const auto& item : in.iterate(v)) {
      in.step();
      Value x = lookup_path(item, attribute);
      out.push_back(x.is_undefined() && !fallback.is_none() ? fallback : x);
    }
    return Value::list(std::move(out));
  }
  const std::string name = str(a.positional[0]);
  if (!is_filter_name(name)) throw Failure("No filter named '" + name + "'.");
  for (const auto& item : in.iterate(v)) {
    in.step();
    CallArgs args;
    args.positional.assign(a.positional.begin() + 1, a.positional.end());
    args.keyword = a.keyword;
    out.push_back(apply_filter(in, name, item, args));
  }
  return Value::list(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  BoundArgs b(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool case_sensitive = truthy(b.get_or(0, Value(false)));
  const std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) {
    const Value x = b.has(1) && !b.get(1).is_none() ? lookup_path(item, b.get(1)) : item;
    return case_sensitive ? x : ignore_case(x);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? less(best_key, k, ">") : less(k, best_key, "<")) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

Value f_pprint(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("pprint", a, {});
  return Value(repr(v));
}

Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, false); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, true); }
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, true); }

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("replace", a, {"old", "new", "count"}, 2);
  std::vector<Value> args{Value(soft_str(b.get(0))), Value(soft_str(b.get(1)))};
  if (b.has(2) && !b.get(2).is_none()) args.push_back(b.get(2));
  return call_method(in, Value(soft_str(v)), "replace", std::move(args));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs("reverse", a, {});
  if (v.is_string()) {
    std::u32string cps = unicode::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(unicode::encode(cps));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b("round", a, {"precision", "method"});
  const int64_t precision = b.has(0) ? int_param(b.get(0), "round() precision") : 0;
  const std::string method = str(b.get_or(1, Value("common")));
  if (method != "common" && method != "ceil" && method != "floor") {
    throw Failure("method must be common, ceil or floor");
  }
  if (!v.is_number()) {
    if (v.is_undefined()) fail_undefined(v);
    throw Failure("type " + type_name(v) + " doesn't define __round__ method");
  }
  if (method == "common") {
    if (v.is_integral() && !b.has(0)) return Value(v.as_integral());
    if (v.is_integral()) return Value(v.as_integral());
    // Python's round(): correctly rounded, ties to even; printf does that.
    const double x = v.as_float();
    if (std::isnan(x) || std::isinf(x)) return Value(x);
    if (precision > 300 || precision < -300) return Value(x);
    if (precision >= 0) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
      return Value(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(x / scale) * scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("safe", a, {});
  return v.is_string() ? v : Value(soft_str(v));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool case_sensitive = truthy(b.get_or(1, Value(false)));
  return Value::list(sorted(in.iterate(v), truthy(b.get_or(0, Value(false))), [&](const Value& item) {
    const Value x = b.has(2) && !b.get(2).is_none() ? lookup_path(item, b.get(2)) : item;
    return case_sensitive ? x : ignore_case(x);
  }));
}

Value f_string(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("string", a, {});
  return v.is_string() ? v : Value(soft_str(v));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("sum", a, {"attribute", "start"});
  Value total = b.get_or(1, Value(0));
  for (const auto& item : in.iterate(v)) {
    total = binary_op(in, "+", total, b.has(0) && !b.get(0).is_none() ? lookup_path(item, b.get(0)) : item);
  }
  return total;
}

Value f_title(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("title", a, {});
  // Jinja2 splits on runs of [-\s({[<] and joins item[0].upper() +
  // item[1:].lower() of each piece.
  const std::u32string cps = unicode::decode(soft_str(v));
  auto is_sep = [](char32_t c) { return unicode::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    const bool sep = is_sep(cps[i]);
    while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
    const std::u32string_view piece = std::u32string_view(cps).substr(i, j - i);
    out += unicode::upper(unicode::encode(piece.substr(0, 1)));
    out += unicode::lower(unicode::encode(piece.substr(1)));
    i = j;
  }
  return Value(out);
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonFormat f;
  f.ensure_ascii = truthy(b.get_or(0, Value(false)));
  const Value indent = b.get_or(1, Value(None{}));
  if (indent.is_string()) {
    f.indent = indent.as_string();
  } else if (indent.is_integral()) {
    const int64_t n = indent.as_integral();
    in.check_size(static_cast<size_t>(std::max<int64_t>(0, n)));
    f.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
  } else if (!indent.is_none()) {
    throw Failure("tojson() indent must be None, an int or a str, not " + type_name(indent));
  }
  if (f.indent) f.item_separator = ",";
  const Value separators = b.get_or(2, Value(None{}));
  if (!separators.is_none()) {
    const std::vector<Value> parts = in.iterate(separators);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string()) {
      throw Failure("tojson() separators must be an (item_separator, key_separator) pair of strings");
    }
    f.item_separator = parts[0].as_string();
    f.key_separator = parts[1].as_string();
  }
  f.sort_keys = truthy(b.get_or(3, Value(false)));
  std::string out = to_json(v, f);
  in.check_size(out.size());
  return Value(std::move(out));
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("trim", a, {"chars"});
  return call_method(in, Value(soft_str(v)), "strip", {b.get_or(0, Value(None{}))});
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b("truncate", a, {"length", "killwords", "end", "leeway"});
  const std::string s = soft_str(v);
  const int64_t length = b.has(0) ? int_param(b.get(0), "truncate() length") : 255;
  const bool killwords = truthy(b.get_or(1, Value(false)));
  const std::string end = str(b.get_or(2, Value("...")));
  const int64_t leeway = b.has(3) && !b.get(3).is_none() ? int_param(b.get(3), "truncate() leeway") : 5;
  const auto end_len = static_cast<int64_t>(unicode::length(end));
  if (length < end_len) throw Failure("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) throw Failure("expected leeway >= 0, got " + std::to_string(leeway));
  const std::u32string cps = unicode::decode(s);
  if (static_cast<int64_t>(cps.size()) <= length + leeway) return Value(s);
  std::string head = unicode::encode(std::u32string_view(cps).substr(0, static_cast<size_t>(length - end_len)));
  if (killwords) return Value(head + end);
  const size_t space = head.rfind(' ');
  if (space != std::string::npos) head = head.substr(0, space);
  return Value(head + end);
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b("unique", a, {"case_sensitive", "attribute"});
  const bool case_sensitive = truthy(b.get_or(0, Value(false)));
  std::vector<Value> seen, out;
  for (const auto& item : in.iterate(v)) {
    Value key = b.has(1) && !b.get(1).is_none() ? lookup_path(item, b.get(1)) : item;
    if (!case_sensitive) key = ignore_case(key);
    check_hashable(key);
    bool dup = false;
    for (const auto& s : seen) {
      if (equal(s, key)) {
        dup = true;
        break;
      }
    }
    if (!dup) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("upper", a, {});
  return Value(unicode::upper(soft_str(v)));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : unicode::decode(soft_str(v))) {
    // Jinja2 counts matches of \w+: Python's str.isalnum() or '_'.
    const bool word = unicode::is_alpha(c) || unicode::is_numeric(c) || c == '_';
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value(n);
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
      {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"forceescape", f_escape}, {"format", f_format},
      {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
      {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
      {"pprint", f_pprint}, {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe}, {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string}, {"sum", f_sum}, {"title", f_title},
      {"tojson", f_tojson}, {"trim", f_trim}, {"truncate", f_truncate}, {"unique", f_unique}, {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

// Jinja2 filters m40-llm recognizes but does not run (random output, HTML
// and URL helpers): a template that reaches one fails with a clear message.
bool is_unsupported_filter(std::string_view name) {
  static const char* const kNames[] = {"filesizeformat", "groupby", "random", "slice", "striptags",
                                       "urlencode", "urlize", "wordwrap", "xmlattr"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

// ------------------------------------------------------------ tests

const Value& test_arg(CallArgs& a, const char* test) {
  if (a.positional.empty()) throw Failure(std::string("test '") + test + "' needs an argument");
  return a.positional[0];
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_function() || (v.is_object() && v.as_object().is_callable());
}
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equal(v, test_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equal(v, test_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return less(v, test_arg(a, "lt"), "<"); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return !less(test_arg(a, "le"), v, "<="); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return less(test_arg(a, "gt"), v, ">"); }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return !less(v, test_arg(a, "ge"), ">="); }
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return contains(test_arg(a, "in"), v); }
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& other = test_arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::None: case Value::Kind::Undefined: return true;
    case Value::Kind::Bool: return v.as_bool() == other.as_bool();
    case Value::Kind::List: return &v.as_list() == &other.as_list();
    case Value::Kind::Dict: return &v.as_dict() == &other.as_dict();
    case Value::Kind::Object: return &v.as_object() == &other.as_object();
    case Value::Kind::Function: return &v.as_function() == &other.as_function();
    default: return equal(v, other);
  }
}
int64_t mod_int(Interpreter& in, const Value& v, int64_t m) {
  const Value r = binary_op(in, "%", v, Value(m));
  return r.is_float() ? static_cast<int64_t>(r.as_float()) : r.as_integral();
}
bool t_odd(Interpreter& in, const Value& v, CallArgs&) { return mod_int(in, v, 2) == 1; }
bool t_even(Interpreter& in, const Value& v, CallArgs&) { return mod_int(in, v, 2) == 0; }
bool t_divisibleby(Interpreter& in, const Value& v, CallArgs& a) {
  const Value r = binary_op(in, "%", v, test_arg(a, "divisibleby"));
  return r.is_float() ? r.as_float() == 0.0 : r.as_integral() == 0;
}
bool t_lower(Interpreter& in, const Value& v, CallArgs&) {
  return truthy(call_method(in, Value(soft_str(v)), "islower", {}));
}
bool t_upper(Interpreter& in, const Value& v, CallArgs&) {
  return truthy(call_method(in, Value(soft_str(v)), "isupper", {}));
}
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && is_filter_name(v.as_string()); }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && is_test_name(v.as_string()); }

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> table = {
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
      {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"escaped", t_escaped}, {"even", t_even},
      {"false", t_false}, {"filter", t_filter}, {"float", t_float}, {"ge", t_ge}, {">=", t_ge}, {"gt", t_gt},
      {">", t_gt}, {"greaterthan", t_gt}, {"in", t_in}, {"integer", t_integer}, {"iterable", t_iterable},
      {"le", t_le}, {"<=", t_le}, {"lower", t_lower}, {"lt", t_lt}, {"<", t_lt}, {"lessthan", t_lt},
      {"mapping", t_mapping}, {"ne", t_ne}, {"!=", t_ne}, {"none", t_none}, {"number", t_number},
      {"odd", t_odd}, {"sameas", t_sameas}, {"sequence", t_sequence}, {"string", t_string}, {"test", t_test},
      {"true", t_true}, {"undefined", t_undefined}, {"upper", t_upper},
  };
  return table;
}

}  // namespace

bool is_filter_name(std::string_view name) {
  return filters().count(std::string(name)) != 0 || is_unsupported_filter(name);
}

bool is_test_name(std::string_view name) { return tests().count(std::string(name)) != 0; }

Value apply_filter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  in.step();
  const auto& table = filters();
  auto it = table.find(name);
  if (it == table.end()) {
    if (is_unsupported_filter(name)) throw Failure("the '" + name + "' filter is not supported by m40-llm");
    throw Failure("No filter named '" + name + "'.");
  }
  return it->second(in, input, args);
}

bool apply_test(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  in.step();
  const auto& table = tests();
  auto it = table.find(name);
  if (it == table.end()) throw Failure("No test named '" + name + "'.");
  return it->second(in, input, args);
}

}  // namespace m40::chat::jinja

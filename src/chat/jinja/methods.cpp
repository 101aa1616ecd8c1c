// Operators, attribute and item access, the methods of str, dict and list,
// and Jinja2's global functions.
#include <algorithm>
#include <cmath>

#include "chat/jinja/builtins.h"
#include "chat/jinja/format.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/python.h"
#include "chat/jinja/unicode.h"

namespace m40::chat::jinja {

// ------------------------------------------------------------ argument binding

BoundArgs::BoundArgs(std::string function, CallArgs& args, std::initializer_list<const char*> params,
                     size_t required)
    : values_(params.size()) {
  const std::vector<const char*> names(params);
  if (args.positional.size() > names.size()) {
    throw Failure(function + "() takes at most " + std::to_string(names.size()) + " argument" +
                  (names.size() == 1 ? "" : "s") + " (" + std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = args.positional[i];
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && key != names[i]) ++i;
    if (i == names.size()) throw Failure(function + "() got an unexpected keyword argument '" + key + "'");
    if (values_[i]) throw Failure(function + "() got multiple values for argument '" + key + "'");
    values_[i] = value;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!values_[i]) throw Failure(function + "() missing required argument '" + names[i] + "'");
  }
}

namespace {

// ------------------------------------------------------------ helpers

int64_t checked(bool overflow, int64_t v) {
  if (overflow) throw Failure("integer overflow (m40-llm's template integers are 64-bit)");
  return v;
}

std::string str_arg(const Value& v, const char* what) {
  if (!v.is_string()) {
    throw Failure(std::string(what) + " must be str, not " + type_name(v));
  }
  return v.as_string();
}

int64_t int_arg(const Value& v, const char* what) {
  if (!v.is_integral()) {
    throw Failure(std::string(what) + ": '" + type_name(v) + "' object cannot be interpreted as an integer");
  }
  return v.as_integral();
}

bool in_set(char32_t c, const std::u32string& set) { return set.find(c) != std::u32string::npos; }

// Python str.strip / lstrip / rstrip; chars none means whitespace.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = unicode::decode(str_arg(chars, "strip arg"));
  auto strip_it = [&](char32_t c) { return whitespace ? unicode::is_space(c) : in_set(c, set); };
  if (unicode::is_ascii(s) && (whitespace || unicode::is_ascii(chars.as_string()))) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && strip_it(static_cast<unsigned char>(s[b]))) ++b;
    if (right)
      while (e > b && strip_it(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
  }
  const std::u32string cps = unicode::decode(s);
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return unicode::encode(std::u32string_view(cps).substr(b, e - b));
}

std::vector<Value> split_whitespace(const std::string& s, int64_t maxsplit, bool from_right) {
  const std::u32string cps = unicode::decode(s);
  std::vector<std::u32string> parts;
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < cps.size() && unicode::is_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(cps.substr(i));  // the rest keeps its trailing whitespace
        break;
      }
      size_t j = i;
      while (j < cps.size() && !unicode::is_space(cps[j])) ++j;
      parts.push_back(cps.substr(i, j - i));
      i = j;
    }
  } else {
    size_t i = cps.size();
    while (true) {
      while (i > 0 && unicode::is_space(cps[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(cps.substr(0, i));  // the rest keeps its leading whitespace
        break;
      }
      size_t j = i;
      while (j > 0 && !unicode::is_space(cps[j - 1])) --j;
      parts.push_back(cps.substr(j, i - j));
      i = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(unicode::encode(p));
  return out;
}

std::vector<Value> split(const std::string& s, const Value& sep_value, int64_t maxsplit, bool from_right) {
  if (sep_value.is_none() || sep_value.is_undefined()) return split_whitespace(s, maxsplit, from_right);
  const std::string sep = str_arg(sep_value, "separator");
  if (sep.empty()) throw Failure("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      const size_t p = s.find(sep, start);
      if (p == std::string::npos) break;
      parts.push_back(s.substr(start, p - start));
      start = p + sep.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      if (end < sep.size()) break;
      const size_t p = s.rfind(sep, end - sep.size());
      if (p == std::string::npos) break;
      parts.push_back(s.substr(p + sep.size(), end - p - sep.size()));
      end = p;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::vector<Value> splitlines(const std::string& s, bool keepends) {
  const std::u32string cps = unicode::decode(s);
  std::vector<Value> out;
  size_t start = 0;
  size_t i = 0;
  while (i < cps.size()) {
    if (unicode::is_line_break(cps[i])) {
      size_t eol = i + 1;
      if (cps[i] == '\r' && eol < cps.size() && cps[eol] == '\n') ++eol;
      out.emplace_back(unicode::encode(std::u32string_view(cps).substr(start, (keepends ? eol : i) - start)));
      start = i = eol;
    } else {
      ++i;
    }
  }
  if (start < cps.size()) out.emplace_back(unicode::encode(std::u32string_view(cps).substr(start)));
  return out;
}

std::string replace(Interpreter& in, const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count) {
  if (count == 0) return s;
  if (old.empty()) {
    // Python inserts the replacement between code points and at both ends.
    const std::u32string cps = unicode::decode(s);
    int64_t left = count < 0 ? static_cast<int64_t>(cps.size()) + 1 : count;
    in.check_size(s.size() + repl.size() * static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(cps.size()) + 1)));
    std::string out;
    for (char32_t c : cps) {
      if (left > 0) {
        out += repl;
        --left;
      }
      unicode::append(out, c);
    }
    if (left > 0) out += repl;
    return out;
  }
  size_t occurrences = 0;
  for (size_t p = s.find(old); p != std::string::npos; p = s.find(old, p + old.size())) {
    ++occurrences;
    if (count > 0 && occurrences == static_cast<size_t>(count)) break;
  }
  if (repl.size() > old.size()) in.check_size(s.size() + occurrences * (repl.size() - old.size()));
  std::string out;
  size_t start = 0;
  for (size_t done = 0; done < occurrences; ++done) {
    const size_t p = s.find(old, start);
    out.append(s, start, p - start);
    out += repl;
    start = p + old.size();
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Python's optional start/end arguments of find, count, startswith, ...
// as a code-point range, then as byte offsets.
struct Range {
  size_t begin, end;  // byte offsets
  bool empty_invalid; // start beyond the string
};

Range byte_range(const std::string& s, const Value& start, const Value& end) {
  const bool ascii = unicode::is_ascii(s);
  std::u32string cps;
  if (!ascii) cps = unicode::decode(s);
  const auto len = static_cast<int64_t>(ascii ? s.size() : cps.size());
  auto norm = [&](const Value& v, int64_t fallback) {
    if (v.is_none() || v.is_undefined()) return fallback;
    int64_t i = int_arg(v, "slice index");
    if (i < 0) i = std::max<int64_t>(0, i + len);
    return std::min(i, len);
  };
  const int64_t b = norm(start, 0);
  const int64_t e = norm(end, len);
  Range r{0, 0, false};
  if (!start.is_none() && !start.is_undefined() && int_arg(start, "slice index") > len) r.empty_invalid = true;
  auto to_byte = [&](int64_t cp_index) -> size_t {
    if (ascii) return static_cast<size_t>(cp_index);
    return unicode::encode(std::u32string_view(cps).substr(0, static_cast<size_t>(cp_index))).size();
  };
  r.begin = to_byte(b);
  r.end = std::max(r.begin, to_byte(e));
  return r;
}

int64_t code_point_index(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(unicode::length(std::string_view(s).substr(0, byte_offset)));
}

Value affix_test(const std::string& s, const Value& affix, const Value& start, const Value& end, bool prefix) {
  const Range r = byte_range(s, start, end);
  if (r.empty_invalid) return Value(false);
  const std::string_view window = std::string_view(s).substr(r.begin, r.end - r.begin);
  auto one = [&](const Value& a) {
    if (!a.is_string()) {
      throw Failure(std::string(prefix ? "startswith" : "endswith") +
                    " first arg must be str or a tuple of str, not " + type_name(a));
    }
    const std::string& x = a.as_string();
    if (x.size() > window.size()) return false;
    return prefix ? window.substr(0, x.size()) == x : window.substr(window.size() - x.size()) == x;
  };
  if (affix.is_tuple()) {
    for (const auto& a : affix.as_list().items)
      if (one(a)) return Value(true);
    return Value(false);
  }
  return Value(one(affix));
}

template <class Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  for (char32_t c : unicode::decode(s))
    if (!pred(c)) return false;
  return true;
}

std::string justify(const std::string& s, const Value& width_value, const Value& fill_value, char how) {
  const int64_t width = int_arg(width_value, "width");
  std::string fill = " ";
  if (!fill_value.is_undefined()) {
    fill = str_arg(fill_value, "fill character");
    if (unicode::length(fill) != 1) throw Failure("The fill character must be exactly one character long");
  }
  const auto len = static_cast<int64_t>(unicode::length(s));
  if (width <= len) return s;
  const auto total = static_cast<size_t>(width - len);
  auto repeat = [&](size_t n) {
    std::string out;
    for (size_t i = 0; i < n; ++i) out += fill;
    return out;
  };
  if (how == '<') return s + repeat(total);
  if (how == '>') return repeat(total) + s;
  // Python's center puts the extra character on the left when the string
  // length is odd and the padding is odd.
  const size_t left = total / 2 + (total & static_cast<size_t>(width) & 1);
  return repeat(left) + s + repeat(total - left);
}

// The methods of str. Returns an undefined Value when `name` is not one.
Value string_method(const std::string& self, const std::string& name) {
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  auto method = [&](Fn fn) { return Value::function("str." + name, std::move(fn)); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return method([self, name, left, right](Interpreter&, CallArgs& a) {
      BoundArgs b(name, a, {"chars"});
      return Value(strip(self, b.get_or(0, Value(None{})), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return method([self, name, from_right](Interpreter&, CallArgs& a) {
      BoundArgs b(name, a, {"sep", "maxsplit"});
      const int64_t maxsplit = b.has(1) ? int_arg(b.get(1), "maxsplit") : -1;
      return Value::list(split(self, b.get_or(0, Value(None{})), maxsplit, from_right));
    });
  }
  if (name == "splitlines") {
    return method([self](Interpreter&, CallArgs& a) {
      BoundArgs b("splitlines", a, {"keepends"});
      return Value::list(splitlines(self, truthy(b.get_or(0, Value(false)))));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return method([self, name, prefix](Interpreter&, CallArgs& a) {
      BoundArgs b(name, a, {"prefix", "start", "end"}, 1);
      return affix_test(self, b.get(0), b.get_or(1, Value(None{})), b.get_or(2, Value(None{})), prefix);
    });
  }
  if (name == "replace") {
    return method([self](Interpreter& in, CallArgs& a) {
      BoundArgs b("replace", a, {"old", "new", "count"}, 2);
      const int64_t count = b.has(2) ? int_arg(b.get(2), "count") : -1;
      return Value(replace(in, self, str_arg(b.get(0), "replace() argument 1"), str_arg(b.get(1), "replace() argument 2"),
                           count));
    });
  }
  if (name == "upper") return method([self](Interpreter&, CallArgs&) { return Value(unicode::upper(self)); });
  if (name == "lower") return method([self](Interpreter&, CallArgs&) { return Value(unicode::lower(self)); });
  if (name == "casefold") return method([self](Interpreter&, CallArgs&) { return Value(unicode::casefold(self)); });
  if (name == "title") return method([self](Interpreter&, CallArgs&) { return Value(unicode::title(self)); });
  if (name == "capitalize") return method([self](Interpreter&, CallArgs&) { return Value(unicode::capitalize(self)); });
  if (name == "swapcase") return method([self](Interpreter&, CallArgs&) { return Value(unicode::swapcase(self)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const bool reverse = name[0] == 'r';
    const bool raise = name.find("index") != std::string::npos;
    return method([self, name, reverse, raise](Interpreter&, CallArgs& a) {
      BoundArgs b(name, a, {"sub", "start", "end"}, 1);
      const std::string sub = str_arg(b.get(0), "must be str");
      const Range r = byte_range(self, b.get_or(1, Value(None{})), b.get_or(2, Value(None{})));
      size_t p = std::string::npos;
      if (!r.empty_invalid && sub.size() <= r.end - r.begin) {
        const std::string_view window = std::string_view(self).substr(r.begin, r.end - r.begin);
        p = reverse ? window.rfind(sub) : window.find(sub);
      }
      if (p == std::string::npos) {
        if (raise) throw Failure("substring not found");
        return Value(static_cast<int64_t>(-1));
      }
      return Value(code_point_index(self, r.begin + p));
    });
  }
  if (name == "count") {
    return method([self](Interpreter&, CallArgs& a) {
      BoundArgs b("count", a, {"sub", "start", "end"}, 1);
      const std::string sub = str_arg(b.get(0), "must be str");
      const Range r = byte_range(self, b.get_or(1, Value(None{})), b.get_or(2, Value(None{})));
      if (r.empty_invalid) return Value(static_cast<int64_t>(0));
      const std::string window = self.substr(r.begin, r.end - r.begin);
      if (sub.empty()) return Value(static_cast<int64_t>(unicode::length(window)) + 1);
      int64_t n = 0;
      for (size_t p = window.find(sub); p != std::string::npos; p = window.find(sub, p + sub.size())) ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return method([self](Interpreter& in, CallArgs& a) {
      BoundArgs b("join", a, {"iterable"}, 1);
      std::string out;
      size_t i = 0;
      for (const auto& item : in.iterate(b.get(0))) {
        if (!item.is_string()) {
          throw Failure("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) +
                        " found");
        }
        if (i++ > 0) out += self;
        out += item.as_string();
        in.check_size(out.size());
      }
      return Value(out);
    });
  }
  if (name == "format") {
    return method([self](Interpreter& in, CallArgs& a) {
      std::string out = brace_format(self, a);
      in.check_size(out.size());
      return Value(std::move(out));
    });
  }
  if (name == "isdigit") {
    return method([self](Interpreter&, CallArgs&) { return Value(all_chars(self, unicode::is_digit)); });
  }
  if (name == "isdecimal") {
    return method([self](Interpreter&, CallArgs&) { return Value(all_chars(self, unicode::is_decimal)); });
  }
  if (name == "isnumeric") {
    return method([self](Interpreter&, CallArgs&) { return Value(all_chars(self, unicode::is_numeric)); });
  }
  if (name == "isalpha") return method([self](Interpreter&, CallArgs&) { return Value(all_chars(self, unicode::is_alpha)); });
  if (name == "isalnum") {
    return method([self](Interpreter&, CallArgs&) {
      // Python: isalpha() or isdecimal() or isdigit() or isnumeric(), the
      // last covering the other two.
      return Value(all_chars(self, [](char32_t c) { return unicode::is_alpha(c) || unicode::is_numeric(c); }));
    });
  }
  if (name == "isspace") return method([self](Interpreter&, CallArgs&) { return Value(all_chars(self, unicode::is_space)); });
  if (name == "isupper") return method([self](Interpreter&, CallArgs&) { return Value(unicode::isupper(self)); });
  if (name == "islower") return method([self](Interpreter&, CallArgs&) { return Value(unicode::islower(self)); });
  if (name == "istitle") return method([self](Interpreter&, CallArgs&) { return Value(unicode::istitle(self)); });
  if (name == "center" || name == "ljust" || name == "rjust") {
    const char how = name == "center" ? '^' : name == "ljust" ? '<' : '>';
    return method([self, name, how](Interpreter& in, CallArgs& a) {
      BoundArgs b(name, a, {"width", "fillchar"}, 1);
      in.check_size(static_cast<size_t>(std::max<int64_t>(0, int_arg(b.get(0), "width"))));
      return Value(justify(self, b.get(0), b.get_or(1, Value()), how));
    });
  }
  if (name == "zfill") {
    return method([self](Interpreter& in, CallArgs& a) {
      BoundArgs b("zfill", a, {"width"}, 1);
      const int64_t width = int_arg(b.get(0), "width");
      in.check_size(static_cast<size_t>(std::max<int64_t>(0, width)));
      const auto len = static_cast<int64_t>(unicode::length(self));
      if (width <= len) return Value(self);
      const size_t sign = (!self.empty() && (self[0] == '-' || self[0] == '+')) ? 1 : 0;
      return Value(self.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') + self.substr(sign));
    });
  }
  if (name == "partition" || name == "rpartition") {
    const bool reverse = name[0] == 'r';
    return method([self, name, reverse](Interpreter&, CallArgs& a) {
      BoundArgs b(name, a, {"sep"}, 1);
      const std::string sep = str_arg(b.get(0), "separator");
      if (sep.empty()) throw Failure("empty separator");
      const size_t p = reverse ? self.rfind(sep) : self.find(sep);
      if (p == std::string::npos) {
        return reverse ? Value::list({Value(""), Value(""), Value(self)}, true)
                       : Value::list({Value(self), Value(""), Value("")}, true);
      }
      return Value::list({Value(self.substr(0, p)), Value(sep), Value(self.substr(p + sep.size()))}, true);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return method([self, name, prefix](Interpreter&, CallArgs& a) {
      BoundArgs b(name, a, {"affix"}, 1);
      const std::string x = str_arg(b.get(0), "argument");
      if (prefix && self.compare(0, x.size(), x) == 0) return Value(self.substr(x.size()));
      if (!prefix && x.size() <= self.size() && self.compare(self.size() - x.size(), x.size(), x) == 0) {
        return Value(self.substr(0, self.size() - x.size()));
      }
      return Value(self);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& self, const std::string& name) {
  const Value dict_value = self;  // keeps the dict alive in the closures
  if (name == "items") {
    return Value::function("dict.items", [dict_value](Interpreter&, CallArgs& a) {
      BoundArgs b("items", a, {});
      std::vector<Value> out;
      for (const auto& [key, value] : dict_value.as_dict().items()) out.push_back(Value::list({key, value}, true));
      return Value::list(std::move(out));
    });
  }
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return Value::function("dict." + name, [dict_value, keys](Interpreter&, CallArgs& a) {
      BoundArgs b(keys ? "keys" : "values", a, {});
      std::vector<Value> out;
      for (const auto& [key, value] : dict_value.as_dict().items()) out.push_back(keys ? key : value);
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return Value::function("dict.get", [dict_value](Interpreter&, CallArgs& a) {
      BoundArgs b("get", a, {"key", "default"}, 1);
      const Value* v = dict_value.as_dict().find(b.get(0));
      return v != nullptr ? *v : b.get_or(1, Value(None{}));
    });
  }
  if (name == "copy") {
    return Value::function("dict.copy", [dict_value](Interpreter&, CallArgs&) { return dict_value; });
  }
  static const char* const kMutating[] = {"clear", "pop", "popitem", "setdefault", "update"};
  for (const char* m : kMutating) {
    if (name == m) return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  return Value();  // not a method: look the key up instead
}

Value list_method(const Value& self, const std::string& name) {
  const std::string type = type_name(self);
  if (name == "index") {
    return Value::function(type + ".index", [self](Interpreter&, CallArgs& a) {
      BoundArgs b("index", a, {"value"}, 1);
      const auto& items = self.as_list().items;
      for (size_t i = 0; i < items.size(); ++i)
        if (equal(items[i], b.get(0))) return Value(static_cast<int64_t>(i));
      throw Failure(repr(b.get(0)) + " is not in list");
    });
  }
  if (name == "count") {
    return Value::function(type + ".count", [self](Interpreter&, CallArgs& a) {
      BoundArgs b("count", a, {"value"}, 1);
      int64_t n = 0;
      for (const auto& item : self.as_list().items)
        if (equal(item, b.get(0))) ++n;
      return Value(n);
    });
  }
  if (!self.is_tuple()) {
    if (name == "copy") return Value::function("list.copy", [self](Interpreter&, CallArgs&) { return self; });
    static const char* const kMutating[] = {"append", "extend", "insert", "remove", "reverse", "sort"};
    for (const char* m : kMutating) {
      if (name == m) return Value::undefined("access to attribute '" + name + "' of 'list' object is unsafe.");
    }
    if (name == "pop" || name == "clear") {
      return Value::undefined("list." + name + "() changes the list, which m40-llm's template renderer does not allow");
    }
  }
  return Value::undefined("'" + type + " object' has no attribute '" + name + "'");
}

// Python's slice.indices(): a normalized start, stop, step for a length.
// The number of items of Python's range(start, stop, step) (step != 0),
// without overflow: distances and the step's magnitude are taken unsigned,
// where even stop - start across the whole int64 range and -INT64_MIN fit.
uint64_t step_count(int64_t start, int64_t stop, int64_t step) {
  if (step > 0 && start < stop) {
    const uint64_t distance = static_cast<uint64_t>(stop) - static_cast<uint64_t>(start);
    return (distance - 1) / static_cast<uint64_t>(step) + 1;
  }
  if (step < 0 && start > stop) {
    const uint64_t distance = static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
    const uint64_t magnitude = static_cast<uint64_t>(-(step + 1)) + 1;
    return (distance - 1) / magnitude + 1;
  }
  return 0;
}

// Item k (< step_count) of that range: it lies between start and stop, so it
// fits, and the wrapping unsigned arithmetic gives it exactly.
int64_t step_value(int64_t start, int64_t step, uint64_t k) {
  return static_cast<int64_t>(static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step));
}

void slice_indices(int64_t len, const Value& start_v, const Value& stop_v, const Value& step_v, int64_t& start,
                   int64_t& stop, int64_t& step) {
  auto get = [](const Value& v, bool& present) -> int64_t {
    present = !(v.is_none() || v.is_undefined());
    if (!present) return 0;
    if (!v.is_integral()) throw Failure("slice indices must be integers or None or have an __index__ method");
    return v.as_integral();
  };
  bool has_step, has_start, has_stop;
  step = get(step_v, has_step);
  if (!has_step) step = 1;
  if (step == 0) throw Failure("slice step cannot be zero");
  start = get(start_v, has_start);
  stop = get(stop_v, has_stop);
  auto adjust = [&](int64_t& v, bool present, int64_t def) {
    if (!present) {
      v = def;
      return;
    }
    if (v < 0) {
      v += len;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= len) {
      v = step < 0 ? len - 1 : len;
    }
  };
  adjust(start, has_start, step < 0 ? len - 1 : 0);
  adjust(stop, has_stop, step < 0 ? -1 : len);
}

// The attributes of a value other than its methods: the cycler's current,
// and nothing else on built-in types.
Value no_attribute(const Value& object, const std::string& name) {
  std::string hint(1, '\'');
  hint += object_description(object);
  hint += "' has no attribute '";
  hint += name;
  hint += '\'';
  return Value::undefined(std::move(hint));
}

// ------------------------------------------------------------ globals

class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override {
    if (in_repr_) return "<Namespace {...}>";  // it holds itself, as Python prints a recursive dict
    in_repr_ = true;
    std::string out;
    try {
      out = "<Namespace " + str(make_dict(attrs_)) + ">";
    } catch (...) {
      in_repr_ = false;
      throw;
    }
    in_repr_ = false;
    return out;
  }
  void release() override { attrs_ = Dict(); }
  Value get_attr(const std::string& name) const override {
    if (const Value* v = attrs_.find(name)) return *v;
    return Value::undefined("'Namespace object' has no attribute '" + name + "'");
  }
  bool set_attr(const std::string& name, Value value) override {
    attrs_.set(Value(name), std::move(value));
    return true;
  }
  bool is_namespace() const override { return true; }

 private:
  Dict attrs_;
  mutable bool in_repr_ = false;
};

class Cycler : public Object {
 public:
  explicit Cycler(std::vector<Value> items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::string repr() const override { return "<Cycler>"; }
  Value get_attr(const std::string& name) const override {
    auto* self = const_cast<Cycler*>(this);
    const ObjectPtr keep = self_.lock();
    if (name == "current") return items_[pos_];
    if (name == "next") {
      return Value::function("next", [self, keep](Interpreter&, CallArgs&) {
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      });
    }
    if (name == "reset") {
      return Value::function("reset", [self, keep](Interpreter&, CallArgs&) {
        self->pos_ = 0;
        return Value(None{});
      });
    }
    return Value::undefined("'Cycler object' has no attribute '" + name + "'");
  }
  void release() override { items_.assign(1, Value(None{})); }
  std::weak_ptr<Object> self_;

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

class Joiner : public Object {
 public:
  explicit Joiner(std::string sep) : sep_(std::move(sep)) {}
  std::string type_name() const override { return "Joiner"; }
  std::string repr() const override { return "<Joiner>"; }
  Value get_attr(const std::string& name) const override {
    return Value::undefined("'Joiner object' has no attribute '" + name + "'");
  }
  bool is_callable() const override { return true; }
  Value call(Interpreter&, CallArgs&) override {
    if (!used_) {
      used_ = true;
      return Value("");
    }
    return Value(sep_);
  }

 private:
  std::string sep_;
  bool used_ = false;
};

Dict dict_from_args(const char* function, CallArgs& a) {
  Dict d;
  if (a.positional.size() > 1) {
    throw Failure(std::string(function) + " expected at most 1 argument, got " + std::to_string(a.positional.size()));
  }
  if (a.positional.size() == 1) {
    const Value& src = a.positional[0];
    if (src.is_dict()) {
      for (const auto& [key, value] : src.as_dict().items()) d.set(key, value);
    } else {
      for (const auto& pair : iterate(src)) {
        const std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) throw Failure("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [key, value] : a.keyword) d.set(Value(key), value);
  return d;
}

}  // namespace

// ------------------------------------------------------------ operators

Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const auto unsupported = [&]() -> Failure {
    return Failure("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  if (op == "+") {
    if (numbers) {
      if (floats) return Value(a.as_double() + b.as_double());
      int64_t r = 0;
      const bool overflow = __builtin_add_overflow(a.as_integral(), b.as_integral(), &r);
      return Value(checked(overflow, r));
    }
    if (a.is_string() && b.is_string()) {
      in.check_size(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      in.account((a.as_list().items.size() + b.as_list().items.size()) * sizeof(Value));
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string() || a.is_list()) {
      throw Failure("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    }
    throw unsupported();
  }
  if (op == "-") {
    if (!numbers) throw unsupported();
    if (floats) return Value(a.as_double() - b.as_double());
    int64_t r = 0;
    const bool overflow = __builtin_sub_overflow(a.as_integral(), b.as_integral(), &r);
    return Value(checked(overflow, r));
  }
  if (op == "*") {
    if (numbers) {
      if (floats) return Value(a.as_double() * b.as_double());
      int64_t r = 0;
      const bool overflow = __builtin_mul_overflow(a.as_integral(), b.as_integral(), &r);
      return Value(checked(overflow, r));
    }
    const Value* seq = (a.is_string() || a.is_list()) ? &a : (b.is_string() || b.is_list()) ? &b : nullptr;
    const Value* times = seq == &a ? &b : &a;
    if (seq == nullptr) throw unsupported();
    if (!times->is_integral()) {
      throw Failure("can't multiply sequence by non-int of type '" + type_name(*times) + "'");
    }
    const int64_t n = std::max<int64_t>(0, times->as_integral());
    if (seq->is_string()) {
      const std::string& s = seq->as_string();
      if (s.empty() || n == 0) return Value(std::string());
      if (static_cast<uint64_t>(n) > in.limits().max_output_bytes / s.size()) in.check_size(SIZE_MAX);
      std::string out;
      out.reserve(s.size() * static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) out += s;
      return Value(std::move(out));
    }
    const auto& items = seq->as_list().items;
    // An empty sequence repeated any number of times is empty: return before
    // a loop of up to INT64_MAX empty appends.
    if (items.empty() || n == 0) return Value::list({}, seq->is_tuple());
    if (static_cast<uint64_t>(n) > in.limits().max_built_bytes / (items.size() * sizeof(Value))) {
      in.account(SIZE_MAX);
    }
    in.account(static_cast<size_t>(n) * items.size() * sizeof(Value));
    std::vector<Value> out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
    return Value::list(std::move(out), seq->is_tuple());
  }
  if (op == "/") {
    if (!numbers) throw unsupported();
    if (b.as_double() == 0.0) throw Failure("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!numbers) throw unsupported();
    if (floats) {
      if (b.as_double() == 0.0) throw Failure("float floor division by zero");
      return Value(std::floor(a.as_double() / b.as_double()));
    }
    const int64_t x = a.as_integral(), y = b.as_integral();
    if (y == 0) throw Failure("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) checked(true, 0);
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value(q);
  }
  if (op == "%") {
    if (a.is_string()) {
      std::string out = percent_format(a.as_string(), b);
      in.check_size(out.size());
      return Value(std::move(out));
    }
    if (!numbers) throw unsupported();
    if (floats) {
      const double y = b.as_double();
      if (y == 0.0) throw Failure("float modulo");
      double m = std::fmod(a.as_double(), y);
      if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    const int64_t x = a.as_integral(), y = b.as_integral();
    if (y == 0) throw Failure("integer modulo by zero");
    if (y == -1) return Value(static_cast<int64_t>(0));
    int64_t m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  if (op == "**") {
    if (!numbers) throw unsupported();
    if (!floats && b.as_integral() >= 0) {
      int64_t base = a.as_integral(), exp = b.as_integral(), result = 1;
      while (exp > 0) {
        if (exp & 1) checked(__builtin_mul_overflow(result, base, &result), 0);
        exp >>= 1;
        if (exp > 0) checked(__builtin_mul_overflow(base, base, &base), 0);
      }
      return Value(result);
    }
    if (a.as_double() == 0.0 && b.as_double() < 0) throw Failure("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  throw Failure("unknown operator " + op);
}

Value unary_op(char op, const Value& a) {
  if (a.is_undefined()) fail_undefined(a);
  if (a.is_float()) return Value(op == '-' ? -a.as_float() : a.as_float());
  if (a.is_integral()) {
    const int64_t v = a.as_integral();
    if (op == '+') return Value(v);
    if (v == INT64_MIN) checked(true, 0);
    return Value(-v);
  }
  throw Failure(std::string("bad operand type for unary ") + op + ": '" + type_name(a) + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::String:
      if (!item.is_string()) {
        throw Failure("'in <string>' requires string as left operand, not " + type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const auto& v : container.as_list().items)
        if (equal(v, item)) return true;
      return false;
    case Value::Kind::Dict:
      return container.as_dict().find(item) != nullptr;
    default:
      throw Failure("argument of type '" + type_name(container) + "' is not iterable");
  }
}

// ------------------------------------------------------------ access

Value get_attr(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::Undefined:
      fail_undefined(object);
    case Value::Kind::Dict: {
      Value method = dict_method(object, name);
      if (!method.is_undefined() || !method.undefined_hint().empty()) return method;
      if (const Value* v = object.as_dict().find(name)) return *v;
      return no_attribute(object, name);
    }
    case Value::Kind::String:
      return string_method(object.as_string(), name);
    case Value::Kind::List:
      return list_method(object, name);
    case Value::Kind::Object:
      return object.as_object().get_attr(name);
    default:
      return no_attribute(object, name);
  }
}

Value get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::Undefined:
      fail_undefined(object);
    case Value::Kind::Dict: {
      const Dict& d = object.as_dict();
      const bool hashable = !((key.is_list() && !key.is_tuple()) || key.is_dict() || key.is_object());
      if (hashable) {
        if (const Value* v = d.find(key)) return *v;
      }
      if (key.is_string()) {
        Value method = dict_method(object, key.as_string());
        if (!method.is_undefined() || !method.undefined_hint().empty()) return method;
        return no_attribute(object, key.as_string());
      }
      break;
    }
    case Value::Kind::List:
    case Value::Kind::String: {
      if (key.is_integral()) {
        int64_t i = key.as_integral();
        if (object.is_list()) {
          const auto& items = object.as_list().items;
          const auto n = static_cast<int64_t>(items.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
        } else {
          const std::string& s = object.as_string();
          if (unicode::is_ascii(s)) {
            const auto n = static_cast<int64_t>(s.size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return Value(std::string(1, s[static_cast<size_t>(i)]));
          } else {
            const std::u32string cps = unicode::decode(s);
            const auto n = static_cast<int64_t>(cps.size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
              std::string one;
              unicode::append(one, cps[static_cast<size_t>(i)]);
              return Value(one);
            }
          }
        }
      } else if (key.is_string()) {
        return get_attr(object, key.as_string());
      }
      break;
    }
    case Value::Kind::Object:
      if (key.is_string()) return object.as_object().get_attr(key.as_string());
      break;
    default:
      if (key.is_string()) return no_attribute(object, key.as_string());
      break;
  }
  return Value::undefined(object_description(object) + " has no element " + repr(key));
}

Value get_slice(const Value& object, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (!object.is_string() && !object.is_list()) {
    return Value::undefined(object_description(object) + " has no element slice(" + repr(start_v) + ", " +
                            repr(stop_v) + ", " + repr(step_v) + ")");
  }
  const bool ascii = object.is_string() && unicode::is_ascii(object.as_string());
  std::u32string cps;
  if (object.is_string() && !ascii) cps = unicode::decode(object.as_string());
  const auto len = static_cast<int64_t>(object.is_list() ? object.as_list().items.size()
                                        : ascii          ? object.as_string().size()
                                                         : cps.size());
  int64_t start, stop, step;
  slice_indices(len, start_v, stop_v, step_v, start, stop, step);
  const uint64_t count = step_count(start, stop, step);
  std::vector<size_t> picks;
  picks.reserve(static_cast<size_t>(count));
  for (uint64_t k = 0; k < count; ++k) picks.push_back(static_cast<size_t>(step_value(start, step, k)));
  if (object.is_list()) {
    const auto& items = object.as_list().items;
    std::vector<Value> out;
    out.reserve(picks.size());
    for (size_t i : picks) out.push_back(items[i]);
    return Value::list(std::move(out), object.is_tuple());
  }
  std::string out;
  if (ascii) {
    const std::string& s = object.as_string();
    if (step == 1) return Value(s.substr(static_cast<size_t>(start), picks.size()));
    for (size_t i : picks) out.push_back(s[i]);
  } else {
    for (size_t i : picks) unicode::append(out, cps[i]);
  }
  return Value(std::move(out));
}

// ------------------------------------------------------------ globals

void add_jinja_globals(Scope& scope) {
  scope.set("range", Value::function("range", [](Interpreter& in, CallArgs& a) {
              if (!a.keyword.empty()) throw Failure("range() takes no keyword arguments");
              if (a.positional.empty() || a.positional.size() > 3) {
                throw Failure("range expected 1 to 3 arguments, got " + std::to_string(a.positional.size()));
              }
              int64_t start = 0, stop, step = 1;
              if (a.positional.size() == 1) {
                stop = int_arg(a.positional[0], "range()");
              } else {
                start = int_arg(a.positional[0], "range()");
                stop = int_arg(a.positional[1], "range()");
                if (a.positional.size() == 3) step = int_arg(a.positional[2], "range()");
              }
              if (step == 0) throw Failure("range() arg 3 must not be zero");
              // Counted exactly, so start and stop near the int64 limits neither
              // overflow nor round; Jinja2's sandbox refuses ranges of more than
              // 100000 items.
              const uint64_t count = step_count(start, stop, step);
              if (count > 100000) {
                throw Failure("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
              }
              std::vector<Value> out;
              out.reserve(static_cast<size_t>(count));
              for (uint64_t k = 0; k < count; ++k) out.emplace_back(step_value(start, step, k));
              in.step();
              return Value::list(std::move(out));
            }));
  scope.set("dict", Value::function("dict", [](Interpreter&, CallArgs& a) { return make_dict(dict_from_args("dict", a)); }));
  scope.set("namespace", Value::function("namespace", [](Interpreter& in, CallArgs& a) {
              auto ns = std::make_shared<Namespace>();
              in.adopt(ns);
              in.account(256);
              const Dict attrs = dict_from_args("namespace", a);
              for (const auto& [key, value] : attrs.items()) {
                ns->set_attr(str(key), value);
              }
              return Value(std::static_pointer_cast<Object>(ns));
            }));
  scope.set("cycler", Value::function("cycler", [](Interpreter& in, CallArgs& a) {
              if (a.positional.empty()) throw Failure("at least one item has to be provided");
              auto c = std::make_shared<Cycler>(a.positional);
              c->self_ = c;
              in.adopt(c);
              in.account(256);
              return Value(std::static_pointer_cast<Object>(c));
            }));
  scope.set("joiner", Value::function("joiner", [](Interpreter&, CallArgs& a) {
              BoundArgs b("joiner", a, {"sep"});
              return Value(std::static_pointer_cast<Object>(
                  std::make_shared<Joiner>(b.has(0) ? str(b.get(0)) : std::string(", "))));
            }));
}

}  // namespace m40::chat::jinja

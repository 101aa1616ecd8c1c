// What Jinja2 and Python provide around the syntax: operators, attribute and
// item access (with the str/dict/list methods), filters, tests and the
// global functions range, dict, namespace, cycler and joiner.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "chat/jinja/value.h"

namespace m40::chat::jinja {

struct Scope;

// ------------------------------------------------------------ operators
// + - * / // % ** on Python values (str % args formats printf-style).
Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b);
Value unary_op(char op, const Value& a);
// Python `item in container`.
bool contains(const Value& container, const Value& item);

// ------------------------------------------------------------ access
// Jinja2's environment.getattr: a method or attribute first, then the item
// of that name; an Undefined naming what was missing otherwise.
Value get_attr(const Value& object, const std::string& name);
// Jinja2's environment.getitem: the item first, then an attribute of that
// name when the key is a string.
Value get_item(const Value& object, const Value& key);
// object[start:stop:step] for str, list and tuple (an Undefined otherwise).
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// ------------------------------------------------------------ filters, tests
// Every filter and test Jinja2 has (checked when parsing, as Jinja2 checks
// when compiling); a few rare ones fail when reached instead of running.
bool is_filter_name(std::string_view name);
bool is_test_name(std::string_view name);
Value apply_filter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);

// range, dict, namespace, cycler, joiner.
void add_jinja_globals(Scope& scope);

// ------------------------------------------------------------ argument binding
// Binds call arguments to named parameters the way Python does, with
// TypeErrors for unexpected or missing ones.
class BoundArgs {
 public:
  BoundArgs(std::string function, CallArgs& args, std::initializer_list<const char*> params, size_t required = 0);
  bool has(size_t i) const { return values_[i].has_value(); }
  const Value& get(size_t i) const { return *values_[i]; }
  Value get_or(size_t i, Value fallback) const { return has(i) ? *values_[i] : std::move(fallback); }

 private:
  std::vector<std::optional<Value>> values_;
};

}  // namespace m40::chat::jinja

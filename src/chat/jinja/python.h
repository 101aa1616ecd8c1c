// Python semantics of Values: truthiness, str() and repr(), ==, <, len(),
// iteration, json.dumps. Jinja2 delegates all of these to Python, so the
// renderer has to reproduce them to print what transformers prints.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja/value.h"

namespace m40::chat::jinja {

bool truthy(const Value& v);

// type(v).__name__: "str", "int", "NoneType", "dict", "Undefined", ...
std::string type_name(const Value& v);
// How Jinja2 names an object in "... has no attribute" messages:
// "None", "dict object", "str object", ...
std::string object_description(const Value& v);

std::string str(const Value& v);   // Python str(v); Undefined gives ""
std::string repr(const Value& v);  // Python repr(v)
std::string float_repr(double d);  // Python repr(float)
std::string string_repr(std::string_view s);

// Bounds on the work a value's own operations do, for the thread that
// renders (an Interpreter sets them from its limits while it renders;
// otherwise there are none). Lists are shared, so a list holding another
// twice, nested 40 deep, would print exponentially long text and have 2^40
// items to compare:
// - str(), repr() and to_json() fail with a LimitFailure once one result
//   passes max_text_bytes;
// - ==, <, `in` and dict keys compare lists and dicts item by item: equal()
//   remembers the pairs it has found equal, and every list or dict it visits
//   counts against max_compare_visits in all; past them it fails with a
//   LimitFailure.
class ValueLimits {
 public:
  ValueLimits(size_t max_text_bytes, uint64_t max_compare_visits);
  ~ValueLimits();
  ValueLimits(const ValueLimits&) = delete;
  ValueLimits& operator=(const ValueLimits&) = delete;

 private:
  size_t saved_text_limit_;
  uint64_t saved_compare_limit_;
  uint64_t saved_compare_visits_;
};

// Python ==, with 1 == 1.0 == True and deep list/dict comparison.
bool equal(const Value& a, const Value& b);
// Python <; throws Failure when the types cannot be ordered. `op` names the
// operator in the message.
bool less(const Value& a, const Value& b, std::string_view op);

// Fails with the undefined value's hint ("'x' is undefined").
[[noreturn]] void fail_undefined(const Value& v);
// Throws TypeError for lists and dicts used as dict keys or set members.
void check_hashable(const Value& key);

// Python len(); Undefined has length 0.
size_t length(const Value& v);
// Python iter(): a string's characters, a list's items, a dict's keys;
// Undefined iterates as nothing. Anything else is a TypeError.
std::vector<Value> iterate(const Value& v);

// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys).
struct JsonFormat {
  std::optional<std::string> indent;  // none: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& v, const JsonFormat& format);

Value from_json(const nlohmann::ordered_json& j);

}  // namespace m40::chat::jinja

// The values a Jinja template computes with, modelled on the Python objects
// Jinja2 hands around: Undefined, None, bool, int, float, str, list/tuple,
// dict (insertion-ordered), functions and a few objects (namespace, loop).
// Lists and dicts are immutable once built (transformers renders in an
// ImmutableSandboxedEnvironment), so they are shared, never copied.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace m40::chat::jinja {

// A failure with Python semantics (TypeError, UndefinedError, ...). The
// interpreter turns it into a TemplateRenderError with the template line.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A Failure because a render bound was hit: the interpreter turns it into a
// TemplateLimitError.
class LimitFailure : public Failure {
 public:
  using Failure::Failure;
};

class Value;
class Dict;
class Object;
class Interpreter;

// Lists and dicts nested deeper than this cannot be built (printing,
// comparing and freeing them recurses).
inline constexpr int kMaxValueDepth = 500;

struct List {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;  // 1 + the deepest item's depth
};

// Positional and keyword arguments of one call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

// Jinja's Undefined: what a missing variable, key or attribute evaluates to.
// Printing it gives "", iterating it gives nothing, most other uses fail with
// `hint` (e.g. "'x' is undefined").
struct Undefined {
  std::string hint;
};
struct None {};

using StringPtr = std::shared_ptr<const std::string>;
using ListPtr = std::shared_ptr<const List>;
using DictPtr = std::shared_ptr<const Dict>;
using FunctionPtr = std::shared_ptr<const Function>;
using ObjectPtr = std::shared_ptr<Object>;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Function, Object };
  // Strings are shared like lists: copying a Value never copies text.
  using Storage = std::variant<Undefined, None, bool, int64_t, double, StringPtr, ListPtr, DictPtr, FunctionPtr,
                               ObjectPtr>;

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}                     // NOLINT: implicit on purpose
  Value(Undefined u) : v_(std::move(u)) {}        // NOLINT
  Value(bool b) : v_(b) {}                        // NOLINT
  Value(int64_t i) : v_(i) {}                     // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}   // NOLINT
  Value(double d) : v_(d) {}                      // NOLINT
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : v_(std::make_shared<const std::string>(s)) {}             // NOLINT
  Value(ListPtr l) : v_(std::move(l)) {}          // NOLINT
  Value(DictPtr d) : v_(std::move(d)) {}          // NOLINT
  Value(FunctionPtr f) : v_(std::move(f)) {}      // NOLINT
  Value(ObjectPtr o) : v_(std::move(o)) {}        // NOLINT

  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
    return Value(std::make_shared<const Function>(Function{std::move(name), std::move(fn)}));
  }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  // Python numbers: bool is an int subclass.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_integral() const { return is_bool() || is_int(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_tuple() const { return is_list() && as_list().is_tuple; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_function() const { return kind() == Kind::Function; }
  bool is_object() const { return kind() == Kind::Object; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Int or bool as int64 (Python's int(True) == 1).
  int64_t as_integral() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  // Any number as a double.
  double as_double() const { return is_float() ? as_float() : static_cast<double>(as_integral()); }
  const std::string& as_string() const { return *std::get<StringPtr>(v_); }
  const List& as_list() const { return *std::get<ListPtr>(v_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(v_); }
  const Dict& as_dict() const { return *std::get<DictPtr>(v_); }
  const Function& as_function() const { return *std::get<FunctionPtr>(v_); }
  Object& as_object() const { return *std::get<ObjectPtr>(v_); }
  const ObjectPtr& object_ptr() const { return std::get<ObjectPtr>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

 private:
  Storage v_;
};

// A Python dict: keys in insertion order, string keys indexed.
class Dict {
 public:
  // Inserts or replaces (keeping the first position, as Python does).
  void set(Value key, Value value);
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  int depth() const { return depth_; }

 private:
  std::vector<std::pair<Value, Value>> items_;
  int depth_ = 1;
  std::unordered_map<std::string, size_t> string_index_;
};

inline Value make_dict(Dict d) { return Value(std::make_shared<const Dict>(std::move(d))); }

// How deeply lists and dicts nest in v (0 for anything else).
inline int value_depth(const Value& v) {
  if (v.is_list()) return v.as_list().depth;
  if (v.is_dict()) return v.as_dict().depth();
  return 0;
}

// Objects with attributes: namespace(), the loop variable, cycler, joiner.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // Python's type(x).__name__
  virtual std::string repr() const = 0;
  // An undefined Value when the attribute does not exist.
  virtual Value get_attr(const std::string& name) const = 0;
  // Namespace attribute assignment; false for read-only objects.
  virtual bool set_attr(const std::string& /*name*/, Value /*value*/) { return false; }
  virtual bool is_namespace() const { return false; }
  virtual bool is_callable() const { return false; }
  // Drops the values the object holds: the interpreter calls it when a
  // render ends, so that reference cycles (ns.self = ns) cannot leak.
  virtual void release() {}
  virtual Value call(Interpreter& /*in*/, CallArgs& /*args*/) {
    throw Failure("'" + type_name() + "' object is not callable");
  }
};

}  // namespace m40::chat::jinja

// GGUF metadata: typed key/value pairs with accessors whose errors name the key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/error.h"

namespace m40::gguf {

// The on-disk value type ids of the GGUF format.
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view value_type_name(ValueType type);

struct Value;

// A homogeneous array; element_type is ARRAY for arrays of arrays.
struct Array {
  ValueType element_type = ValueType::UINT8;
  std::vector<Value> items;
  bool operator==(const Array&) const = default;
};

struct Value {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, Array, uint64_t, int64_t, double>;
  Storage storage;

  Value() = default;
  template <class T>
    requires std::is_constructible_v<Storage, T>
  Value(T v) : storage(std::move(v)) {}  // NOLINT: implicit on purpose
  Value(const char* s) : storage(std::string(s)) {}

  // The variant index equals the on-disk type id.
  ValueType type() const { return static_cast<ValueType>(storage.index()); }
  bool operator==(const Value&) const = default;

  // A short human-readable rendering (arrays abbreviated), for `show`.
  std::string to_display_string(size_t max_items = 8) const;
};

// Mistyped or missing metadata. The message names the key.
class MetadataError : public Error {
 public:
  using Error::Error;
};

class Metadata {
 public:
  // Insertion order is kept: writers reproduce a file's key order.
  void set(std::string key, Value value);
  bool contains(std::string_view key) const { return index_.count(std::string(key)) != 0; }
  const Value* find(std::string_view key) const;
  const Value& at(std::string_view key) const;  // throws MetadataError if missing
  void erase(std::string_view key);
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

  // Typed access. Integers convert between widths and signedness when the
  // value fits; floats accept FLOAT32 or FLOAT64; strings and bools are exact.
  template <class T> T get(std::string_view key) const;
  template <class T> std::optional<T> get_optional(std::string_view key) const;
  template <class T> T get_or(std::string_view key, T fallback) const {
    auto v = get_optional<T>(key);
    return v ? *v : fallback;
  }
  // Arrays of one element type, converted as get<T> does per element.
  template <class T> std::vector<T> get_array(std::string_view key) const;
  const Array& get_array_value(std::string_view key) const;

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Converts one value as Metadata::get does; `what` names it in the error.
template <class T> T convert_value(const Value& value, std::string_view what);

}  // namespace m40::gguf

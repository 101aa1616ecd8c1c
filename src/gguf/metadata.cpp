#include "gguf/metadata.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace m40::gguf {

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

namespace {

template <class T> constexpr std::string_view wanted_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_floating_point_v<T>) return "a float";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else return "a value";
}

[[noreturn]] void mistyped(std::string_view what, std::string_view wanted, const Value& value) {
  throw MetadataError("metadata " + std::string(what) + " has type " +
                      std::string(value_type_name(value.type())) + ", expected " +
                      std::string(wanted));
}

template <class Target, class Source> bool integer_fits(Source v) {
  if constexpr (std::is_signed_v<Source> && !std::is_signed_v<Target>) {
    if (v < 0) return false;
    return static_cast<std::make_unsigned_t<Source>>(v) <= std::numeric_limits<Target>::max();
  } else if constexpr (!std::is_signed_v<Source> && std::is_signed_v<Target>) {
    return v <= static_cast<std::make_unsigned_t<Target>>(std::numeric_limits<Target>::max());
  } else {
    return v >= std::numeric_limits<Target>::min() && v <= std::numeric_limits<Target>::max();
  }
}

}  // namespace

template <class T> T convert_value(const Value& value, std::string_view what) {
  if constexpr (std::is_same_v<T, bool>) {
    if (auto* b = std::get_if<bool>(&value.storage)) return *b;
    mistyped(what, "bool", value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto* s = std::get_if<std::string>(&value.storage)) return *s;
    mistyped(what, "string", value);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (auto* f = std::get_if<float>(&value.storage)) return static_cast<T>(*f);
    if (auto* d = std::get_if<double>(&value.storage)) return static_cast<T>(*d);
    mistyped(what, "a float", value);
  } else {
    static_assert(std::is_integral_v<T>);
    return std::visit(
        [&](const auto& v) -> T {
          using S = std::decay_t<decltype(v)>;
          if constexpr (std::is_integral_v<S> && !std::is_same_v<S, bool>) {
            if (!integer_fits<T>(v)) {
              throw MetadataError("metadata " + std::string(what) + " = " + std::to_string(v) +
                                  " is out of range");
            }
            return static_cast<T>(v);
          } else {
            mistyped(what, wanted_name<T>(), value);
          }
        },
        value.storage);
  }
}

#define M40_INSTANTIATE(T) \
  template T convert_value<T>(const Value&, std::string_view); \
  template T Metadata::get<T>(std::string_view) const; \
  template std::optional<T> Metadata::get_optional<T>(std::string_view) const; \
  template std::vector<T> Metadata::get_array<T>(std::string_view) const;

void Metadata::set(std::string key, Value value) {
  if (auto it = index_.find(key); it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

const Value* Metadata::find(std::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const Value& Metadata::at(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  throw MetadataError("metadata key '" + std::string(key) + "' is missing");
}

void Metadata::erase(std::string_view key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
}

template <class T> T Metadata::get(std::string_view key) const {
  return convert_value<T>(at(key), "key '" + std::string(key) + "'");
}

template <class T> std::optional<T> Metadata::get_optional(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  return convert_value<T>(*v, "key '" + std::string(key) + "'");
}

const Array& Metadata::get_array_value(std::string_view key) const {
  const Value& v = at(key);
  if (auto* a = std::get_if<Array>(&v.storage)) return *a;
  mistyped("key '" + std::string(key) + "'", "array", v);
}

template <class T> std::vector<T> Metadata::get_array(std::string_view key) const {
  const Array& array = get_array_value(key);
  std::vector<T> out;
  out.reserve(array.items.size());
  for (size_t i = 0; i < array.items.size(); ++i) {
    out.push_back(convert_value<T>(array.items[i],
                                   "key '" + std::string(key) + "'[" + std::to_string(i) + "]"));
  }
  return out;
}

M40_INSTANTIATE(bool)
M40_INSTANTIATE(std::string)
M40_INSTANTIATE(float)
M40_INSTANTIATE(double)
M40_INSTANTIATE(uint8_t)
M40_INSTANTIATE(int8_t)
M40_INSTANTIATE(uint16_t)
M40_INSTANTIATE(int16_t)
M40_INSTANTIATE(uint32_t)
M40_INSTANTIATE(int32_t)
M40_INSTANTIATE(uint64_t)
M40_INSTANTIATE(int64_t)
#undef M40_INSTANTIATE

std::string Value::to_display_string(size_t max_items) const {
  return std::visit(
      [&](const auto& v) -> std::string {
        using S = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<S, std::string>) {
          return "\"" + v + "\"";
        } else if constexpr (std::is_same_v<S, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_floating_point_v<S>) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
          return buf;
        } else if constexpr (std::is_same_v<S, Array>) {
          std::string s = "[";
          for (size_t i = 0; i < v.items.size() && i < max_items; ++i) {
            if (i > 0) s += ", ";
            s += v.items[i].to_display_string(max_items);
          }
          if (v.items.size() > max_items) {
            s += ", ... (" + std::to_string(v.items.size()) + " " +
                 std::string(value_type_name(v.element_type)) + " items)";
          }
          return s + "]";
        } else {
          return std::to_string(v);
        }
      },
      storage);
}

}  // namespace m40::gguf

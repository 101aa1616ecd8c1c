// Request-field parsing with type checks, shared by every route.
#include "server/request_fields.h"

#include <cmath>

namespace m40::server {

json parse_body(const HttpRequest& req) {
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw HttpError{400, std::string("the request body is not valid JSON: ") + e.what()};
  }
  if (!body.is_object()) throw HttpError{400, "the request body must be a JSON object"};
  return body;
}

namespace {
[[noreturn]] void wrong_type(const char* key, const char* expected) {
  throw HttpError{400, std::string("'") + key + "' must be " + expected};
}
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

std::optional<double> get_number(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number");
  return v->get<double>();
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (v->is_number_unsigned()) return static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), kMax));
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    // Range-checked before the cast, which is undefined past int64.
    if (std::isfinite(d) && d == std::trunc(d)) {
      if (d >= 0x1p63) return kMax;
      if (d < -0x1p63) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(d);
    }
  }
  wrong_type(key, "an integer");
}

std::optional<bool> get_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "true or false");
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string");
  return v->get<std::string>();
}

std::vector<std::string> get_stop(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) wrong_type(key, "a string or a list of strings");
  std::vector<std::string> out;
  for (const auto& s : *v) {
    if (!s.is_string()) wrong_type(key, "a string or a list of strings");
    if (!s.get_ref<const std::string&>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

std::string model_field(const json& body, const char* key) {
  std::string name = get_string(body, key).value_or("");
  if (name.find('\0') != std::string::npos) throw HttpError{400, std::string("'") + key + "' must not contain a NUL character"};
  return name;
}

std::vector<int32_t> token_ids(const json& ids, size_t n_vocab, const std::string& field) {
  std::vector<int32_t> tokens;
  tokens.reserve(ids.size());
  for (const auto& t : ids) {
    if (!t.is_number_unsigned() || t.get<uint64_t>() >= n_vocab) {
      throw HttpError{400, field + ": token id " + t.dump() + " is out of range: the vocabulary has " +
                               std::to_string(n_vocab) + " tokens (ids 0.." + std::to_string(n_vocab - 1) + ")"};
    }
    tokens.push_back(static_cast<int32_t>(t.get<uint64_t>()));
  }
  return tokens;
}

int ollama_num_gpu(const json& body) {
  auto it = body.find("options");
  if (it == body.end() || !it->is_object()) return -1;
  const auto v = get_int(*it, "num_gpu");
  if (!v) return -1;
  if (*v < -1 || *v > (int64_t{1} << 20)) {
    throw HttpError{400, "options.num_gpu must be a layer count, or -1 for as many as fit, got " + std::to_string(*v)};
  }
  return static_cast<int>(*v);
}

int ollama_num_ctx(const json& body) {
  auto it = body.find("options");
  if (it == body.end() || !it->is_object()) return 0;
  const auto v = get_int(*it, "num_ctx");
  if (!v) return 0;
  if (*v <= 0 || *v > (int64_t{1} << 24)) {
    throw HttpError{400, "options.num_ctx must be between 1 and 16777216, got " + std::to_string(*v)};
  }
  return static_cast<int>(*v);
}

}  // namespace m40::server

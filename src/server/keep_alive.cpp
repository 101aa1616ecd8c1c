#include "server/keep_alive.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "common/error.h"

namespace m40::server {

namespace {

// Past this (31 years) a duration means forever: centuries overflow
// steady_clock::now() + duration (nanoseconds) into the past, which would
// unload the model at once.
constexpr double kLongestSeconds = 1e9;

// seconds is a number or +inf (finite parts that overflowed), never NaN.
KeepAlive from_seconds(double seconds) {
  if (seconds < 0 || seconds > kLongestSeconds) return KeepAlive::never_expires();
  return {std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0))), false};
}

[[noreturn]] void bad(const std::string& text) {
  throw Error("keep_alive '" + text + "' is not a duration: use e.g. \"5m\", \"1h30m\", \"90s\", a number of seconds, 0 or -1");
}

// strtod, refusing what it reads as NaN or infinity ("nan", "inf", "1e400").
double finite_number(const std::string& text, const char* start, char** end) {
  const double value = std::strtod(start, end);
  if (*end != start && !std::isfinite(value)) bad(text);
  return value;
}

}  // namespace

KeepAlive parse_keep_alive(const std::string& text) {
  if (text.empty()) bad(text);
  // A bare number is seconds.
  char* end = nullptr;
  const double plain = finite_number(text, text.c_str(), &end);
  if (end != text.c_str() && *end == '\0') return from_seconds(plain);

  // Go's time.ParseDuration forms: [-]NUMBER UNIT [NUMBER UNIT]...
  size_t i = 0;
  bool negative = false;
  if (text[0] == '-' || text[0] == '+') {
    negative = text[0] == '-';
    i = 1;
  }
  double seconds = 0;
  bool any = false;
  while (i < text.size()) {
    const char* start = text.c_str() + i;
    const double value = finite_number(text, start, &end);
    if (end == start || value < 0) bad(text);
    i += static_cast<size_t>(end - start);
    std::string unit;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) unit += text[i++];
    double scale = 0;
    if (unit == "h") scale = 3600;
    else if (unit == "m") scale = 60;
    else if (unit == "s") scale = 1;
    else if (unit == "ms") scale = 1e-3;
    else if (unit == "us" || unit == "µs") scale = 1e-6;
    else if (unit == "ns") scale = 1e-9;
    else bad(text);
    seconds += value * scale;
    any = true;
  }
  if (!any) bad(text);
  return from_seconds(negative ? -seconds : seconds);
}

std::optional<KeepAlive> keep_alive_field(const nlohmann::ordered_json& body) {
  auto it = body.find("keep_alive");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number()) {
    const double seconds = it->get<double>();
    if (!std::isfinite(seconds)) throw Error("'keep_alive' must be a finite number of seconds");
    return from_seconds(seconds);
  }
  if (it->is_string()) return parse_keep_alive(it->get<std::string>());
  throw Error("'keep_alive' must be a duration string (\"5m\") or a number of seconds");
}

}  // namespace m40::server

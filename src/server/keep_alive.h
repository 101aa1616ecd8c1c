// Ollama's `keep_alive`: how long a model stays loaded after its last
// request. A duration string ("5m", "1h30m", "90s", "500ms"), a number of
// seconds, 0 (unload right after the request) or negative (keep forever).
// NaN and infinity are refused; past 1e9 seconds (31 years) means forever.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace m40::server {

struct KeepAlive {
  std::chrono::milliseconds duration{std::chrono::minutes(5)};
  bool forever = false;

  static KeepAlive never_expires() { return {std::chrono::milliseconds(0), true}; }
  bool unload_at_once() const { return !forever && duration.count() <= 0; }
};

// "5m", "-1", "0", "1h30m", "2.5s"; throws m40::Error naming the forms.
KeepAlive parse_keep_alive(const std::string& text);
// The request field: a string as above or a number of seconds; nullopt
// when absent or null. Throws m40::Error for any other value.
std::optional<KeepAlive> keep_alive_field(const nlohmann::ordered_json& body);

}  // namespace m40::server

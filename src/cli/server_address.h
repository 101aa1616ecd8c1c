// Where the client commands (`ps`) find the server, the way `serve` chooses
// where to listen: 127.0.0.1:11434, then $M40_LLM_HOST=host:port, then
// --host / --port.
#pragma once

#include <optional>
#include <string>

namespace m40::cli {

inline constexpr const char* kDefaultServerHost = "127.0.0.1";
inline constexpr int kDefaultServerPort = 11434;

struct ServerAddress {
  std::string host = kDefaultServerHost;
  int port = kDefaultServerPort;

  // "http://127.0.0.1:11434" ([::1] for an IPv6 address).
  std::string url() const;
};

ServerAddress server_address(const std::optional<std::string>& host, const std::optional<int>& port);

}  // namespace m40::cli

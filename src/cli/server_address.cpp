#include "cli/server_address.h"

#include <cstdlib>

#include "server/server.h"

namespace m40::cli {

std::string ServerAddress::url() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return "http://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

ServerAddress server_address(const std::optional<std::string>& host, const std::optional<int>& port) {
  ServerAddress a;
  if (const char* env = std::getenv("M40_LLM_HOST"); env != nullptr && *env != '\0') {
    server::parse_host_port(env, a.host, a.port);
  }
  if (host) a.host = *host;
  if (port) a.port = *port;
  // Listening on every address ("0.0.0.0") means the client asks loopback.
  if (a.host == "0.0.0.0") a.host = kDefaultServerHost;
  if (a.host == "::") a.host = "::1";
  return a;
}

}  // namespace m40::cli

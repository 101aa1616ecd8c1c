#include "server/server_options.h"

#include <stdexcept>

#include "common/error.h"

namespace m40::server {

void parse_host_port(const std::string& text, std::string& host, int& port) {
  std::string rest = text;
  if (auto scheme = rest.find("://"); scheme != std::string::npos) rest = rest.substr(scheme + 3);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  auto unbracket = [](std::string h) {  // "[::1]" -> "::1"
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    return h;
  };
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || (rest.front() == '[' && rest.find(']') > colon)) {
    if (!rest.empty()) host = unbracket(rest);
    return;
  }
  if (colon > 0) host = unbracket(rest.substr(0, colon));
  const std::string p = rest.substr(colon + 1);
  if (p.empty()) return;
  try {
    size_t used = 0;
    const int value = std::stoi(p, &used);
    if (used != p.size() || value < 0 || value > 65535) throw std::out_of_range(p);
    port = value;
  } catch (const std::exception&) {
    throw Error("'" + text + "' has no valid port: use HOST:PORT with a port from 0 to 65535");
  }
}

}  // namespace m40::server

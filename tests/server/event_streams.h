// The bodies of streamed answers, split for the server tests: the `data:`
// payloads of Server-Sent Events, and the objects of NDJSON.
#pragma once

#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

namespace m40::test {

// The `data:` payloads of a Server-Sent Events body, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  }
  return out;
}

// The objects of an NDJSON body, one per non-empty line.
inline std::vector<nlohmann::json> ndjson_lines(const std::string& body) {
  std::vector<nlohmann::json> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

}  // namespace m40::test

#include "server/request_limits.h"

#include <charconv>
#include <string>

namespace m40::server {

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

std::optional<HttpError> check_request_head(const HttpRequest& head, const RequestLimits& limits) {
  if (head.headers.size() > limits.max_header_fields) {
    return HttpError{431, "the request has " + std::to_string(head.headers.size()) + " header fields; at most " +
                              std::to_string(limits.max_header_fields) + " are read"};
  }
  if (head.target.size() > limits.max_line_bytes) {
    return HttpError{414, "the request target is longer than " + std::to_string(limits.max_line_bytes) + " bytes"};
  }
  for (const auto& [name, value] : head.headers) {
    if (name.size() + value.size() + 2 > limits.max_line_bytes) {
      return HttpError{431, "the header field '" + name.substr(0, 64) + "' is longer than " +
                                std::to_string(limits.max_line_bytes) + " bytes"};
    }
  }
  // One Content-Length, one number: two that agree are legal HTTP, but a
  // proxy in front may have read the other one (request smuggling).
  const size_t lengths = head.header_count("Content-Length");
  if (lengths > 1) return HttpError{400, "the request has more than one Content-Length"};
  if (lengths == 1) {
    const std::string value = trim(head.header("Content-Length"));
    unsigned long long n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (value.empty() || ec == std::errc::invalid_argument || (ec == std::errc{} && end != value.data() + value.size())) {
      return HttpError{400, "Content-Length must be a number of bytes, got '" + value.substr(0, 32) + "'"};
    }
    if (ec == std::errc::result_out_of_range || n > limits.max_body_bytes) {
      return HttpError{413, "the request body is too large: at most " + std::to_string(limits.max_body_bytes) +
                                " bytes are read"};
    }
  }
  if (head.header_count("Transfer-Encoding") > 1 ||
      (head.has_header("Transfer-Encoding") && !iequals(trim(head.header("Transfer-Encoding")), "chunked"))) {
    return HttpError{501, "only 'Transfer-Encoding: chunked' is supported"};
  }
  for (const auto& [name, value] : head.headers) {
    if (iequals(name, "Content-Encoding") && !iequals(trim(value), "identity")) {
      return HttpError{415, "compressed request bodies (Content-Encoding: " + trim(value).substr(0, 32) +
                                ") are not accepted: send the body uncompressed"};
    }
  }
  return std::nullopt;
}

}  // namespace m40::server

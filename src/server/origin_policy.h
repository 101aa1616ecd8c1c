// Which web pages may use the server from a browser, as Ollama decides it.
// A browser sends the page's Origin with every cross-origin request, and
// whatever host name the page used (Host): without these checks any web
// page could drive a server started without an API key (the default),
// directly or through DNS rebinding (a name of the attacker's that resolves
// to 127.0.0.1).
//
// - Origin: requests without one (curl, SDKs) pass. Pages on localhost,
//   127.0.0.1 or [::1] (any port, http or https) and app://, file://,
//   tauri:// pages are allowed, plus the entries of --origins /
//   $M40_LLM_ORIGINS (comma-separated; "*" stands for any characters, a
//   lone "*" allows every origin). Others get 403.
// - CORS: an allowed origin's preflight (OPTIONS) is answered with the
//   methods and headers it may use; its answers carry
//   Access-Control-Allow-Origin: ORIGIN.
// - Host: a server bound to a loopback address answers only Host
//   localhost, 127.0.0.1, [::1] or the bound address (any port); 403 else.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/http_message.h"

namespace m40::server {

class OriginPolicy {
 public:
  // `extra`: allowed origin patterns besides the defaults.
  explicit OriginPolicy(std::vector<std::string> extra = {});

  // "a, b,c" -> {"a", "b", "c"} (empty entries dropped).
  static std::vector<std::string> parse_list(std::string_view comma_separated);

  bool allows(std::string_view origin) const;

  // The answer to a CORS preflight from an allowed origin.
  HttpResponse preflight(const HttpRequest& req) const;
  // Lets the page read the answer: Access-Control-Allow-Origin (and Vary).
  static void allow_reading(HttpResponse& res, const std::string& origin);

 private:
  std::vector<std::string> patterns_;
};

// Whether a listening address is loopback ("127.0.0.1", "::1", "localhost").
bool is_loopback_address(std::string_view host);
// Whether a Host header names the server bound at `bound_host` (loopback):
// localhost, 127.0.0.1, [::1] or `bound_host` itself, with any port. An
// absent Host (HTTP/1.0) passes.
bool host_allowed(std::string_view host_header, std::string_view bound_host);

}  // namespace m40::server

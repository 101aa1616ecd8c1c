// What one client may cost the server before a handler sees its request:
// sizes checked on the header, before the body is read or anything is
// parsed; how long the header, the body and each write may take; how many
// connections one address may hold. The transport enforces them
// (http_transport.cpp); docs/server.md lists them.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "server/http_error.h"
#include "server/http_message.h"

namespace m40::server {

struct RequestLimits {
  size_t max_header_bytes = 16u << 10;  // request line and header fields together (431 past it)
  size_t max_header_fields = 100;       // 431 past it
  size_t max_line_bytes = 8u << 10;     // the request target (414) or one header field (431)
  size_t max_body_bytes = 8u << 20;     // 413, also for chunked bodies; compressed bodies are refused (415)
  // Request bodies held at once, all connections together: a body counts
  // from its header (its Content-Length, or max_body_bytes when chunked)
  // until its answer ends. One that would pass it is answered 503 before
  // its body is read, so many large bodies cannot grow the server without
  // bound (1024 connections x 8 MiB).
  size_t max_bodies_bytes = 64u << 20;
  // The header must be complete this long after the connection opened or
  // the previous answer ended (408, and an idle keep-alive connection closes).
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{60'000};   // the whole body (408)
  std::chrono::milliseconds write_timeout{30'000};  // one write to a client that does not read
  int max_connections = 1024;            // open at once, all clients; more are answered 503 and closed
  int max_connections_per_client = 256;  // open at once from one address
};

// Checks a request's header (read, body not yet read) against `limits`:
// field count and sizes, Content-Length (one, a number within the body
// limit), Content-Encoding (none: a compressed body could grow past the
// limit once inflated) and Transfer-Encoding (chunked only). nullopt: the
// request may go on.
std::optional<HttpError> check_request_head(const HttpRequest& head, const RequestLimits& limits);

}  // namespace m40::server

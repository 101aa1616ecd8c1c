// A request as the route handlers see it, and the answer they fill in: the
// transport (http_transport.h) reads the one and writes the other. A
// streamed answer (Server-Sent Events, NDJSON) is a function that writes
// chunks after the handler has returned, on the same worker thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m40::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// Case-insensitive ASCII comparison, as header names compare.
bool iequals(std::string_view a, std::string_view b);

struct HttpRequest {
  std::string method;  // "GET", "POST", ... (HEAD is answered as GET without a body)
  std::string target;  // as sent: "/v1/models?x=1"
  std::string path;    // the target without its query: "/v1/models"
  int version = 11;    // 10: HTTP/1.0, 11: HTTP/1.1
  HttpHeaders headers;
  std::string body;
  std::string remote_addr;
  std::vector<std::string> params;  // what the route's pattern captured
  // True once the client closed or reset its connection (handlers that wait
  // without writing poll it). Set by the transport; never empty there.
  std::function<bool()> client_gone = [] { return false; };

  // The first value of a header ("" when absent); names compare case-insensitively.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
  size_t header_count(std::string_view name) const;
};

// Where a streamed answer writes its chunks.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Sends one chunk now. False when the client is gone or stopped reading.
  virtual bool write(std::string_view data) = 0;
  // True once the client closed or reset its connection.
  virtual bool client_gone() = 0;
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;
  std::string body;
  // Set: the body is streamed, chunk by chunk, by this function (it runs
  // after the handler returns; whatever ends it, it must free what it holds).
  std::function<void(ResponseWriter&)> stream;

  // Replaces every header of that name.
  void set_header(std::string name, std::string value);
  std::string header(std::string_view name) const;
  void set_content(std::string content, std::string content_type);
  void set_stream(std::string content_type, std::function<void(ResponseWriter&)> producer);
};

// "OK", "Not Found", ... for a status line.
const char* status_reason(int status);

}  // namespace m40::server

// The HTTP/1.1 transport of `m40-llm serve`: Boost.Beast's parser on
// Boost.Asio, one I/O thread for every connection plus a pool of worker
// threads for the handlers.
//
// Why not cpp-httplib 0.11 (the server's transport until 2026-11): it ties one
// pool thread to each connection for as long as it is open, with a read
// timeout per recv() call only, so 25 clients sending a header byte a second
// stopped every route, /health included, and blocked shutdown; it dropped
// pipelined requests after the first, inflated gzip bodies without a limit,
// set SO_REUSEPORT (a second server could bind the same port) and gave
// handlers no way to see their client leave. docs/server.md has the numbers.
//
// Here a connection costs a socket and a buffer until its request is
// complete (header and body within their deadlines and sizes,
// request_limits.h); only then does a worker run the handler, which writes
// the answer itself (streams chunk by chunk), and the connection goes back
// to reading its next (possibly pipelined) request. Requests that answer at
// once (/health) run on the I/O thread, so they answer however busy the
// workers are.
//
//   HttpTransport t(service, options);
//   int port = t.bind("127.0.0.1", 0);
//   std::thread io([&] { t.run(); });   // serves until stop()
//   t.stop(std::chrono::seconds(3));
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "server/http_error.h"
#include "server/http_message.h"
#include "server/request_limits.h"

namespace m40::server {

// What the transport serves: the server's policy and routes.
class HttpService {
 public:
  virtual ~HttpService() = default;
  // A request's header was read and is within the limits; its body is not
  // read yet. An answer ends the request here (a refused origin or API key,
  // a CORS preflight). Runs on the I/O thread: must not wait.
  virtual std::optional<HttpResponse> screen(const HttpRequest& head) = 0;
  // Whether handle() answers this request without waiting on anything
  // (/health): then it runs on the I/O thread.
  virtual bool answers_at_once(const HttpRequest& head) const = 0;
  // The answer: on a worker thread unless answers_at_once().
  virtual void handle(HttpRequest& req, HttpResponse& res) = 0;
  // An error the transport answers itself (408, 413, 431, 503 over the
  // connection cap ...), in the shape of the route `head` names (null: no
  // header was read).
  virtual HttpResponse error_answer(const HttpRequest* head, const HttpError& error) = 0;
};

struct TransportOptions {
  RequestLimits limits;
  int workers = 16;  // handler threads (each also streams its answer)
};

class HttpTransport {
 public:
  HttpTransport(HttpService& service, TransportOptions options);
  ~HttpTransport();  // stop(0)
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Listens on host:port (0: a free port) and returns the port. No
  // SO_REUSEPORT: a port another server listens on fails with "address in
  // use". Throws m40::Error.
  int bind(const std::string& host, int port);
  // Serves on the calling thread until stop().
  void run();
  // Stops accepting and closes the connections that wait for a request;
  // the answers in progress go on.
  void stop_accepting();
  // stop_accepting(), then up to `grace` for the answers in progress to
  // end; then every connection is closed, run() returns and the workers
  // are joined (a handler still running is waited for). Idempotent.
  void stop(std::chrono::milliseconds grace);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace m40::server

// The server tests' in-process m40-llm server: 127.0.0.1, a free port, the
// CPU backend with two threads, `model` loaded as `serve MODEL` would; and a
// client for it.
#pragma once

#include <httplib.h>

#include <filesystem>
#include <memory>

#include "server/server.h"

namespace m40::test {

// Starts a server with `o` (host, port, backend and threads set here) and
// returns it; `port` is where it listens (0 when it could not start).
inline std::unique_ptr<server::Server> start_in_process_server(server::ServerOptions o,
                                                               const std::filesystem::path& model, int& port) {
  o.host = "127.0.0.1";
  o.port = 0;
  o.force_cpu = true;
  o.threads = 2;
  auto s = std::make_unique<server::Server>(o);
  s->load_model(model.string());
  port = s->start();
  return s;
}

inline httplib::Client local_client(int port, int read_timeout_s = 10, int connect_timeout_s = 2,
                                    int write_timeout_s = 5) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(connect_timeout_s);
  c.set_read_timeout(read_timeout_s);
  c.set_write_timeout(write_timeout_s);
  return c;
}

}  // namespace m40::test

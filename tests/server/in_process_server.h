// The server tests' in-process m40-llm server: 127.0.0.1, a free port, the
// CPU backend with two threads, an empty store of its own, a default model
// loaded as `serve MODEL` would; and a client for it. The fixtures of
// test_server, test_hostile_traffic, test_hostile_pulls and
// test_model_loading derive from InProcessServerTest.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "server/server.h"
#include "store/store_test_home.h"
#include "test_paths.h"

namespace m40::test {

// Starts a server with `o` (host, port, backend and threads set here) and
// returns it; `port` is where it listens (0 when it could not start).
// An empty `model`: no default model.
inline std::unique_ptr<server::Server> start_in_process_server(server::ServerOptions o,
                                                               const std::filesystem::path& model, int& port) {
  o.host = "127.0.0.1";
  o.port = 0;
  o.force_cpu = true;
  o.threads = 2;
  auto s = std::make_unique<server::Server>(o);
  if (!model.empty()) s->load_model(model.string());
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

inline std::filesystem::path tiny_q8_model() { return shared_model("TinyStories-656K-Q8_0.gguf"); }
inline std::filesystem::path tiny_q2_model() { return shared_model("TinyStories-656K-Q2_K.gguf"); }

// A test with one server at a time: SetUp skips the test when a model it
// needs is missing (and ignores SIGPIPE: a test may close a socket the
// server still writes to), TearDown stops the server.
class InProcessServerTest : public ::testing::Test {
 protected:
  using json = nlohmann::json;

  // The models the fixture's tests read (default: the Q8 TinyStories).
  virtual std::vector<std::filesystem::path> required_models() const { return {tiny_q8_model()}; }

  void SetUp() override {
    std::signal(SIGPIPE, SIG_IGN);
    for (const auto& m : required_models()) {
      if (!std::filesystem::exists(m)) GTEST_SKIP() << "shared model not found: " << m;
    }
  }
  void TearDown() override { stop_server(); }

  // Replaces the running server, if any.
  void start_server(const server::ServerOptions& o, const std::filesystem::path& default_model) {
    stop_server();
    server_ = start_in_process_server(o, default_model, port_);
    ASSERT_GT(port_, 0);
  }
  void stop_server() {
    if (server_) server_->stop();
  }

  httplib::Client client(int read_timeout_s = 10) const { return local_client(port_, read_timeout_s, 5, 10); }
  httplib::Result post(const std::string& path, const json& body, const httplib::Headers& headers = {}) const {
    return client().Post(path, headers, body.dump(), "application/json");
  }

  TempStoreHome home_;  // an empty store: the server's own
  std::unique_ptr<server::Server> server_;
  int port_ = 0;
};

}  // namespace m40::test

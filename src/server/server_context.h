// Internal to the server: what the route handlers share (options, router,
// the model manager). Not part of the library's interface.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "server/http_router.h"
#include "server/http_transport.h"
#include "server/model_manager.h"
#include "server/origin_policy.h"
#include "server/server_options.h"

namespace m40::server {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// Which error shape a route answers in.
enum class ApiFlavor { OpenAI, Ollama };

// What the routes share: the options, the router, the resident model and
// the counters. One per Server; the routes hold a reference.
struct ServerContext {
  explicit ServerContext(ServerOptions o) : options(std::move(o)), origins(options.origins), models(options) {}
  ServerOptions options;
  HttpRouter router;
  OriginPolicy origins;
  ModelManager models;
  std::unique_ptr<HttpService> service;      // the policy and routes the transport serves (front_door.h)
  std::unique_ptr<HttpTransport> transport;  // after the service and the models: stops first
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> http_requests{0};
  // /metrics reports tokens per second between one scrape and the next.
  std::mutex metrics_mutex;
  std::optional<std::pair<std::chrono::steady_clock::time_point, uint64_t>> last_scrape;  // time, generated tokens
  int bound_port = -1;
  std::thread listen_thread;
};

}  // namespace m40::server

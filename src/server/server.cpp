// The server's set-up: routes, front door and transport over one context;
// start, stop and the shutdown order.
#include "server/server.h"

#include <algorithm>

#include "common/error.h"
#include "server/front_door.h"
#include "server/routes.h"
#include "server/server_context.h"

namespace m40::server {

namespace {

ServerOptions checked(ServerOptions options) {
  if (options.parallel < 1) throw Error("--parallel must be at least 1");
  return options;
}

}  // namespace

// ---- Server ----------------------------------------------------------------

Server::Server(ServerOptions options) : state_(std::make_unique<ServerContext>(checked(std::move(options)))) {
  auto& s = *state_;
  const auto& o = s.options;
  register_ops_routes(s);
  register_openai_routes(s);
  register_ollama_routes(s);
  register_pull_route(s);
  register_embedding_routes(s);
  register_llama_cpp_routes(s);
  s.service = make_front_door(s);
  TransportOptions t;
  t.limits = o.limits;
  // Enough handler threads for every slot and queued request, plus a few
  // for quick routes; slow clients never hold one (the transport reads
  // whole requests before a handler runs).
  t.workers = o.http_threads > 0 ? o.http_threads : std::min(256, o.parallel + o.max_queue + 8);
  s.transport = std::make_unique<HttpTransport>(*s.service, t);
}

Server::~Server() { stop(); }

void Server::load_model(const std::string& ref) { state_->models.load_default(ref); }

bool Server::ready() const { return !state_->models.loading(); }

int Server::bind() {
  auto& s = *state_;
  if (s.bound_port < 0) s.bound_port = s.transport->bind(s.options.host, s.options.port);
  return s.bound_port;
}

void Server::listen() {
  bind();
  state_->transport->run();
}

int Server::start() {
  const int port = bind();
  state_->listen_thread = std::thread([this] { listen(); });
  return port;
}

void Server::stop() {
  auto& s = *state_;
  s.stopping.store(true);
  s.transport->stop_accepting();
  // Running requests end with an error event (streams) or 503; those
  // waiting for a model or a slot are refused.
  s.models.stop();
  // The answers in progress get a moment to write their last event; then
  // every connection closes, slow clients included.
  s.transport->stop(std::chrono::seconds(2));
  if (s.listen_thread.joinable()) s.listen_thread.join();
}

int Server::port() const { return state_->bound_port; }

}  // namespace m40::server

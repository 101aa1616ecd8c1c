// `m40-llm serve`: the HTTP server. It speaks the OpenAI API (/v1/...) and
// the Ollama API (/api/...), loading the model a request names on demand
// (ModelManager), with the engine's Scheduler doing the work; handler
// threads only parse, queue and stream. See docs/server.md for the routes.
//
//   m40::server::Server server(options);
//   server.load_model("model.gguf");   // optional: the default model, loaded now
//   int port = server.bind();          // port 0: a free one
//   server.listen();                   // blocks until stop()
#pragma once

#include <memory>
#include <string>

#include "server/server_options.h"

namespace m40::server {

struct ServerContext;  // server_context.h

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Loads the default model (a store name or a GGUF path: what requests
  // that name no model get) now. Throws m40::Error when it cannot be used.
  void load_model(const std::string& ref);
  // False while a model loads (/health answers 503 then).
  bool ready() const;

  // Binds host:port and returns the port (the chosen one for port 0).
  // Throws m40::Error when the address cannot be bound.
  int bind();
  // Serves until stop(). Binds first when bind() was not called.
  void listen();
  // bind() + listen() on a background thread; returns the port.
  int start();
  // Stops serving, ends running requests and joins the threads. Idempotent.
  void stop();
  int port() const;

 private:
  std::unique_ptr<ServerContext> state_;
};

}  // namespace m40::server

// Answers in each API's shape: JSON bodies, errors (OpenAI's or Ollama's),
// the handler wrapper that turns exceptions into them, ids and timestamps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "server/http_error.h"
#include "server/http_message.h"
#include "server/http_router.h"
#include "server/server_context.h"

namespace m40::server {

void send_json(HttpResponse& res, const json& body, int status = 200);
void send_error(HttpResponse& res, ApiFlavor flavor, const HttpError& error);
// The error shape of a path: OpenAI's under /v1/, else Ollama's.
ApiFlavor flavor_of(const std::string& path);
// Runs a handler, turning HttpError, bad JSON and other exceptions into
// error answers of the route's flavor.
HttpRouter::Handler route(ServerContext& s, ApiFlavor flavor,
                          std::function<void(const HttpRequest&, HttpResponse&)> handler);

std::string random_id(const char* prefix);
std::string rfc3339_now();
int64_t unix_now();

}  // namespace m40::server

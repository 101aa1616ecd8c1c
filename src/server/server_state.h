// Internal to the server: what the route handlers share (the loaded model,
// the scheduler), request-field parsing with type checks, and the streaming
// and error helpers. Not part of the library's interface.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "chat/model_template.h"
#include "engine/scheduler.h"
#include "model/loaded_model.h"
#include "server/http_error.h"
#include "server/http_message.h"
#include "server/http_router.h"
#include "server/http_transport.h"
#include "server/model_manager.h"
#include "server/origin_policy.h"
#include "server/server.h"
#include "tokenizer/vocab.h"

namespace m40::server {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// Which error shape a route answers in.
enum class ApiFlavor { OpenAI, Ollama };

struct Server::State {
  explicit State(ServerOptions o) : options(std::move(o)), origins(options.origins), models(options) {}
  ServerOptions options;
  HttpRouter router;
  OriginPolicy origins;
  ModelManager models;
  std::unique_ptr<HttpService> service;      // the policy and routes the transport serves (server.cpp)
  std::unique_ptr<HttpTransport> transport;  // after the service and the models: stops first
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> http_requests{0};
  // /metrics reports tokens per second between one scrape and the next.
  std::mutex metrics_mutex;
  std::optional<std::pair<std::chrono::steady_clock::time_point, uint64_t>> last_scrape;  // time, generated tokens
  int bound_port = -1;
  std::thread listen_thread;
};

// ---- request fields --------------------------------------------------------

// The request body as a JSON object, or HttpError 400.
json parse_body(const HttpRequest& req);
// Each returns nullopt for a missing or null field and throws HttpError 400
// naming the field when it has the wrong type. get_int saturates integers
// past int64 (2^63 would otherwise read as -2^63).
std::optional<double> get_number(const json& j, const char* key);
std::optional<int64_t> get_int(const json& j, const char* key);
std::optional<bool> get_bool(const json& j, const char* key);
std::optional<std::string> get_string(const json& j, const char* key);
// A string or a list of strings (OpenAI's and Ollama's `stop`).
std::vector<std::string> get_stop(const json& j, const char* key);
// An int64 request value narrowed to int32 by clamping, never by wrapping
// (2^32 + 1 would read as 1): for counts where "more than int32" means "no
// limit" (token limits, top_k, penalty windows).
inline int32_t clamp_to_int32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
}

// ---- generation ------------------------------------------------------------

// Queues a request; RequestRejected becomes HttpError (400 / 503).
// For a request with "truncate": true: a prompt that does not fit the
// context keeps its BOS and its last tokens, leaving room for the answer
// (the token limit, at most half the context). Shorter prompts are unchanged.
void truncate_prompt(const ResidentModel& m, engine::RequestParams& params);
std::shared_ptr<engine::RequestStream> submit(ResidentModel& m, engine::RequestParams params);

struct Completion {
  std::string text;
  engine::FinishReason finish_reason = engine::FinishReason::EndOfGeneration;
  engine::RequestTimings timings;
};
// Waits for the whole answer; HttpError 500 when the engine failed, 503
// when the server stops. A client that closes its connection meanwhile
// cancels the request.
Completion collect(Server::State& s, const HttpRequest& req, engine::RequestStream& stream);

// Streams the answer as chunks: `on_start` first (may be empty), `on_text`
// for each piece, then `on_end` for the Done event or `on_error` for a
// failure or the server stopping (the stream's last chunk: it ends an SSE
// stream with `data: [DONE]` itself). A client that goes away cancels the
// request. The lease keeps the model loaded until the stream ends.
struct StreamFormat {
  std::function<std::string()> on_start;
  std::function<std::string(const std::string& text)> on_text;
  std::function<std::string(const engine::StreamEvent& done)> on_end;
  std::function<std::string(const std::string& message)> on_error;
};
void stream_response(Server::State& s, HttpResponse& res, const char* content_type,
                     std::shared_ptr<engine::RequestStream> stream, std::shared_ptr<ModelLease> lease,
                     StreamFormat format);

// Renders chat messages (already checked: objects with string role and
// content) through the model's template and tokenizes the result
// (prompt_tokens.h: refused or cut before tokenizing when it cannot fit).
std::vector<int32_t> chat_prompt(ResidentModel& m, const json& messages, bool truncate);

// Tokens of a plain prompt (BOS as the vocabulary asks, special tokens parsed).
std::vector<int32_t> raw_prompt(ResidentModel& m, const std::string& text, bool truncate);

// ---- answers -----------------------------------------------------------------

void send_json(HttpResponse& res, const json& body, int status = 200);
void send_error(HttpResponse& res, ApiFlavor flavor, const HttpError& error);
// The error shape of a path: OpenAI's under /v1/, else Ollama's.
ApiFlavor flavor_of(const std::string& path);
// Runs a handler, turning HttpError, bad JSON and other exceptions into
// error answers of the route's flavor.
HttpRouter::Handler route(Server::State& s, ApiFlavor flavor,
                          std::function<void(const HttpRequest&, HttpResponse&)> handler);

// The request's model name field ("" when absent); 400 when it is no string
// or holds a NUL (a name or path with one would be cut short in the system).
std::string model_field(const json& body, const char* key = "model");

std::string random_id(const char* prefix);
std::string rfc3339_now();
int64_t unix_now();

void register_openai_routes(Server::State& s);
void register_ollama_routes(Server::State& s);
void register_pull_route(Server::State& s);

}  // namespace m40::server

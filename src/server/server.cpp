// The server's set-up (model, scheduler, HTTP), the operational routes
// (/health, /metrics, /tokenize, /detokenize) and the helpers the OpenAI and
// Ollama routes share.
#include "server/server.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>
#include <sstream>

#include "common/error.h"
#include "engine/backend_factory.h"
#include "server/prompt_tokens.h"
#include "server/server_state.h"

namespace m40::server {

// ---- request fields --------------------------------------------------------

json parse_body(const HttpRequest& req) {
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw HttpError{400, std::string("the request body is not valid JSON: ") + e.what()};
  }
  if (!body.is_object()) throw HttpError{400, "the request body must be a JSON object"};
  return body;
}

namespace {
[[noreturn]] void wrong_type(const char* key, const char* expected) {
  throw HttpError{400, std::string("'") + key + "' must be " + expected};
}
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

std::optional<double> get_number(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number");
  return v->get<double>();
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (v->is_number_unsigned()) return static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), kMax));
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    // Range-checked before the cast, which is undefined past int64.
    if (std::isfinite(d) && d == std::trunc(d)) {
      if (d >= 0x1p63) return kMax;
      if (d < -0x1p63) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(d);
    }
  }
  wrong_type(key, "an integer");
}

std::optional<bool> get_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "true or false");
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string");
  return v->get<std::string>();
}

std::vector<std::string> get_stop(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) wrong_type(key, "a string or a list of strings");
  std::vector<std::string> out;
  for (const auto& s : *v) {
    if (!s.is_string()) wrong_type(key, "a string or a list of strings");
    if (!s.get_ref<const std::string&>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

// ---- generation ------------------------------------------------------------

void truncate_prompt(const ResidentModel& m, engine::RequestParams& params) {
  const int n_ctx = m.scheduler->n_ctx();
  auto& prompt = params.prompt;
  if (static_cast<int>(prompt.size()) < n_ctx || n_ctx < 4) return;
  // Room to answer: the token limit when it is at most half the context,
  // else half the context.
  const int room = params.max_tokens > 0 ? std::min(params.max_tokens, n_ctx / 2) : n_ctx / 2;
  const int keep = n_ctx - room;
  const bool has_bos = prompt.front() == m.vocab->special().bos && m.vocab->special().bos != tokenizer::kNoToken;
  std::vector<int32_t> kept;
  kept.reserve(static_cast<size_t>(keep));
  if (has_bos) kept.push_back(prompt.front());
  kept.insert(kept.end(), prompt.end() - (keep - static_cast<int>(kept.size())), prompt.end());
  prompt = std::move(kept);
}

namespace {

// Sampler values that would overflow a logit of any real model (the
// sampler's own domain is wider: repeat_penalty 1e-40 is > 0, and turned a
// logit into +inf mid-answer, a 500 for the client's mistake). Logits are
// far below 1e6 in magnitude, so within these bounds every adjusted logit
// stays finite.
void check_sampling(const engine::SamplerParams& p) {
  auto within = [](const char* name, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) {
      throw HttpError{400, std::string("'") + name + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
                               ", got " + json(v).dump()};
    }
  };
  within("repeat_penalty", p.repeat_penalty, 1e-6, 1e6);
  within("presence_penalty", p.presence_penalty, -1e6, 1e6);
  within("frequency_penalty", p.frequency_penalty, -1e6, 1e6);
  for (const auto& [token, bias] : p.logit_bias) within("logit_bias", bias, -100, 100);  // OpenAI's range
}

}  // namespace

std::shared_ptr<engine::RequestStream> submit(ResidentModel& m, engine::RequestParams params) {
  using R = engine::RequestRejected::Reason;
  check_sampling(params.sampler);
  try {
    return m.scheduler->submit(std::move(params));
  } catch (const engine::RequestRejected& e) {
    switch (e.reason()) {
      case R::Invalid: throw HttpError{400, e.what()};
      case R::QueueFull: throw HttpError{503, e.what(), "server_busy", "queue_full"};
      case R::ShuttingDown: throw HttpError{503, e.what(), "server_error", "shutting_down"};
    }
    throw;
  }
}

Completion collect(Server::State& s, const HttpRequest& req, engine::RequestStream& stream) {
  Completion out;
  auto next_check = Clock::now() + std::chrono::milliseconds(100);
  std::vector<engine::StreamEvent> events;
  for (;;) {
    events.clear();
    const bool got = stream.wait(std::chrono::milliseconds(100), events);
    if (!got && s.stopping.load()) {
      stream.cancel();
      throw HttpError{503, "the server is shutting down", "server_error", "shutting_down"};
    }
    // Text may flow without pause, so the check goes by the clock.
    if (Clock::now() >= next_check) {
      next_check = Clock::now() + std::chrono::milliseconds(100);
      if (req.client_gone()) {
        // Nobody will read the answer: free the slot now.
        stream.cancel();
        throw HttpError{499, "the client closed the connection", "invalid_request_error", "client_closed"};
      }
    }
    for (auto& e : events) {
      switch (e.kind) {
        case engine::StreamEvent::Kind::Text: out.text += e.text; break;
        case engine::StreamEvent::Kind::Done:
          out.finish_reason = e.finish_reason;
          out.timings = e.timings;
          return out;
        case engine::StreamEvent::Kind::Failed:
          // Stopping ends every request with a failure: not the engine's fault.
          if (s.stopping.load()) throw HttpError{503, "the server is shutting down", "server_error", "shutting_down"};
          throw HttpError{500, e.text, "server_error"};
      }
    }
  }
}

void stream_response(Server::State& s, HttpResponse& res, const char* content_type,
                     std::shared_ptr<engine::RequestStream> stream, std::shared_ptr<ModelLease> lease,
                     StreamFormat format) {
  // Whatever ends the response (done, a failed write, a closed connection,
  // a dropped stream), the request must not keep its slot, nor the model.
  struct Release {
    std::shared_ptr<engine::RequestStream> stream;
    std::shared_ptr<ModelLease> lease;
    ~Release() {
      if (stream) stream->cancel();
      if (lease) lease->release();
    }
  };
  auto held = std::make_shared<Release>();
  held->stream = std::move(stream);
  held->lease = std::move(lease);
  res.set_header("Cache-Control", "no-cache");
  res.set_stream(content_type, [state = &s, held, format = std::move(format)](ResponseWriter& out) {
    auto& request = *held->stream;
    if (format.on_start && !out.write(format.on_start())) return;
    std::vector<engine::StreamEvent> events;
    for (;;) {
      events.clear();
      while (!request.wait(std::chrono::milliseconds(100), events)) {
        if (state->stopping.load()) {
          out.write(format.on_error("the server is shutting down"));
          return;
        }
        if (out.client_gone()) return;
      }
      std::string text;
      for (auto& e : events) {
        switch (e.kind) {
          case engine::StreamEvent::Kind::Text: text += format.on_text(e.text); break;
          case engine::StreamEvent::Kind::Done:
            out.write(text + format.on_end(e));
            return;
          case engine::StreamEvent::Kind::Failed:
            out.write(text + format.on_error(state->stopping.load() ? "the server is shutting down" : e.text));
            return;
        }
      }
      if (!out.write(text)) return;  // the client went away
    }
  });
}

std::vector<int32_t> chat_prompt(ResidentModel& m, const json& messages, bool truncate) {
  auto options = m.chat_template->options();
  options.add_generation_prompt = true;
  std::string text;
  try {
    text = m.chat_template->render(messages, options);
  } catch (const Error& e) {
    throw HttpError{400, std::string("the model's chat template could not render these messages: ") + e.what()};
  }
  // The rendered text carries BOS where the template wants it.
  return prompt_tokens(*m.vocab, m.max_token_bytes, m.scheduler->n_ctx(), text, false, truncate);
}

std::vector<int32_t> raw_prompt(ResidentModel& m, const std::string& text, bool truncate) {
  return prompt_tokens(*m.vocab, m.max_token_bytes, m.scheduler->n_ctx(), text, true, truncate);
}

// ---- answers -----------------------------------------------------------------

void send_json(HttpResponse& res, const json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(HttpResponse& res, ApiFlavor flavor, const HttpError& error) {
  if (flavor == ApiFlavor::OpenAI) {
    json code = error.code.empty() ? json(nullptr) : json(error.code);
    send_json(res, {{"error", {{"message", error.message}, {"type", error.type}, {"param", nullptr}, {"code", code}}}},
              error.status);
  } else {
    send_json(res, {{"error", error.message}}, error.status);
  }
}

ApiFlavor flavor_of(const std::string& path) { return path.rfind("/v1/", 0) == 0 ? ApiFlavor::OpenAI : ApiFlavor::Ollama; }

HttpRouter::Handler route(Server::State& s, ApiFlavor flavor, std::function<void(const HttpRequest&, HttpResponse&)> handler) {
  return [&s, flavor, handler = std::move(handler)](const HttpRequest& req, HttpResponse& res) {
    s.http_requests.fetch_add(1);
    try {
      handler(req, res);
    } catch (const HttpError& e) {
      send_error(res, flavor, e);
    } catch (const json::exception& e) {
      send_error(res, flavor, {400, std::string("bad request: ") + e.what()});
    } catch (const Error& e) {
      send_error(res, flavor, {400, e.what()});
    } catch (const std::exception& e) {
      send_error(res, flavor, {500, e.what(), "server_error"});
    }
  };
}

std::string model_field(const json& body, const char* key) {
  std::string name = get_string(body, key).value_or("");
  if (name.find('\0') != std::string::npos) throw HttpError{400, std::string("'") + key + "' must not contain a NUL character"};
  return name;
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() % 16];
  return id;
}

std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(now - secs).count();
  const std::time_t t = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[96];
  std::snprintf(out, sizeof out, "%s.%09lldZ", buf, static_cast<long long>(nanos));
  return out;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void parse_host_port(const std::string& text, std::string& host, int& port) {
  std::string rest = text;
  if (auto scheme = rest.find("://"); scheme != std::string::npos) rest = rest.substr(scheme + 3);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  auto unbracket = [](std::string h) {  // "[::1]" -> "::1"
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    return h;
  };
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || (rest.front() == '[' && rest.find(']') > colon)) {
    if (!rest.empty()) host = unbracket(rest);
    return;
  }
  if (colon > 0) host = unbracket(rest.substr(0, colon));
  const std::string p = rest.substr(colon + 1);
  if (p.empty()) return;
  try {
    size_t used = 0;
    const int value = std::stoi(p, &used);
    if (used != p.size() || value < 0 || value > 65535) throw std::out_of_range(p);
    port = value;
  } catch (const std::exception&) {
    throw Error("'" + text + "' has no valid port: use HOST:PORT with a port from 0 to 65535");
  }
}

// ---- the operational routes ------------------------------------------------

namespace {

void register_ops_routes(Server::State& s) {
  auto& http = s.router;
  // /health and /metrics answer at once, on the transport's I/O thread:
  // however busy the handler threads are, a liveness probe gets its answer.
  http.get("/health", route(s, ApiFlavor::Ollama, [&s](const HttpRequest&, HttpResponse& res) {
             if (s.models.loading()) {
               send_json(res, {{"status", "loading"}}, 503);
             } else {
               send_json(res, {{"status", "ok"}});
             }
           }), true);

  http.get("/metrics", route(s, ApiFlavor::Ollama, [&s](const HttpRequest&, HttpResponse& res) {
             const engine::SchedulerStats st = s.models.stats();
             std::ostringstream out;
             auto metric = [&](const char* name, const char* type, const char* help, auto value) {
               out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
                   << name << ' ' << value << '\n';
             };
             metric("m40_http_requests_total", "counter", "HTTP requests received.", s.http_requests.load());
             metric("m40_requests_total", "counter", "Generation requests accepted into the queue.", st.requests_total);
             metric("m40_requests_rejected_total", "counter", "Generation requests refused because the queue was full.",
                    st.requests_rejected);
             metric("m40_requests_cancelled_total", "counter", "Generation requests cancelled (client gone).",
                    st.requests_cancelled);
             metric("m40_requests_failed_total", "counter", "Generation requests ended by an engine error.",
                    st.requests_failed);
             metric("m40_prompt_tokens_total", "counter", "Prompt tokens processed.", st.prompt_tokens);
             metric("m40_generated_tokens_total", "counter", "Tokens generated.", st.generated_tokens);
             metric("m40_engine_steps_total", "counter", "Forward batches run by the engine.", st.steps);
             metric("m40_queue_depth", "gauge", "Requests waiting for a slot.", st.queue_depth);
             metric("m40_slots_busy", "gauge", "Slots generating or reading a prompt.", st.slots_busy);
             metric("m40_slots_total", "gauge", "Slots (requests served at the same time).", st.slots_total);
             const auto resident = s.models.resident();
             metric("m40_model_loaded", "gauge", "1 while a model is loaded.", resident ? 1 : 0);
             // Generation speed over the interval since the previous scrape
             // (0 at the first), as a gauge a dashboard can plot directly.
             double tokens_per_second = 0;
             {
               const auto now = std::chrono::steady_clock::now();
               std::lock_guard lock(s.metrics_mutex);
               if (s.last_scrape && st.generated_tokens >= s.last_scrape->second) {
                 const double seconds = std::chrono::duration<double>(now - s.last_scrape->first).count();
                 if (seconds > 0) tokens_per_second = static_cast<double>(st.generated_tokens - s.last_scrape->second) / seconds;
               }
               s.last_scrape = {now, st.generated_tokens};
             }
             metric("m40_generated_tokens_per_second", "gauge",
                    "Tokens generated per second since the previous scrape of /metrics.", tokens_per_second);
             const int64_t kv_cells = resident ? int64_t{resident->model->scheduler->n_ctx()} * st.slots_total : 0;
             metric("m40_kv_cache_cells", "gauge", "KV cache positions allocated (context x slots).", kv_cells);
             metric("m40_kv_cache_cells_used", "gauge", "KV cache positions the running requests hold.",
                    resident ? st.kv_cells_used : 0);
             res.set_content(out.str(), "text/plain; version=0.0.4");
           }), true);

  http.post("/tokenize", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
              const json body = parse_body(req);
              const auto content = get_string(body, "content");
              if (!content) throw HttpError{400, "'content' (the text to tokenize) is required"};
              const bool add_special = get_bool(body, "add_special").value_or(false);
              const bool parse_special = get_bool(body, "parse_special").value_or(true);
              const bool with_pieces = get_bool(body, "with_pieces").value_or(false);
              const auto lease = s.models.acquire(model_field(body), std::nullopt);
              const auto& vocab = lease->model().vocab;
              const auto tokens =
                  vocab->encode(*content, {.add_special = add_special, .parse_special = parse_special});
              json list = json::array();
              for (int32_t t : tokens) {
                if (with_pieces) {
                  list.push_back({{"id", t}, {"piece", vocab->piece(t, true)}});
                } else {
                  list.push_back(t);
                }
              }
              send_json(res, {{"tokens", list}});
            }));

  http.post("/detokenize", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
              const json body = parse_body(req);
              const auto lease = s.models.acquire(model_field(body), std::nullopt);
              const auto& vocab = lease->model().vocab;
              auto it = body.find("tokens");
              if (it == body.end() || !it->is_array()) throw HttpError{400, "'tokens' must be a list of token ids"};
              std::vector<int32_t> ids;
              for (const auto& t : *it) {
                if (!t.is_number_integer()) throw HttpError{400, "'tokens' must be a list of token ids"};
                const int64_t id = t.get<int64_t>();
                if (id < 0 || id >= static_cast<int64_t>(vocab->size())) {
                  throw HttpError{400, "token id " + std::to_string(id) + " is outside the vocabulary (0 to " +
                                           std::to_string(vocab->size() - 1) + ")"};
                }
                ids.push_back(static_cast<int32_t>(id));
              }
              send_json(res, {{"content", vocab->decode(ids)}});
            }));
}

}  // namespace

// ---- what the transport serves ----------------------------------------------

namespace {

// The front door: the origin, Host and API key checks on each request's
// header (before its body is read), then its route.
class ServerService : public HttpService {
 public:
  explicit ServerService(Server::State& s) : s_(s), loopback_(is_loopback_address(s.options.host)) {}

  std::optional<HttpResponse> screen(const HttpRequest& head) override {
    if (s_.options.log_requests) std::fprintf(stderr, "%s %s\n", head.method.c_str(), head.path.c_str());
    const ApiFlavor flavor = flavor_of(head.path);
    // DNS rebinding: a page of evil.example whose name now resolves to
    // 127.0.0.1 sends Host: evil.example.
    if (loopback_ && !host_allowed(head.header("Host"), s_.options.host)) {
      return refusal(head, flavor, {403, "the Host '" + head.header("Host").substr(0, 64) +
                                             "' is not this server's: use localhost or 127.0.0.1"});
    }
    const std::string origin = head.header("Origin");
    if (!origin.empty() && !s_.origins.allows(origin)) {
      return refusal(head, flavor, {403, "the origin '" + origin.substr(0, 128) +
                                             "' may not use this server: start it with --origins " + origin.substr(0, 128) +
                                             " (or M40_LLM_ORIGINS) to allow it"});
    }
    if (head.method == "OPTIONS") {
      if (!origin.empty()) return s_.origins.preflight(head);
      HttpResponse res;
      res.status = 204;
      res.set_header("Allow", "GET, POST, HEAD, OPTIONS");
      return res;
    }
    if (!authorized(head)) {
      const bool none = head.header("Authorization").empty() && head.header("x-api-key").empty();
      return refusal(head, flavor, {401, none ? "an API key is required: send 'Authorization: Bearer KEY'" : "the API key is not valid",
                                    "invalid_request_error", "invalid_api_key"});
    }
    return std::nullopt;
  }

  bool answers_at_once(const HttpRequest& head) const override {
    const auto* r = s_.router.find(head.method, head.path);
    return r != nullptr && r->answers_at_once;
  }

  void handle(HttpRequest& req, HttpResponse& res) override {
    const auto* r = s_.router.find(req.method, req.path, &req.params);
    if (r == nullptr) {
      send_error(res, flavor_of(req.path), {404, "no route for " + req.method + " " + req.path});
    } else {
      r->handler(req, res);
    }
    let_origin_read(req, res);
  }

  HttpResponse error_answer(const HttpRequest* head, const HttpError& error) override {
    HttpResponse res;
    send_error(res, head != nullptr ? flavor_of(head->path) : ApiFlavor::Ollama, error);
    if (head != nullptr) let_origin_read(*head, res);
    return res;
  }

 private:
  bool authorized(const HttpRequest& head) const {
    const std::string& key = s_.options.api_key;
    if (key.empty() || head.path == "/health") return true;
    if (head.header("x-api-key") == key) return true;
    // The scheme is case-insensitive (RFC 9110): "bearer KEY" is fine.
    const std::string auth = head.header("Authorization");
    return auth.size() == 7 + key.size() && iequals(std::string_view(auth).substr(0, 7), "Bearer ") &&
           std::string_view(auth).substr(7) == key;
  }

  HttpResponse refusal(const HttpRequest& head, ApiFlavor flavor, const HttpError& error) const {
    HttpResponse res;
    send_error(res, flavor, error);
    if (error.status != 403) let_origin_read(head, res);
    return res;
  }

  // An allowed page may read the answer (CORS).
  void let_origin_read(const HttpRequest& req, HttpResponse& res) const {
    const std::string origin = req.header("Origin");
    if (!origin.empty() && s_.origins.allows(origin)) OriginPolicy::allow_reading(res, origin);
  }

  Server::State& s_;
  bool loopback_;
};

ServerOptions checked(ServerOptions options) {
  if (options.parallel < 1) throw Error("--parallel must be at least 1");
  return options;
}

}  // namespace

// ---- Server ----------------------------------------------------------------

Server::Server(ServerOptions options) : state_(std::make_unique<State>(checked(std::move(options)))) {
  auto& s = *state_;
  const auto& o = s.options;
  register_ops_routes(s);
  register_openai_routes(s);
  register_ollama_routes(s);
  register_pull_route(s);
  s.service = std::make_unique<ServerService>(s);
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

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
#include "server/listen_backlog.h"
#include "server/server_state.h"

namespace m40::server {

// ---- request fields --------------------------------------------------------

json parse_body(const httplib::Request& req) {
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

std::shared_ptr<engine::RequestStream> submit(ResidentModel& m, engine::RequestParams params) {
  using R = engine::RequestRejected::Reason;
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

Completion collect(Server::State& s, const httplib::Request& req, engine::RequestStream& stream) {
  Completion out;
  ClientConnection client(req);
  auto next_check = Clock::now() + std::chrono::milliseconds(100);
  std::vector<engine::StreamEvent> events;
  for (;;) {
    events.clear();
    const bool got = stream.wait(std::chrono::milliseconds(100), events);
    if (!got && s.stopping.load()) {
      stream.cancel();
      throw HttpError{503, "the server is shutting down", "server_error"};
    }
    // Text may flow without pause, so the check goes by the clock.
    if (Clock::now() >= next_check) {
      next_check = Clock::now() + std::chrono::milliseconds(100);
      if (client.closed()) {
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
        case engine::StreamEvent::Kind::Failed: throw HttpError{500, e.text, "server_error"};
      }
    }
  }
}

void stream_response(Server::State& s, httplib::Response& res, const char* content_type,
                     std::shared_ptr<engine::RequestStream> stream, std::shared_ptr<ModelLease> lease,
                     StreamFormat format) {
  auto started = std::make_shared<bool>(false);
  Server::State* state = &s;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      content_type,
      [state, stream, format, started](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& text) {
          if (text.empty()) return true;
          if (sink.write(text.data(), text.size())) return true;
          stream->cancel();  // the client went away
          return false;
        };
        if (!*started) {
          *started = true;
          if (format.on_start && !write(format.on_start())) return false;
        }
        std::vector<engine::StreamEvent> events;
        while (!stream->wait(std::chrono::milliseconds(100), events)) {
          if (state->stopping.load() || !sink.is_writable()) {
            stream->cancel();
            return false;
          }
        }
        std::string out;
        for (auto& e : events) {
          switch (e.kind) {
            case engine::StreamEvent::Kind::Text: out += format.on_text(e.text); break;
            case engine::StreamEvent::Kind::Done:
              out += format.on_end(e);
              if (!write(out)) return false;
              sink.done();
              return true;
            case engine::StreamEvent::Kind::Failed:
              out += format.on_error(e.text);
              if (!write(out)) return false;
              sink.done();
              return true;
          }
        }
        return write(out);
      },
      // Whatever ended the response (done, a failed write, a closed
      // connection), the request must not keep its slot, nor the model.
      [stream, lease](bool) {
        stream->cancel();
        lease->release();
      });
}

std::vector<int32_t> chat_prompt(ResidentModel& m, const json& messages) {
  auto options = m.chat_template->options();
  options.add_generation_prompt = true;
  std::string text;
  try {
    text = m.chat_template->render(messages, options);
  } catch (const Error& e) {
    throw HttpError{400, std::string("the model's chat template could not render these messages: ") + e.what()};
  }
  // The rendered text carries BOS where the template wants it.
  return m.vocab->encode(text, {.add_special = false, .parse_special = true});
}

std::vector<int32_t> raw_prompt(ResidentModel& m, const std::string& text) {
  return m.vocab->encode(text, {.add_special = true, .parse_special = true});
}

// ---- answers -----------------------------------------------------------------

void send_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, ApiFlavor flavor, const HttpError& error) {
  if (flavor == ApiFlavor::OpenAI) {
    json code = error.code.empty() ? json(nullptr) : json(error.code);
    send_json(res, {{"error", {{"message", error.message}, {"type", error.type}, {"param", nullptr}, {"code", code}}}},
              error.status);
  } else {
    send_json(res, {{"error", error.message}}, error.status);
  }
}

httplib::Server::Handler route(Server::State& s, ApiFlavor flavor,
                               std::function<void(const httplib::Request&, httplib::Response&)> handler) {
  return [&s, flavor, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
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

std::string model_field(const json& body) {
  if (auto m = body.find("model"); m != body.end() && !m->is_null() && !m->is_string()) {
    throw HttpError{400, "'model' must be a string"};
  }
  return get_string(body, "model").value_or("");
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
  auto& http = s.http;
  http.Get("/health", route(s, ApiFlavor::Ollama, [&s](const httplib::Request&, httplib::Response& res) {
             if (s.models.loading()) {
               send_json(res, {{"status", "loading"}}, 503);
             } else {
               send_json(res, {{"status", "ok"}});
             }
           }));

  http.Get("/metrics", route(s, ApiFlavor::Ollama, [&s](const httplib::Request&, httplib::Response& res) {
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
           }));

  http.Post("/tokenize", route(s, ApiFlavor::Ollama, [&s](const httplib::Request& req, httplib::Response& res) {
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

  http.Post("/detokenize", route(s, ApiFlavor::Ollama, [&s](const httplib::Request& req, httplib::Response& res) {
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

// ---- Server ----------------------------------------------------------------

namespace {
ServerOptions checked(ServerOptions options) {
  if (options.parallel < 1) throw Error("--parallel must be at least 1");
  return options;
}
}  // namespace

Server::Server(ServerOptions options) : state_(std::make_unique<State>(checked(std::move(options)))) {
  auto& s = *state_;
  const auto& o = s.options;
  const int threads = o.http_threads > 0 ? o.http_threads : std::min(256, o.parallel + o.max_queue + 8);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.http.set_payload_max_length(o.max_body_bytes);
  // Each streamed token is a small write: without TCP_NODELAY, Nagle's
  // algorithm holds it until the client's (delayed) ACK of the previous one.
  s.http.set_tcp_nodelay(true);
  s.http.set_read_timeout(std::chrono::seconds(30));
  s.http.set_write_timeout(std::chrono::seconds(30));

  s.http.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (s.options.log_requests) std::fprintf(stderr, "%s %s\n", req.method.c_str(), req.path.c_str());
    if (s.options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string expected = "Bearer " + s.options.api_key;
    if (auth == expected || req.get_header_value("x-api-key") == s.options.api_key) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const bool openai = req.path.rfind("/v1/", 0) == 0;
    send_error(res, openai ? ApiFlavor::OpenAI : ApiFlavor::Ollama,
               {401, auth.empty() ? "an API key is required: send 'Authorization: Bearer KEY'" : "the API key is not valid",
                "invalid_request_error", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  s.http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const bool openai = req.path.rfind("/v1/", 0) == 0;
    std::string message;
    switch (res.status) {
      case 404: message = "no route for " + req.method + " " + req.path; break;
      case 413: message = "the request body is too large"; break;
      default: message = "the request could not be served (HTTP " + std::to_string(res.status) + ")"; break;
    }
    const int status = res.status;
    send_error(res, openai ? ApiFlavor::OpenAI : ApiFlavor::Ollama, {status, message});
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    const bool openai = req.path.rfind("/v1/", 0) == 0;
    send_error(res, openai ? ApiFlavor::OpenAI : ApiFlavor::Ollama, {500, message, "server_error"});
  });

  register_ops_routes(s);
  register_openai_routes(s);
  register_ollama_routes(s);
  register_pull_route(s);
}

Server::~Server() { stop(); }

void Server::load_model(const std::string& ref) { state_->models.load_default(ref); }

bool Server::ready() const { return !state_->models.loading(); }

int Server::bind() {
  auto& s = *state_;
  if (s.bound_port >= 0) return s.bound_port;
  int port = -1;
  if (s.options.port == 0) {
    port = s.http.bind_to_any_port(s.options.host);
  } else if (s.http.bind_to_port(s.options.host, s.options.port)) {
    port = s.options.port;
  }
  if (port <= 0) {
    throw Error("cannot listen on " + s.options.host + ":" + std::to_string(s.options.port) +
                ": the address is in use or not valid here; pick another with --host/--port");
  }
  s.bound_port = port;
  widen_listen_backlog(port);
  return port;
}

void Server::listen() {
  auto& s = *state_;
  bind();
  // in_listen before the stopping check, stop() sets them the other way
  // round: one of the two always sees the other.
  s.in_listen.store(true);
  if (!s.stopping.load()) s.http.listen_after_bind();
  s.in_listen.store(false);
}

int Server::start() {
  const int port = bind();
  state_->listen_thread = std::thread([this] { listen(); });
  // Bounded wait until the accept loop runs, so a client can connect at once.
  for (int i = 0; i < 500 && !state_->http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return port;
}

void Server::stop() {
  auto& s = *state_;
  s.stopping.store(true);
  // httplib's stop() does nothing until the accept loop runs: repeat it
  // (bounded) while a listen() is between its start and that loop.
  s.http.stop();
  for (int i = 0; i < 2000 && s.in_listen.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s.http.stop();
  }
  if (s.listen_thread.joinable()) s.listen_thread.join();
  s.models.stop();
}

int Server::port() const { return state_->bound_port; }

}  // namespace m40::server

// The front door: the origin, Host and API key checks on each request's
// header (before its body is read), then its route.
#include "server/front_door.h"

#include <cstdio>

#include "server/api_answers.h"

namespace m40::server {

namespace {

// The front door: the origin, Host and API key checks on each request's
// header (before its body is read), then its route.
class ServerService : public HttpService {
 public:
  explicit ServerService(ServerContext& s) : s_(s), loopback_(is_loopback_address(s.options.host)) {}

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

  ServerContext& s_;
  bool loopback_;
};

}  // namespace

std::unique_ptr<HttpService> make_front_door(ServerContext& s) { return std::make_unique<ServerService>(s); }

}  // namespace m40::server

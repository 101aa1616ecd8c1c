// Answers in each API's shape: JSON bodies, errors, ids and timestamps.
#include "server/api_answers.h"

#include <cstdio>
#include <ctime>
#include <random>

#include "common/error.h"

namespace m40::server {

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

HttpRouter::Handler route(ServerContext& s, ApiFlavor flavor, std::function<void(const HttpRequest&, HttpResponse&)> handler) {
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

}  // namespace m40::server

// POST /api/pull: a model into the store, as `m40-llm pull` does, with
// Ollama's answer: NDJSON status lines while it downloads
// ({"status": "pulling NAME", "total": N, "completed": M}) and
// {"status": "success"} at the end, or one JSON object with stream: false.
#include <chrono>
#include <cstdio>
#include <mutex>

#include "common/error.h"
#include "server/server_state.h"
#include "store/http_download.h"
#include "store/pull.h"

namespace m40::server {

namespace {

std::string ndjson_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

// Pull failures the client caused (a reference that names nothing, a source
// that answers 404) are 4xx; the rest are the server's.
HttpError pull_error(const std::exception& e) {
  if (dynamic_cast<const store::HttpStatusError*>(&e) != nullptr) return {404, e.what(), "invalid_request_error"};
  return {500, e.what(), "server_error"};
}

}  // namespace

void register_pull_route(Server::State& s) {
  s.router.post("/api/pull", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
    const json body = parse_body(req);
    std::string ref = model_field(body);
    if (ref.empty()) ref = model_field(body, "name");
    if (ref.empty()) throw HttpError{400, "'model' (what to pull: a store name, URL or hf.co/ORG/REPO) is required"};
    const bool stream = get_bool(body, "stream").value_or(true);
    store::PullOptions options;
    options.ref = ref;
    // Stopping the server stops the pull (the partial file stays, resumable).
    options.interrupted = [&s] { return s.stopping.load(); };
    try {
      store::parse_pull_ref(ref);  // a reference that names nothing is the client's mistake
    } catch (const Error& e) {
      throw HttpError{400, e.what()};
    }

    if (!stream) {
      try {
        store::pull_model(store::Store::from_environment(), options);
      } catch (const std::exception& e) {
        if (s.stopping.load()) throw HttpError{503, "the server is shutting down", "server_error", "shutting_down"};
        throw pull_error(e);
      }
      send_json(res, {{"status", "success"}});
      return;
    }
    // The pull runs inside the stream, on this handler's thread; status
    // lines go out as it reports progress (at most ~10 a second). A client
    // that leaves does not stop the pull: what was written is resumable.
    res.set_header("Cache-Control", "no-cache");
    res.set_stream(
        "application/x-ndjson", [options](ResponseWriter& out) mutable {
          bool client_gone = false;
          auto write = [&](const json& j) {
            if (!client_gone) client_gone = !out.write(ndjson_line(j));
          };
          write({{"status", "pulling manifest"}});
          const std::string label = "pulling " + options.ref;
          auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
          options.on_progress = [&](uint64_t done, std::optional<uint64_t> total) {
            const auto now = std::chrono::steady_clock::now();
            const bool complete = total && done >= *total;
            if (!complete && now - last < std::chrono::milliseconds(100)) return;
            last = now;
            json j = {{"status", label}};
            if (total) j["total"] = *total;
            j["completed"] = done;
            write(j);
          };
          try {
            const auto result = store::pull_model(store::Store::from_environment(), options);
            write({{"status", "verifying sha256 digest"}, {"digest", "sha256:" + result.manifest.sha256}});
            write({{"status", "writing manifest"}});
            write({{"status", "success"}});
          } catch (const std::exception& e) {
            write({{"error", e.what()}});
          }
        });
  }));
}

}  // namespace m40::server

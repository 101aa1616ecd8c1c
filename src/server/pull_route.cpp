// POST /api/pull: a model into the store, as `m40-llm pull` does, with
// Ollama's answer: NDJSON status lines while it downloads
// ({"status": "pulling NAME", "total": N, "completed": M}) and
// {"status": "success"} at the end, or one JSON object with stream: false.
//
// A request makes the server fetch from the network and write to its disk,
// so a pull is held to what the server was started with (docs/server.md,
// "Pulls and file paths"): public addresses only (every connection, redirects
// included, is checked at the address it is made to) unless
// --allow-private-pulls; no local files unless --allow-paths; at most the
// free space of the store's disk and --max-pull-size, judged from the
// declared length and from the GGUF header in the first bytes. A pull stops
// when its client leaves or the server stops (the partial file stays,
// resumable).
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>

#include "common/error.h"
#include "server/api_answers.h"
#include "server/request_fields.h"
#include "server/routes.h"
#include "store/http_download.h"
#include "store/pull.h"
#include "store/store.h"

namespace m40::server {

namespace {

std::string ndjson_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

// Pull failures the client caused (a reference that names nothing, a source
// that answers 404, an address or a file the server does not fetch, a
// redirect to another scheme, a pull of a name already being pulled) are
// 4xx; the rest are the server's.
HttpError pull_error(const std::exception& e) {
  if (dynamic_cast<const store::HttpStatusError*>(&e) != nullptr) return {404, e.what(), "invalid_request_error"};
  if (dynamic_cast<const store::AddressRefusedError*>(&e) != nullptr) {
    return {403, std::string(e.what()) + "; the server pulls from public addresses only (start it with --allow-private-pulls to allow others)",
            "invalid_request_error"};
  }
  if (dynamic_cast<const store::DownloadRefusedError*>(&e) != nullptr) return {400, e.what(), "invalid_request_error"};
  if (dynamic_cast<const store::BusyError*>(&e) != nullptr) return {409, e.what(), "invalid_request_error", "pull_running"};
  return {500, e.what(), "server_error"};
}

// Whether a reference reads as a local path, by its text alone.
bool looks_like_path(const std::string& ref) {
  return ref.starts_with('/') || ref.starts_with('.') || ref.starts_with('~') || store::is_gguf_file_name(ref);
}

// Whether the client left, asked at most every 100 ms (libcurl asks for
// every chunk that arrives); once gone, always gone.
class LeaveWatch {
 public:
  explicit LeaveWatch(std::function<bool()> gone) : gone_(std::move(gone)) {}
  bool operator()() {
    if (left_) return true;
    const auto now = Clock::now();
    if (now < next_) return false;
    next_ = now + std::chrono::milliseconds(100);
    left_ = gone_();
    return left_;
  }
  bool left() const { return left_; }

 private:
  std::function<bool()> gone_;
  Clock::time_point next_{};
  bool left_ = false;
};

}  // namespace

void register_pull_route(ServerContext& s) {
  s.router.post("/api/pull", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
    const json body = parse_body(req);
    std::string ref = model_field(body);
    if (ref.empty()) ref = model_field(body, "name");
    if (ref.empty()) throw HttpError{400, "'model' (what to pull: a store name, URL or hf.co/ORG/REPO) is required"};
    const bool stream = get_bool(body, "stream").value_or(true);
    const ServerOptions& o = s.options;
    store::PullOptions options;
    options.ref = ref;
    options.log = stderr;
    // Without --allow-paths a reference is never a path: the answer is the
    // same whether or not a file of that name exists.
    options.local_files = o.allow_paths;
    if (!o.allow_private_pulls) options.address_allowed = [](const sockaddr& a) { return store::is_public_address(a); };
    if (o.max_pull_size > 0) {
      options.max_size = store::SizeCap{o.max_pull_size, "the server's --max-pull-size of " + store::human_size(o.max_pull_size)};
    }
    try {
      store::parse_pull_ref(ref, o.allow_paths);  // a reference that names nothing is the client's mistake
    } catch (const Error& e) {
      std::string message = e.what();
      if (!o.allow_paths && looks_like_path(ref)) message += " (start the server with --allow-paths to pull local files)";
      throw HttpError{400, message};
    }

    if (!stream) {
      // Stopping the server, or the client leaving, stops the pull (the
      // partial file stays, resumable).
      auto left = std::make_shared<LeaveWatch>(req.client_gone);
      options.interrupted = [&s, left] { return s.stopping.load() || (*left)(); };
      try {
        store::pull_model(store::Store::from_environment(), options);
      } catch (const std::exception& e) {
        if (s.stopping.load()) throw HttpError{503, "the server is shutting down", "server_error", "shutting_down"};
        if (left->left()) throw HttpError{499, "the client closed the connection", "invalid_request_error", "client_closed"};
        throw pull_error(e);
      }
      send_json(res, {{"status", "success"}});
      return;
    }
    // The pull runs inside the stream, on this handler's thread; status
    // lines go out as it reports progress (at most ~10 a second).
    res.set_header("Cache-Control", "no-cache");
    res.set_stream(
        "application/x-ndjson", [options, &s](ResponseWriter& out) mutable {
          bool write_failed = false;
          LeaveWatch left([&out] { return out.client_gone(); });
          auto write = [&](const json& j) {
            if (!write_failed) write_failed = !out.write(ndjson_line(j));
          };
          // A client that leaves stops the pull: nobody would learn how it
          // ended, and a client could otherwise start pulls that outlive it.
          options.interrupted = [&] { return s.stopping.load() || write_failed || left(); };
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
            if (write_failed || left.left()) return;  // nobody reads the answer
            if (s.stopping.load()) {
              write({{"error", "the server is shutting down; pull again to resume"}});
              return;
            }
            write({{"error", pull_error(e).message}});
          }
        });
  }));
}

}  // namespace m40::server

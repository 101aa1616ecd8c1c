// A fake Hugging Face and Ollama registry on 127.0.0.1 (an ephemeral port),
// in the test process:
//   GET /api/models/ORG/REPO/tree/main   the file listing (LFS oid = sha256),
//                                        in pages of set_page_size() files
//                                        linked by Link: <...>; rel="next"
//   GET /ORG/REPO/resolve/main/FILE      the file, with Range support
//   GET /files/NAME                      a plain URL, with X-Linked-Etag
//   GET /redirect/NAME                   302 to /files/NAME
//   GET /go/NAME                         302 to any Location (add_redirect)
//   GET /v2/NS/MODEL/manifests/TAG       an Ollama registry manifest (add_ollama_model)
//   GET /v2/NS/MODEL/blobs/sha256:HEX    307 to /files/blobs/HEX, as the registry
//                                        redirects to its CDN
// Every file has an ETag (from its bytes, so a replaced file has a new one)
// and honours If-Range: a Range whose If-Range is not the current ETag is
// answered 200 with the whole file, as real servers do.
// It can drop the first connection halfway, serve corrupted bytes, answer
// 404 for a file it lists, declare
// a length its bytes do not have, send them chunked (no length), stall after
// some of them, and records every request with its Range and If-Range
// headers.
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "store/sha256.h"
#include "binary_runner.h"

namespace m40::test {

struct HubRequest {
  std::string path;
  std::string range;
  std::string if_range;
  std::string accept;
};

// One layer of a fake Ollama model: its media type and bytes.
struct OllamaLayerBytes {
  std::string media_type;
  std::string bytes;
};

class FakeHub {
 public:
  struct Served {
    std::string bytes;
    std::string sha256;       // of the real bytes (what the listing says)
    bool drop_first = false;  // first request: half the bytes, then close
    bool corrupt = false;     // serve one byte changed
    bool stall_at_half = false;  // send half the bytes, then wait for release_stalls()
    bool stall_at_start = false;  // headers only, then wait for release_stalls()
    std::string linked_etag;  // X-Linked-Etag on /files/
    std::string etag;         // "\"<first 16 hex of sha256>\""; empty: no ETag header
    // The whole file, without Range support: Content-Length this instead of
    // the real size (the bytes end where they end, then the connection closes).
    std::optional<uint64_t> declared_length;
    bool chunked = false;  // no Content-Length: chunked transfer encoding, whole file
    // With declared_length or chunked: send this many bytes, then wait for
    // release_stalls() and close.
    std::optional<size_t> stall_after;
    bool not_served = false;  // listed, but its download answered 404 (gone in between)
  };

  FakeHub() {
    server_.Get(R"(/api/models/([^/]+)/([^/]+)/tree/main)", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      const std::string prefix = req.matches[1].str() + "/" + req.matches[2].str() + "/";
      std::lock_guard lock(mutex_);
      std::vector<std::string> entries;
      for (const auto& [key, f] : files_) {
        if (key.rfind(prefix, 0) != 0) continue;
        entries.push_back(R"({"type":"file","oid":"0","size":134,"path":")" + key.substr(prefix.size()) +
                          R"(","lfs":{"oid":")" + f.sha256 + R"(","size":)" + std::to_string(f.bytes.size()) +
                          R"(,"pointerSize":134}})");
      }
      if (entries.empty()) {
        res.status = 404;
        res.set_content(R"({"error":"Repository not found"})", "application/json");
        return;
      }
      // Like Hugging Face: an opaque cursor in the query, the next page's
      // full URL in the Link header, no Link on the last page.
      const size_t first = req.has_param("cursor") ? std::stoul(req.get_param_value("cursor")) : 0;
      const size_t count = page_size_ == 0 ? entries.size() : page_size_;
      const size_t last = std::min(entries.size(), first + count);
      std::string json = "[";
      for (size_t i = first; i < last; ++i) json += (i > first ? "," : "") + entries[i];
      json += "]";
      if (last < entries.size()) {
        res.set_header("Link", "<" + endpoint() + req.path + "?recursive=true&cursor=" + std::to_string(last) +
                                   ">; rel=\"next\"");
      }
      res.set_content(json, "application/json");
    });
    server_.Get(R"(/([^/]+)/([^/]+)/resolve/main/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      serve(req.matches[1].str() + "/" + req.matches[2].str() + "/" + req.matches[3].str(), req, res);
    });
    server_.Get(R"(/files/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      serve("files/" + req.matches[1].str(), req, res);
    });
    server_.Get(R"(/redirect/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      res.set_redirect("/files/" + req.matches[1].str(), 302);
    });
    server_.Get(R"(/go/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      std::lock_guard lock(mutex_);
      const auto it = redirects_.find(req.matches[1].str());
      if (it == redirects_.end()) {
        res.status = 404;
        return;
      }
      res.status = 302;
      res.set_header("Location", it->second);
    });
    server_.Get(R"(/v2/(.+)/manifests/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      std::lock_guard lock(mutex_);
      const auto it = manifests_.find(req.matches[1].str() + ":" + req.matches[2].str());
      if (it == manifests_.end()) {
        res.status = 404;
        res.set_content(R"({"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]})", "application/json");
        return;
      }
      res.set_content(it->second, "application/vnd.docker.distribution.manifest.v2+json");
    });
    server_.Get(R"(/v2/(.+)/blobs/sha256:([0-9a-f]{64}))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      std::lock_guard lock(mutex_);
      if (files_.count("files/blobs/" + req.matches[2].str()) == 0) {
        res.status = 404;
        res.set_content(R"({"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]})", "application/json");
        return;
      }
      res.set_redirect("/files/blobs/" + req.matches[2].str(), 307);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeHub() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    stall_released_.notify_all();
    server_.stop();
    thread_.join();
  }
  FakeHub(const FakeHub&) = delete;
  FakeHub& operator=(const FakeHub&) = delete;

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Serves `bytes` at KEY ("ORG/REPO/FILE" or "files/NAME").
  Served& add(const std::string& key, std::string bytes) {
    std::lock_guard lock(mutex_);
    Served s;
    store::Sha256 hash;
    hash.update(bytes.data(), bytes.size());
    s.sha256 = hash.hex_digest();
    s.etag.append(1, '"').append(s.sha256, 0, 16).append(1, '"');  // (operator+ here trips GCC 12's -Wrestrict)
    s.bytes = std::move(bytes);
    return files_[key] = std::move(s);
  }
  Served& add_file(const std::string& key, const std::filesystem::path& path) { return add(key, read_text_file(path)); }
  // Neither listed nor served any more.
  void remove(const std::string& key) {
    std::lock_guard lock(mutex_);
    files_.erase(key);
  }

  // GET /go/NAME answers 302 with this Location, as it is (any scheme, any host).
  void add_redirect(const std::string& name, const std::string& location) {
    std::lock_guard lock(mutex_);
    redirects_[name] = location;
  }
  std::string redirect_url(const std::string& name) const { return endpoint() + "/go/" + name; }

  // Serves the Ollama manifest of REPOSITORY:TAG ("library/qwen3", "8b")
  // listing `layers`, each blob named by its sha256 and served at
  // /files/blobs/<sha256> (where blob(sha256) finds it to make it stall,
  // drop or lie). Returns the manifest.
  std::string add_ollama_model(const std::string& repository, const std::string& tag,
                               const std::vector<OllamaLayerBytes>& layers) {
    nlohmann::ordered_json json_layers = nlohmann::ordered_json::array();
    for (const auto& layer : layers) {
      const std::string sha = add("files/blobs/" + sha256_of(layer.bytes), layer.bytes).sha256;
      json_layers.push_back({{"mediaType", layer.media_type}, {"digest", "sha256:" + sha}, {"size", layer.bytes.size()}});
    }
    const std::string config = "{}";
    add("files/blobs/" + sha256_of(config), config);
    const nlohmann::ordered_json manifest = {
        {"schemaVersion", 2},
        {"mediaType", "application/vnd.docker.distribution.manifest.v2+json"},
        {"config", {{"mediaType", "application/vnd.docker.container.image.v1+json"},
                    {"digest", "sha256:" + sha256_of(config)},
                    {"size", config.size()}}},
        {"layers", json_layers}};
    set_ollama_manifest(repository, tag, manifest.dump());
    return manifest.dump();
  }
  // Serves `json` as the manifest of REPOSITORY:TAG, as it is.
  void set_ollama_manifest(const std::string& repository, const std::string& tag, const std::string& json) {
    std::lock_guard lock(mutex_);
    manifests_[repository + ":" + tag] = json;
  }
  Served& blob(const std::string& sha256) {
    std::lock_guard lock(mutex_);
    return files_.at("files/blobs/" + sha256);
  }
  static std::string sha256_of(const std::string& bytes) {
    store::Sha256 hash;
    hash.update(bytes.data(), bytes.size());
    return hash.hex_digest();
  }

  // Downloads that stall halfway close their connection and stop stalling.
  void release_stalls() {
    {
      std::lock_guard lock(mutex_);
      for (auto& [key, f] : files_) {
        f.stall_at_half = f.stall_at_start = false;
        f.stall_after.reset();
      }
    }
    stall_released_.notify_all();
  }

  // Listings come in pages of this many files (0: all on one page).
  void set_page_size(size_t files) {
    std::lock_guard lock(mutex_);
    page_size_ = files;
  }

  std::vector<HubRequest> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  std::vector<HubRequest> requests_for(const std::string& path) const {
    std::vector<HubRequest> out;
    for (const auto& r : requests()) {
      if (r.path == path) out.push_back(r);
    }
    return out;
  }

 private:
  void record(const httplib::Request& req) {
    std::lock_guard lock(mutex_);
    requests_.push_back({req.path, req.get_header_value("Range"), req.get_header_value("If-Range"),
                         req.get_header_value("Accept")});
  }

  void serve(const std::string& key, const httplib::Request& req, httplib::Response& res) {
    std::lock_guard lock(mutex_);
    const auto it = files_.find(key);
    if (it == files_.end() || it->second.not_served) {
      res.status = 404;
      res.set_content("Entry not found", "text/plain");
      return;
    }
    Served& f = it->second;
    if (!f.linked_etag.empty()) res.set_header("X-Linked-Etag", "\"" + f.linked_etag + "\"");
    if (!f.etag.empty()) res.set_header("ETag", f.etag);
    if (req.has_header("If-Range") && req.get_header_value("If-Range") != f.etag) {
      // httplib 0.11 knows no If-Range: drop the range so that it sends all.
      const_cast<httplib::Request&>(req).ranges.clear();
    }
    std::string bytes = f.bytes;
    if (f.corrupt) bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
    if (f.declared_length || f.chunked) {
      auto data = std::make_shared<std::string>(std::move(bytes));
      const size_t stall = f.stall_after.value_or(data->size());
      // Sends what it has from `offset`, up to the stall; then waits for
      // release_stalls() (or the end) and closes the connection.
      auto provide = [this, data, stall, key](size_t offset, httplib::DataSink& sink) {
        const size_t end = std::min(stall, data->size());
        if (offset < end) {
          sink.write(data->data() + offset, std::min<size_t>(end - offset, 16384));
          return true;
        }
        if (stall < data->size()) {
          std::unique_lock stall_lock(mutex_);
          stall_released_.wait(stall_lock, [&] { return stopping_ || !files_[key].stall_after; });
        }
        return false;
      };
      if (f.chunked) {
        // httplib counts the bytes written as the offset.
        res.set_chunked_content_provider("application/octet-stream",
                                         [provide, size = data->size()](size_t offset, httplib::DataSink& sink) {
                                           if (offset < size) return provide(offset, sink);
                                           sink.done();
                                           return true;
                                         });
      } else {
        res.set_content_provider(*f.declared_length, "application/octet-stream",
                                 [provide](size_t offset, size_t, httplib::DataSink& sink) { return provide(offset, sink); });
      }
      return;
    }
    if (f.drop_first) {
      f.drop_first = false;
      auto data = std::make_shared<std::string>(std::move(bytes));
      const size_t half = data->size() / 2;
      res.set_content_provider(data->size(), "application/octet-stream",
                               [data, half](size_t offset, size_t length, httplib::DataSink& sink) {
                                 if (offset >= half) return false;  // close the connection mid-body
                                 sink.write(data->data() + offset, std::min(length, half - offset));
                                 return true;
                               });
      return;
    }
    if (f.stall_at_half || f.stall_at_start) {
      auto data = std::make_shared<std::string>(std::move(bytes));
      const size_t half = f.stall_at_start ? 0 : data->size() / 2;
      res.set_content_provider(data->size(), "application/octet-stream",
                               [this, data, half, key](size_t offset, size_t length, httplib::DataSink& sink) {
                                 if (offset < half) {
                                   sink.write(data->data() + offset, std::min(length, half - offset));
                                   return true;
                                 }
                                 std::unique_lock stall_lock(mutex_);
                                 stall_released_.wait(stall_lock, [&] { return stopping_ || !(files_[key].stall_at_half || files_[key].stall_at_start); });
                                 return false;  // close the connection
                               });
      return;
    }
    // httplib answers a Range request with 206 and the slice asked for.
    res.set_content(std::move(bytes), "application/octet-stream");
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable stall_released_;
  bool stopping_ = false;
  std::map<std::string, Served> files_;
  std::map<std::string, std::string> manifests_;  // "library/qwen3:8b" -> JSON
  std::map<std::string, std::string> redirects_;  // /go/NAME -> Location
  size_t page_size_ = 0;
  std::vector<HubRequest> requests_;
};

}  // namespace m40::test

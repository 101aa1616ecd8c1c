// What `m40-llm serve` is told: address, slots, limits, policies. The
// server's parts below Server (model manager, routes) read these.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/backend_factory.h"
#include "server/keep_alive.h"
#include "server/request_limits.h"

namespace m40::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 11434;          // 0: any free port
  int parallel = 1;          // requests generated at the same time (KV slots)
  int n_ctx = 0;             // positions per request at most; 0: the trained context, capped by memory
  unsigned threads = 0;      // CPU backend threads; 0: every core
  bool force_cpu = false;
  int gpu = -1;              // GPU index; -1: $M40_LLM_DEVICE, else 0
  int gpu_layers = -1;       // layers on the GPU (engine::BackendOptions::gpu_layers); -1: all that fit
  std::vector<int> gpus;             // engine::BackendOptions::gpus
  std::vector<double> tensor_split;  // engine::BackendOptions::tensor_split
  engine::SplitMode split_mode = engine::SplitMode::Auto;  // engine::BackendOptions::split_mode
  uint64_t vram_budget = 0;  // bytes of GPU memory a model may plan for; 0: the GPU's free memory
  // The paged KV pool the requests share (engine::BackendOptions): bytes, or
  // a fraction of the memory left after the weights; both 0: the default.
  uint64_t kv_pool_bytes = 0;
  double kv_pool_fraction = 0;
  backend::KvType kv_type = backend::KvType::F16;  // --kv-type: F16 or Q8_0
  std::string api_key;       // non-empty: every route but /health needs "Authorization: Bearer KEY"
  // Web pages (Origin) allowed besides local ones (origin_policy.h):
  // "https://app.example.com", "https://*.example.com", "*" for any.
  std::vector<std::string> origins;
  int max_queue = 16;        // requests waiting for a slot; more get 503
  int prefill_chunk = 256;   // prompt tokens per engine step
  double prefill_slowdown = 2.0;  // engine::SchedulerOptions::prefill_slowdown; 0: pacing off
  RequestLimits limits;      // sizes, deadlines and connection caps per client (request_limits.h)
  int http_threads = 0;      // handler threads; 0: enough for every slot and queued request, plus a few
  bool log_requests = false; // one line per request on stderr
  std::string chat_template; // non-empty: this Jinja chat template for every model instead of its own
  KeepAlive keep_alive;      // how long an idle model stays loaded (a request's keep_alive overrides)
  // What a request may make the server read or fetch (docs/server.md,
  // "Pulls and file paths"):
  // a request's `model` may be a GGUF file path (generate, chat, show,
  // tokenize ...) and /api/pull may copy a local file. Off: requests name
  // store models only, and the answer for a path is the same whether or
  // not the file exists. The default model given to load_model() is
  // allowed either way.
  bool allow_paths = false;
  // /api/pull may connect to loopback, private, link-local and other
  // non-public addresses (store::is_public_address), redirects included.
  bool allow_private_pulls = false;
  // The largest model file /api/pull downloads, in bytes; 0: no cap but the
  // free space of the store's disk (which always applies).
  uint64_t max_pull_size = 0;
  // Wraps the backend load_model() builds (tests use it for a slow or gated
  // backend); empty: the backend as built.
  std::function<std::unique_ptr<backend::Backend>(std::unique_ptr<backend::Backend>)> wrap_backend;
};

// "host:port" (as in $M40_LLM_HOST / $OLLAMA_HOST) into host and port;
// a missing part keeps the value given. Throws m40::Error for a bad port.
void parse_host_port(const std::string& text, std::string& host, int& port);

}  // namespace m40::server

// `m40-llm serve [MODEL]`: the HTTP server (OpenAI and Ollama APIs) until
// Ctrl-C or SIGTERM. Requests load the model they name on demand; MODEL,
// when given, is loaded at start and answers requests that name none.
// See docs/server.md.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "common/error.h"
#include "common/memory_size.h"
#include "engine/backend_factory.h"
#include "server/origin_policy.h"
#include "server/server.h"

namespace m40::cli {

namespace {

struct ServeOptions {
  std::string model;
  std::string keep_alive;
  DeviceFlags devices;  // --cpu, --gpu, --gpus, --tensor-split, --split-mode, --gpu-layers, --vram
  std::string origins;
  std::string max_pull_size;
  std::string kv_pool;
  std::string kv_type = "f16";
  std::string chat_template_file;
  server::ServerOptions server;
  bool host_given = false;
  bool port_given = false;
};

int run_serve(ServeOptions o) {
  auto& so = o.server;
  {
    engine::BackendOptions devices;
    apply_device_flags(o.devices, devices);
    so.force_cpu = devices.force_cpu;
    so.gpu = devices.gpu;
    so.gpus = devices.gpus;
    so.tensor_split = devices.tensor_split;
    so.split_mode = devices.split_mode;
    so.gpu_layers = devices.gpu_layers;
    so.vram_budget = devices.vram_budget;
  }
  if (!o.max_pull_size.empty()) so.max_pull_size = parse_memory_size(o.max_pull_size);
  so.kv_type = engine::kv_type_from_name(o.kv_type);
  if (!o.chat_template_file.empty()) {
    std::ifstream in(o.chat_template_file, std::ios::binary);
    if (!in) throw Error("--chat-template-file " + o.chat_template_file + ": cannot read the file");
    so.chat_template = std::string(std::istreambuf_iterator<char>(in), {});
    // Checked now rather than at the first request.
    (void)chat::ChatTemplate(so.chat_template);
  }
  if (!o.kv_pool.empty()) {
    if (o.kv_pool.back() == '%') {
      char* end = nullptr;
      const double percent = std::strtod(o.kv_pool.c_str(), &end);
      if (end != o.kv_pool.c_str() + o.kv_pool.size() - 1 || !(percent > 0 && percent <= 100)) {
        throw Error("--kv-pool " + o.kv_pool + ": give a size such as 8G or a share such as 60% (above 0, at most 100)");
      }
      so.kv_pool_fraction = percent / 100;
    } else {
      so.kv_pool_bytes = parse_memory_size(o.kv_pool);
    }
  }
  // $M40_LLM_HOST=host:port, overridden by --host / --port.
  if (const char* env = std::getenv("M40_LLM_HOST"); env != nullptr && *env != '\0') {
    std::string host = so.host;
    int port = so.port;
    server::parse_host_port(env, host, port);
    if (!o.host_given) so.host = host;
    if (!o.port_given) so.port = port;
  }
  // --keep-alive, else $M40_LLM_KEEP_ALIVE (Ollama's OLLAMA_KEEP_ALIVE), else 5m.
  if (o.keep_alive.empty()) {
    if (const char* env = std::getenv("M40_LLM_KEEP_ALIVE"); env != nullptr) o.keep_alive = env;
  }
  if (!o.keep_alive.empty()) so.keep_alive = server::parse_keep_alive(o.keep_alive);
  // --origins, else $M40_LLM_ORIGINS (Ollama's OLLAMA_ORIGINS): web pages
  // allowed besides local ones.
  if (o.origins.empty()) {
    if (const char* env = std::getenv("M40_LLM_ORIGINS"); env != nullptr) o.origins = env;
  }
  so.origins = server::OriginPolicy::parse_list(o.origins);
  // SIGINT / SIGTERM go to one waiting thread that stops the server cleanly;
  // a client that vanishes mid-write must not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  server::Server srv(so);
  const int port = srv.bind();
  if (o.model.empty()) {
    std::fprintf(stderr, "m40-llm: listening on http://%s:%d (models load on demand)\n", so.host.c_str(), port);
  } else {
    std::fprintf(stderr, "m40-llm: listening on http://%s:%d (loading %s)\n", so.host.c_str(), port, o.model.c_str());
  }
  // /health answers 503 while the model loads.
  std::thread http([&srv] { srv.listen(); });
  std::thread waiter([&srv, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "m40-llm: stopping\n");
    // Stopping ends the answers in progress within about two seconds, but
    // a model load cannot be interrupted: a second signal, or 10 s, exits
    // at once.
    std::thread([signals] {
      timespec wait{10, 0};
      sigtimedwait(&signals, nullptr, &wait);
      std::fprintf(stderr, "m40-llm: exiting without waiting\n");
      std::_Exit(0);
    }).detach();
    srv.stop();
  });
  try {
    if (!o.model.empty()) srv.load_model(o.model);
  } catch (...) {
    srv.stop();
    http.join();
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    throw;
  }
  std::fprintf(stderr, "m40-llm: ready (%d parallel request%s per model)\n", so.parallel, so.parallel == 1 ? "" : "s");
  http.join();
  // The server stopped on its own (not by a signal): release the waiter.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return 0;
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  auto& so = opts->server;
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve models over HTTP with the OpenAI and Ollama APIs; a request's 'model' is loaded on demand");
  cmd->add_option("MODEL", opts->model,
                  "Store name or GGUF file loaded at start, for requests that name no model (optional)");
  auto* host = cmd->add_option("--host", so.host, "Address to listen on ($M40_LLM_HOST=host:port also works)")
                   ->capture_default_str();
  auto* port = cmd->add_option("--port", so.port, "Port to listen on; 0 picks a free one")->capture_default_str();
  cmd->add_option("--parallel,-p", so.parallel, "Requests generated at the same time (slots; they share the paged KV pool)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--ctx", so.n_ctx, "The most tokens one request may use (default: the model's trained context, capped by what the GPU or RAM holds for one sequence; the --parallel slots share the KV pool)");
  cmd->add_option("--queue", so.max_queue, "Requests that may wait for a slot; more are answered 503")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", so.prefill_chunk, "Prompt tokens per engine step (keeps streams flowing)")
      ->capture_default_str();
  cmd->add_option("--prefill-slowdown", so.prefill_slowdown,
                  "While other requests are generating, a step that also reads a prompt may take up to FACTOR "
                  "times as long as one that does not: prompt chunks are sized from measured step times to stay "
                  "within it, so running streams keep their pace while a long prompt is read (a chunk of up to "
                  "--prefill-chunk tokens a few layers a step, where the backend runs layer slices); not while more "
                  "requests wait for their prompt than generate (a burst). 0 turns pacing off (every step takes up to "
                  "--prefill-chunk prompt tokens)")
      ->type_name("FACTOR")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            char* end = nullptr;
            const double factor = std::strtod(value.c_str(), &end);
            if (end == value.c_str() || *end != '\0' || !(factor >= 0)) {
              return "'" + value + "' is not a factor: give 0 (pacing off) or a number such as 2";
            }
            return {};
          },
          ""));
  cmd->add_option("-t,--threads", so.threads, "CPU threads (default: every core)");
  cmd->add_option("--api-key", so.api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--origins", opts->origins,
                  "Web pages (Origin) that may use the server from a browser besides local ones, comma-separated: "
                  "https://app.example.com,https://*.example.com; * for any. $M40_LLM_ORIGINS also works");
  cmd->add_option("--keep-alive", opts->keep_alive,
                  "How long an idle model stays loaded: 5m, 1h, 30s, 0 (unload at once), -1 (forever); "
                  "$M40_LLM_KEEP_ALIVE also works; default 5m");
  add_device_flags(cmd, opts->devices);
  cmd->add_flag("--allow-paths", so.allow_paths,
                "Let a request's 'model' name a GGUF file on this machine (generate, chat, show, tokenize ...) and "
                "/api/pull copy a local file; without it requests name store models only (the MODEL argument may be a file "
                "either way)");
  cmd->add_flag("--allow-private-pulls", so.allow_private_pulls,
                "Let /api/pull connect to loopback, private and link-local addresses (127.0.0.0/8, 10.0.0.0/8, "
                "192.168.0.0/16, 169.254.0.0/16, fc00::/7 ...); without it every connection of a pull, redirects "
                "included, must go to a public address");
  cmd->add_option("--max-pull-size", opts->max_pull_size,
                  "The largest model file /api/pull downloads, e.g. 40G (default: no cap but the free space of the "
                  "store's disk, which always applies)")
      ->type_name("SIZE");
  cmd->add_option("--kv-pool", opts->kv_pool,
                  "Memory for the paged KV cache that the requests share: a size such as 8G, or a share of the memory "
                  "left after the weights such as 60% (default: a whole --ctx for every --parallel slot where that "
                  "fits, else all the memory left)")
      ->type_name("SIZE|N%");
  cmd->add_option("--kv-type", opts->kv_type, "KV cache element type: f16, q8_0 (half the memory: longer contexts) or f32 (CPU only)")
      ->capture_default_str();
  cmd->add_option("--chat-template-file", opts->chat_template_file,
                  "A Jinja chat template used for every model instead of its own (as llama-server's option)");
  cmd->add_flag("--verbose", so.log_requests, "Log each request on stderr");
  cmd->callback([opts, host, port] {
    opts->host_given = host->count() > 0;
    opts->port_given = port->count() > 0;
    set_command_action([opts] { return run_serve(*opts); });
  });
}

}  // namespace m40::cli

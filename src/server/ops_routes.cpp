// The operational routes: /health, /metrics, /tokenize, /detokenize.
#include <sstream>

#include "backends/kv_blocks.h"
#include "server/api_answers.h"
#include "server/prompt_tokens.h"
#include "server/request_fields.h"
#include "server/routes.h"

namespace m40::server {

void register_ops_routes(ServerContext& s) {
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
             metric("m40_prompt_tokens_total", "counter", "Prompt tokens evaluated.", st.prompt_tokens);
             metric("m40_prompt_tokens_cached_total", "counter", "Prompt tokens read from cached KV blocks instead of evaluated.",
                    st.prompt_tokens_cached);
             const uint64_t prompt_read = st.prompt_tokens + st.prompt_tokens_cached;
             metric("m40_prompt_cache_hit_ratio", "gauge", "Share of prompt tokens taken from cached KV blocks, since start.",
                    prompt_read > 0 ? static_cast<double>(st.prompt_tokens_cached) / static_cast<double>(prompt_read) : 0.0);
             metric("m40_preemptions_total", "counter", "Requests that gave their KV blocks back for others and read their tokens again later.",
                    st.preemptions);
             metric("m40_generated_tokens_total", "counter", "Tokens generated.", st.generated_tokens);
             metric("m40_engine_steps_total", "counter", "Forward batches run by the engine.", st.steps);
             metric("m40_engine_slice_steps_total", "counter",
                    "Forward batches that read a prompt chunk through some of the layers, beside generating streams.",
                    st.slice_steps);
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
             const int64_t kv_cells = resident ? int64_t{st.kv_blocks_total} * backend::kKvBlockSize : 0;
             metric("m40_kv_cache_cells", "gauge", "KV cache positions the pool holds (blocks x block size).", kv_cells);
             metric("m40_kv_blocks_total", "gauge", "Blocks of the paged KV cache.", resident ? st.kv_blocks_total : 0);
             metric("m40_kv_blocks_used", "gauge", "KV blocks the running requests hold.", resident ? st.kv_blocks_used : 0);
             metric("m40_kv_blocks_cached", "gauge", "KV blocks no request holds whose contents are kept for reuse.",
                    resident ? st.kv_blocks_cached : 0);
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
              // Tokenizing costs ~75 bytes of memory per byte of text: a
              // text whose tokens could never be a prompt is not tokenized.
              const int n_ctx = lease->model().scheduler->n_ctx();
              if (const size_t least = least_tokens_past_context(lease->model().max_token_bytes, n_ctx, content->size())) {
                throw HttpError{400, "the text has " + std::to_string(content->size()) + " bytes, at least " +
                                         std::to_string(least) + " tokens, more than the context's " + std::to_string(n_ctx) +
                                         ": /tokenize reads texts that can fit a prompt"};
              }
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

}  // namespace m40::server

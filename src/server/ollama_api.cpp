// The Ollama API: /api/generate and /api/chat (streamed as NDJSON by
// default), /api/tags, /api/show, /api/ps, /api/version and "/".
#include <cstdio>
#include <string>

#include "engine/request_options.h"
#include "model/model_summary.h"
#include "server/model_catalog.h"
#include "server/api_answers.h"
#include "server/chat_features.h"
#include "server/fill_in_middle.h"
#include "server/generation.h"
#include "server/logprob_json.h"
#include "server/request_fields.h"
#include "server/routes.h"
#include "server/unsupported_fields.h"

#ifndef M40_VERSION
#define M40_VERSION "0.1.0"
#endif

namespace m40::server {

namespace {

int64_t ns(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

// Ollama's defaults, which differ from llama.cpp's (docs/sampling.md).
engine::RequestParams ollama_params(const json& body) {
  engine::RequestParams p;
  auto& sp = p.sampler;
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.top_p = 0.9f;
  sp.min_p = 0.0f;
  sp.repeat_penalty = 1.1f;
  sp.penalty_last_n = 64;
  // llama.cpp's extra, at the top level: false reads the whole prompt.
  p.cache_prompt = get_bool(body, "cache_prompt").value_or(true);
  auto it = body.find("options");
  if (it == body.end() || it->is_null()) return p;
  if (!it->is_object()) throw HttpError{400, "'options' must be an object"};
  const json& o = *it;
  // The options table (engine/request_options.h), under Ollama's names.
  int64_t seed = -1;
  engine::OptionTargets targets{sp, p.max_tokens, p.stop, seed};
  for (const engine::RequestOption& option : engine::request_options()) {
    const std::string key(option.name);
    switch (option.kind) {
      case engine::OptionKind::Real:
        if (auto v = get_number(o, key.c_str())) option.set_real(targets, *v);
        break;
      case engine::OptionKind::Integer:
        if (auto v = get_int(o, key.c_str())) {
          int64_t stored = 0;
          if (engine::fit_integer(option.integers, *v, stored) == engine::IntegerFit::Refused) {
            throw HttpError{400, "'options." + key + "' must be between " + std::to_string(option.integers.low) + " and " +
                                     std::to_string(option.integers.high) + ", got " + std::to_string(*v)};
          }
          option.set_integer(targets, stored);
        }
        break;
      case engine::OptionKind::Strings:
        option.set_strings(targets, get_stop(o, key.c_str()));
        break;
    }
  }
  sp.seed = seed < 0 ? engine::kRandomSeed : static_cast<uint64_t>(seed);
  return p;
}


bool wants_stream(const json& body) { return get_bool(body, "stream").value_or(true); }

// /api/generate's `context`: token ids of an earlier exchange (what a
// previous answer returned), checked against the vocabulary.
std::vector<int32_t> context_tokens(const json& body, const tokenizer::Vocab& vocab) {
  auto it = body.find("context");
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_array()) throw HttpError{400, "'context' must be a list of token ids"};
  return token_ids(*it, vocab.size(), "'context'");
}

// The context an answer returns: its prompt's tokens and its own.
json context_of(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer) {
  json out = json::array();
  for (int32_t t : prompt) out.push_back(t);
  for (int32_t t : answer) out.push_back(t);
  return out;
}

// Ollama's tool calls: arguments as an object, not a JSON string.
json ollama_tool_calls(const std::vector<chat::ToolCall>& calls) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json args;
    try {
      args = json::parse(calls[i].arguments);
    } catch (const json::parse_error&) {
      args = calls[i].arguments;
    }
    out.push_back({{"function", {{"index", i}, {"name", calls[i].name}, {"arguments", std::move(args)}}}});
  }
  return out;
}

json check_images(const json& holder) {
  if (auto it = holder.find("images"); it != holder.end() && !it->is_null() && !(it->is_array() && it->empty())) {
    throw HttpError{400, "images are not supported: the model is text-only"};
  }
  return nullptr;
}

void add_timings(json& j, const engine::RequestTimings& t, Clock::time_point received, double load_seconds) {
  j["total_duration"] = ns(std::chrono::duration<double>(Clock::now() - received).count());
  j["load_duration"] = ns(load_seconds);
  // Ollama counts the prompt tokens it evaluated: cached ones are not.
  j["prompt_eval_count"] = t.prompt_tokens - t.cached_tokens;
  j["prompt_eval_duration"] = ns(t.prompt_seconds);
  j["eval_count"] = t.generated_tokens;
  j["eval_duration"] = ns(t.generate_seconds);
}

std::string ndjson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

std::string done_reason(engine::FinishReason r) { return std::string(engine::finish_reason_name(r)); }

// A keep_alive field that is no duration is the client's mistake.
std::optional<KeepAlive> request_keep_alive(const json& body) {
  try {
    return keep_alive_field(body);
  } catch (const Error& e) {
    throw HttpError{400, e.what()};
  }
}

// Chat messages of an Ollama request, checked; empty when there are none.
json ollama_messages(const json& body) {
  auto it = body.find("messages");
  json messages = json::array();
  if (it == body.end() || it->is_null()) return messages;
  if (!it->is_array()) throw HttpError{400, "'messages' must be a list of messages"};
  for (const auto& m : *it) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      throw HttpError{400, "each message must be an object with a string 'role'"};
    }
    if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      throw HttpError{400, "a message's 'content' must be a string"};
    }
    check_images(m);
    json copy = m;
    if (!copy.contains("content") || copy["content"].is_null()) copy["content"] = "";
    messages.push_back(std::move(copy));
  }
  return messages;
}

void handle_generation(ServerContext& s, const HttpRequest& req, HttpResponse& res, bool chat) {
  const auto received = Clock::now();
  const json body = parse_body(req);
  const std::string model_ref = model_field(body);
  const auto keep_alive = request_keep_alive(body);
  refuse_unimplemented_ollama_fields(body);
  const bool stream = wants_stream(body);
  const json messages = chat ? ollama_messages(body) : json::array();
  const ChatFeatures features = ollama_features(body, chat);
  if (!chat) check_images(body);
  const auto prompt = chat ? std::string() : get_string(body, "prompt").value_or("");
  const auto system = chat ? std::nullopt : get_string(body, "system");
  const bool raw = get_bool(body, "raw").value_or(false);

  engine::RequestParams params = ollama_params(body);
  // logprobs: true (and top_logprobs 0-20): each token's log-probability
  // and its alternatives, in every chunk that carries tokens.
  {
    const bool on = get_bool(body, "logprobs").value_or(false);
    const auto top = get_int(body, "top_logprobs");
    if (top && (*top < 0 || *top > 20)) throw HttpError{400, "'top_logprobs' must be between 0 and 20"};
    if (on) params.logprobs = static_cast<int>(top.value_or(0));
  }
  params.n_ctx = ollama_num_ctx(body);
  auto lease = s.models.acquire(model_ref, keep_alive, params.n_ctx, ollama_num_gpu(body));
  ResidentModel& m = lease->model();
  const int n_ctx = request_context(m, params);
  const std::string model = ollama_name(model_ref.empty() ? m.name : model_ref);

  if (chat ? messages.empty() : (prompt.empty() && !system)) {
    // Ollama answers a request without a prompt by loading the model (or,
    // with keep_alive 0, by unloading it).
    const std::string path = m.path;
    const double load_seconds = lease->load_seconds();
    lease.reset();
    const bool unload = keep_alive && keep_alive->unload_at_once();
    if (unload) s.models.unload_if_idle(path);
    json j = {{"model", model}, {"created_at", rfc3339_now()}};
    if (chat) j["message"] = {{"role", "assistant"}, {"content", ""}};
    else j["response"] = "";
    j["done_reason"] = unload ? "unload" : "load";
    j["done"] = true;
    if (load_seconds > 0) j["load_duration"] = ns(load_seconds);
    send_json(res, j);
    return;
  }
  const bool truncate = get_bool(body, "truncate").value_or(false);
  AnswerPlan plan;
  if (chat) {
    params.prompt = feature_chat_prompt(m, messages, features, truncate, n_ctx, plan);
  } else if (auto suffix = get_string(body, "suffix"); suffix && !suffix->empty()) {
    // Fill in the middle: the prompt is the code before the cursor.
    params.prompt = infill_prompt(m, prompt, *suffix, "", n_ctx);
    plan = completion_plan(m, features);
  } else if (raw) {
    params.prompt = raw_prompt(m, prompt, truncate, n_ctx);
    plan = completion_plan(m, features);
  } else {
    json turns = json::array();
    if (system) turns.push_back({{"role", "system"}, {"content", *system}});
    turns.push_back({{"role", "user"}, {"content", prompt}});
    params.prompt = feature_chat_prompt(m, turns, features, truncate, n_ctx, plan);
  }
  // Ollama's context: the tokens of the earlier exchange, which the new
  // prompt continues (the prefix cache finds them already read).
  const std::vector<int32_t> context = chat ? std::vector<int32_t>() : context_tokens(body, *m.vocab);
  if (!context.empty()) {
    const auto bos = m.vocab->special().bos;
    auto& p = params.prompt;
    if (!p.empty() && bos != tokenizer::kNoToken && p.front() == bos) p.erase(p.begin());
    p.insert(p.begin(), context.begin(), context.end());
  }

  params.grammar = plan.grammar;
  if (truncate) truncate_prompt(m, params);
  const std::vector<int32_t> prompt_ids = chat ? std::vector<int32_t>() : params.prompt;

  const bool logprobs = params.logprobs >= 0;
  auto request = submit(m, std::move(params));
  const double load_seconds = lease->load_seconds();
  const tokenizer::Vocab* vocab = m.vocab.get();
  // One chunk (or the whole answer): content, thinking, tool calls and,
  // when asked for, the log-probabilities of the tokens it carries.
  auto piece = [chat, model, logprobs, vocab](const chat::ParsedAnswer& a, bool done,
                                              const std::vector<engine::TokenLogprob>& tokens = {}) {
    json j = {{"model", model}, {"created_at", rfc3339_now()}};
    if (chat) {
      j["message"] = {{"role", "assistant"}, {"content", a.content}};
      if (!a.reasoning.empty()) j["message"]["thinking"] = a.reasoning;
      if (!a.tool_calls.empty()) j["message"]["tool_calls"] = ollama_tool_calls(a.tool_calls);
    } else {
      j["response"] = a.content;
      if (!a.reasoning.empty()) j["thinking"] = a.reasoning;
    }
    if (logprobs && !tokens.empty()) j["logprobs"] = logprob_entries(*vocab, tokens);
    j["done"] = done;
    return j;
  };
  if (!stream) {
    const Completion c = collect(s, req, *request).front();
    json j = piece(read_answer(plan, c.text), true, c.logprobs);
    j["done_reason"] = done_reason(c.finish_reason);
    if (!chat) j["context"] = context_of(prompt_ids, c.answer_tokens);
    add_timings(j, c.timings, received, load_seconds);
    send_json(res, j);
    return;
  }
  // Content and thinking stream as they come; each tool call goes out whole,
  // as Ollama sends them, in the chunk after it is complete.
  // Log-probabilities of text the parser holds back go out with the next chunk.
  std::shared_ptr<chat::StreamingAnswerParser> parser;
  if (splits_answer(plan)) parser = answer_stream(plan);
  auto held = std::make_shared<std::vector<engine::TokenLogprob>>();
  auto calls_sent = std::make_shared<size_t>(0);
  auto delta_chunk = [piece, held, parser, calls_sent](const chat::AnswerDelta& d) {
    std::string out;
    if (!d.content.empty() || !d.reasoning.empty()) {
      out += ndjson(piece(chat::ParsedAnswer{.content = d.content, .reasoning = d.reasoning, .tool_calls = {}}, false, *held));
      held->clear();
    }
    const auto& calls = parser ? parser->answer().tool_calls : std::vector<chat::ToolCall>{};
    if (calls.size() > *calls_sent) {
      std::vector<chat::ToolCall> fresh(calls.begin() + static_cast<std::ptrdiff_t>(*calls_sent), calls.end());
      *calls_sent = calls.size();
      out += ndjson(piece(chat::ParsedAnswer{.content = {}, .reasoning = {}, .tool_calls = std::move(fresh)}, false, *held));
      held->clear();
    }
    return out;
  };
  StreamFormat f;
  f.on_text = [parser, held, delta_chunk](const engine::StreamEvent& e) {
    held->insert(held->end(), e.logprobs.begin(), e.logprobs.end());
    if (!parser) return delta_chunk(chat::AnswerDelta{.content = e.text, .reasoning = {}, .calls = {}});
    return delta_chunk(parser->push(e.text));
  };
  f.on_end = [piece, parser, held, delta_chunk, received, load_seconds, chat, prompt_ids](const engine::StreamEvent& done) {
    std::string out;
    held->insert(held->end(), done.logprobs.begin(), done.logprobs.end());
    if (parser) out += delta_chunk(parser->finish());
    json j = piece({}, true, *held);
    j["done_reason"] = done_reason(done.finish_reason);
    if (!chat) j["context"] = context_of(prompt_ids, done.answer_tokens);
    add_timings(j, done.timings, received, load_seconds);
    return out + ndjson(j);
  };
  f.on_error = [](const std::string& message) { return ndjson({{"error", message}}); };
  stream_response(s, res, "application/x-ndjson", request, std::move(lease), std::move(f));
}

json model_details(const gguf::File& file) {
  const auto summary = model::summarize(file);
  std::string quant;
  if (summary.file_type) quant = model::file_type_name(*summary.file_type).value_or("");
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", summary.architecture},
          {"families", json::array({summary.architecture})},
          {"parameter_size", model::format_parameter_count(summary.parameter_count)},
          {"quantization_level", quant}};
}

// Details of a model that may not be loaded: its header, read from the file
// (mapped, not loaded); the manifest's facts when the file cannot be read.
json model_details(const AvailableModel& m) {
  try {
    return model_details(gguf::File::open(m.path));
  } catch (const std::exception&) {
    return {{"parent_model", ""}, {"format", "gguf"}, {"family", m.architecture},
            {"families", json::array({m.architecture})}, {"parameter_size", ""}, {"quantization_level", m.quant}};
  }
}

std::string rfc3339(std::chrono::system_clock::time_point t) {
  char out[64];
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  std::strftime(out, sizeof out, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return out;
}

json model_entry(const AvailableModel& m) {
  return {{"name", ollama_name(m.name)},
          {"model", ollama_name(m.name)},
          {"modified_at", rfc3339(m.modified)},
          {"size", m.size},
          {"digest", m.digest},
          {"details", model_details(m)}};
}

}  // namespace

void register_ollama_routes(ServerContext& s) {
  auto& http = s.router;
  http.get("/", [](const HttpRequest&, HttpResponse& res) { res.set_content("m40-llm is running", "text/plain"); }, true);
  http.get("/api/version", route(s, ApiFlavor::Ollama, [](const HttpRequest&, HttpResponse& res) {
             send_json(res, {{"version", M40_VERSION}});
           }), true);
  http.post("/api/generate", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
              handle_generation(s, req, res, false);
            }));
  http.post("/api/chat", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
              handle_generation(s, req, res, true);
            }));
  http.get("/api/tags", route(s, ApiFlavor::Ollama, [&s](const HttpRequest&, HttpResponse& res) {
             json list = json::array();
             for (const auto& m : available_models(s.models)) list.push_back(model_entry(m));
             send_json(res, {{"models", list}});
           }));
  http.get("/api/ps", route(s, ApiFlavor::Ollama, [&s](const HttpRequest&, HttpResponse& res) {
             json list = json::array();
             if (auto loaded = s.models.resident()) {
               const ResidentModel& m = *loaded->model;
               json entry = {{"name", ollama_name(m.name)},
                             {"model", ollama_name(m.name)},
                             {"size", m.backend->memory_bytes()},  // weights, KV pool, buffers: as Ollama counts it
                             {"digest", ""},
                             {"details", model_details(m.model->file)},
                             {"device", m.backend->name()}};
               // A store model's digest is its manifest's sha256 (a file
               // outside the store has none).
               for (const AvailableModel& a : available_models(s.models)) {
                 if (a.path == m.path && !a.digest.empty()) {
                   entry["digest"] = a.digest;
                   break;
                 }
               }
               // A model in use expires keep_alive after its last request ends.
               std::optional<std::chrono::system_clock::time_point> expires = loaded->expires_at;
               if (loaded->users > 0) {
                 const auto keep_alive = s.models.default_keep_alive();
                 expires.reset();
                 if (!keep_alive.forever) expires = std::chrono::system_clock::now() + keep_alive.duration;
               }
               entry["expires_at"] = expires ? rfc3339(*expires) : "9999-12-31T23:59:59Z";  // never: keep_alive < 0
               entry["size_vram"] = m.backend->gpu_memory_bytes();
               entry["context_length"] = m.scheduler->n_ctx();
               entry["parallel"] = m.backend->n_seq_max();
               list.push_back(std::move(entry));
             }
             send_json(res, {{"models", list}});
           }));
  http.post("/api/show", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
              const json body = parse_body(req);
              std::string name = model_field(body);
              if (name.empty()) name = model_field(body, "name");
              if (name.empty()) throw HttpError{400, "'model' (the model's name) is required"};
              // The file's header, without loading the model.
              const ModelTarget target = s.models.resolve(name);
              const gguf::File file = gguf::File::open(target.path);
              const auto summary = model::summarize(file);
              json info = {{"general.architecture", summary.architecture},
                           {"general.parameter_count", summary.parameter_count}};
              if (summary.name) info["general.name"] = *summary.name;
              if (summary.context_length) info[summary.architecture + ".context_length"] = *summary.context_length;
              if (summary.embedding_length) info[summary.architecture + ".embedding_length"] = *summary.embedding_length;
              if (summary.block_count) info[summary.architecture + ".block_count"] = *summary.block_count;
              if (summary.head_count) info[summary.architecture + ".attention.head_count"] = *summary.head_count;
              if (summary.head_count_kv) info[summary.architecture + ".attention.head_count_kv"] = *summary.head_count_kv;
              if (summary.pooling_type) info[summary.architecture + ".pooling_type"] = *summary.pooling_type;
              const chat::ModelChatTemplate tpl = s.options.chat_template.empty()
                                                      ? chat::model_chat_template(file)
                                                      : chat::model_chat_template_from_source(file.metadata(), s.options.chat_template);
              // Tool requests use tokenizer.chat_template.tool_use where there is one.
              const bool tool_use = s.options.chat_template.empty() &&
                                    file.metadata().find("tokenizer.chat_template.tool_use") != nullptr;
              const tokenizer::Vocab vocab = tokenizer::Vocab::from_metadata(file.metadata());
              const chat::TemplateTraits traits = chat::template_traits(
                  tool_use ? chat::model_chat_template(file, "tool_use").chat_template.source() : tpl.chat_template.source(),
                  [&vocab](std::string_view text) { return vocab.find(text).has_value(); });
              send_json(res, {{"license", summary.license.value_or("")},
                              {"modelfile", "FROM " + target.path + "\n"},
                              {"parameters", ""},
                              {"template", tpl.chat_template.source()},
                              {"details", model_details(file)},
                              {"model_info", info},
                              {"capabilities", model_capabilities(traits, tokenizer::Vocab::from_metadata(file.metadata()).special().has_fim(), summary.embedding_model())}});
            }));
}

}  // namespace m40::server

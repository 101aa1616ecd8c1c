// The Ollama API: /api/generate and /api/chat (streamed as NDJSON by
// default), /api/tags, /api/show, /api/ps, /api/version and "/".
#include <cstdio>
#include <string>

#include "model/model_summary.h"
#include "server/server_state.h"

#ifndef M40_VERSION
#define M40_VERSION "0.1.0"
#endif

namespace m40::server {

namespace {

int64_t ns(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

// Ollama's defaults, which differ from llama.cpp's (docs/sampling.md).
engine::RequestParams ollama_params(Server::State& s, const json& body) {
  engine::RequestParams p;
  auto& sp = p.sampler;
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.top_p = 0.9f;
  sp.min_p = 0.0f;
  sp.repeat_penalty = 1.1f;
  sp.penalty_last_n = 64;
  auto it = body.find("options");
  if (it == body.end() || it->is_null()) return p;
  if (!it->is_object()) throw HttpError{400, "'options' must be an object"};
  const json& o = *it;
  if (auto v = get_number(o, "temperature")) sp.temperature = static_cast<float>(*v);
  if (auto v = get_int(o, "top_k")) sp.top_k = static_cast<int32_t>(*v);
  if (auto v = get_number(o, "top_p")) sp.top_p = static_cast<float>(*v);
  if (auto v = get_number(o, "min_p")) sp.min_p = static_cast<float>(*v);
  if (auto v = get_number(o, "repeat_penalty")) sp.repeat_penalty = static_cast<float>(*v);
  if (auto v = get_int(o, "repeat_last_n")) sp.penalty_last_n = static_cast<int32_t>(*v);
  if (auto v = get_number(o, "presence_penalty")) sp.presence_penalty = static_cast<float>(*v);
  if (auto v = get_number(o, "frequency_penalty")) sp.frequency_penalty = static_cast<float>(*v);
  if (auto v = get_int(o, "seed")) sp.seed = *v < 0 ? engine::kRandomSeed : static_cast<uint64_t>(*v);
  if (auto v = get_int(o, "num_predict")) p.max_tokens = *v < 0 ? -1 : static_cast<int>(*v);
  p.stop = get_stop(o, "stop");
  if (auto v = get_int(o, "num_ctx"); v && *v > s.scheduler->n_ctx()) {
    // The context is fixed when the server starts; say so instead of failing
    // clients that always send num_ctx.
    std::fprintf(stderr, "m40-llm: a request asked for num_ctx %lld; this server runs with %d (--ctx)\n",
                 static_cast<long long>(*v), s.scheduler->n_ctx());
  }
  return p;
}

bool wants_stream(const json& body) { return get_bool(body, "stream").value_or(true); }

void refuse_unsupported(const json& body) {
  if (auto it = body.find("format"); it != body.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
    throw HttpError{400, "'format' (structured output) is not supported yet"};
  }
}

json check_images(const json& holder) {
  if (auto it = holder.find("images"); it != holder.end() && !it->is_null() && !(it->is_array() && it->empty())) {
    throw HttpError{400, "images are not supported: the model is text-only"};
  }
  return nullptr;
}

void add_timings(json& j, const engine::RequestTimings& t, Clock::time_point received) {
  j["total_duration"] = ns(std::chrono::duration<double>(Clock::now() - received).count());
  j["load_duration"] = 0;
  j["prompt_eval_count"] = t.prompt_tokens;
  j["prompt_eval_duration"] = ns(t.prompt_seconds);
  j["eval_count"] = t.generated_tokens;
  j["eval_duration"] = ns(t.generate_seconds);
}

std::string ndjson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

std::string done_reason(engine::FinishReason r) { return std::string(engine::finish_reason_name(r)); }

void handle_generation(Server::State& s, const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto received = Clock::now();
  const json body = parse_body(req);
  const auto model_field = get_string(body, "model");
  const std::string model = model_field && !model_field->empty() ? *model_field : s.model_name + ":latest";
  refuse_unsupported(body);
  engine::RequestParams params = ollama_params(s, body);
  const bool stream = wants_stream(body);
  get_string(body, "template");  // type check only; the model's template is used

  if (chat) {
    auto it = body.find("messages");
    if (it == body.end() || it->is_null() || (it->is_array() && it->empty())) {
      // Ollama answers an empty chat by loading the model.
      send_json(res, {{"model", model}, {"created_at", rfc3339_now()}, {"message", {{"role", "assistant"}, {"content", ""}}},
                      {"done_reason", "load"}, {"done", true}});
      return;
    }
    if (!it->is_array()) throw HttpError{400, "'messages' must be a list of messages"};
    json messages = json::array();
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
    params.prompt = chat_prompt(s, messages);
  } else {
    check_images(body);
    const auto prompt = get_string(body, "prompt").value_or("");
    const auto system = get_string(body, "system");
    if (prompt.empty() && !system) {
      send_json(res, {{"model", model}, {"created_at", rfc3339_now()}, {"response", ""}, {"done", true},
                      {"done_reason", "load"}});
      return;
    }
    if (get_bool(body, "raw").value_or(false)) {
      params.prompt = raw_prompt(s, prompt);
    } else {
      json messages = json::array();
      if (system) messages.push_back({{"role", "system"}, {"content", *system}});
      messages.push_back({{"role", "user"}, {"content", prompt}});
      params.prompt = chat_prompt(s, messages);
    }
  }

  auto request = submit(s, std::move(params));
  auto piece = [chat, model](const std::string& text, bool done) {
    json j = {{"model", model}, {"created_at", rfc3339_now()}};
    if (chat) j["message"] = {{"role", "assistant"}, {"content", text}};
    else j["response"] = text;
    j["done"] = done;
    return j;
  };
  if (!stream) {
    const Completion c = collect(s, *request);
    json j = piece(c.text, true);
    j["done_reason"] = done_reason(c.finish_reason);
    add_timings(j, c.timings, received);
    send_json(res, j);
    return;
  }
  StreamFormat f;
  f.on_text = [piece](const std::string& text) { return ndjson(piece(text, false)); };
  f.on_end = [piece, received](const engine::StreamEvent& done) {
    json j = piece("", true);
    j["done_reason"] = done_reason(done.finish_reason);
    add_timings(j, done.timings, received);
    return ndjson(j);
  };
  f.on_error = [](const std::string& message) { return ndjson({{"error", message}}); };
  stream_response(s, res, "application/x-ndjson", request, std::move(f));
}

json model_details(Server::State& s) {
  const auto summary = model::summarize(s.model->file);
  std::string quant;
  if (summary.file_type) quant = model::file_type_name(*summary.file_type).value_or("");
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", summary.architecture},
          {"families", json::array({summary.architecture})},
          {"parameter_size", model::format_parameter_count(summary.parameter_count)},
          {"quantization_level", quant}};
}

json model_entry(Server::State& s) {
  return {{"name", s.model_name + ":latest"},
          {"model", s.model_name + ":latest"},
          {"size", s.model_size},
          {"digest", ""},
          {"details", model_details(s)}};
}

}  // namespace

void register_ollama_routes(Server::State& s) {
  auto& http = s.http;
  http.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content("m40-llm is running", "text/plain"); });
  http.Get("/api/version", route(s, ApiFlavor::Ollama, [](const httplib::Request&, httplib::Response& res) {
             send_json(res, {{"version", M40_VERSION}});
           }, false));
  http.Post("/api/generate", route(s, ApiFlavor::Ollama, [&s](const httplib::Request& req, httplib::Response& res) {
              handle_generation(s, req, res, false);
            }));
  http.Post("/api/chat", route(s, ApiFlavor::Ollama, [&s](const httplib::Request& req, httplib::Response& res) {
              handle_generation(s, req, res, true);
            }));
  http.Get("/api/tags", route(s, ApiFlavor::Ollama, [&s](const httplib::Request&, httplib::Response& res) {
             json entry = model_entry(s);
             char modified[64];
             const std::time_t t = std::chrono::system_clock::to_time_t(s.loaded_at);
             std::tm tm{};
             gmtime_r(&t, &tm);
             std::strftime(modified, sizeof modified, "%Y-%m-%dT%H:%M:%SZ", &tm);
             entry["modified_at"] = modified;
             send_json(res, {{"models", json::array({entry})}});
           }));
  http.Get("/api/ps", route(s, ApiFlavor::Ollama, [&s](const httplib::Request&, httplib::Response& res) {
             json entry = model_entry(s);
             entry["expires_at"] = "9999-12-31T23:59:59Z";  // loaded for the server's lifetime
             entry["size_vram"] = s.backend->name() == "CPU" ? 0 : s.model_size;  // the CPU backend holds nothing in VRAM
             entry["context_length"] = s.scheduler->n_ctx();
             send_json(res, {{"models", json::array({entry})}});
           }));
  http.Post("/api/show", route(s, ApiFlavor::Ollama, [&s](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              auto name = get_string(body, "model");
              if (!name) name = get_string(body, "name");
              if (!name || name->empty()) throw HttpError{400, "'model' (the model's name) is required"};
              const auto summary = model::summarize(s.model->file);
              json info = {{"general.architecture", summary.architecture},
                           {"general.parameter_count", summary.parameter_count}};
              if (summary.name) info["general.name"] = *summary.name;
              if (summary.context_length) info[summary.architecture + ".context_length"] = *summary.context_length;
              if (summary.embedding_length) info[summary.architecture + ".embedding_length"] = *summary.embedding_length;
              if (summary.block_count) info[summary.architecture + ".block_count"] = *summary.block_count;
              if (summary.head_count) info[summary.architecture + ".attention.head_count"] = *summary.head_count;
              if (summary.head_count_kv) info[summary.architecture + ".attention.head_count_kv"] = *summary.head_count_kv;
              send_json(res, {{"license", summary.license.value_or("")},
                              {"modelfile", "FROM " + s.model_path + "\n"},
                              {"parameters", ""},
                              {"template", s.chat_template->chat_template.source()},
                              {"details", model_details(s)},
                              {"model_info", info},
                              {"capabilities", json::array({"completion"})}});
            }));
}

}  // namespace m40::server

// llama.cpp's own completion routes, as its editor plugins and scripts call
// them: POST /completion (a prompt: text or token ids) and POST /infill
// (fill in the middle: input_prefix, input_suffix, and `prompt` as the
// middle's beginning). Answers in llama.cpp's shape: {content, stop,
// tokens_predicted, tokens_evaluated, tokens_cached, stop_type, timings,
// ...}; streamed as Server-Sent Events of {content, stop: false} chunks and
// a last one with stop: true and the totals (no [DONE], as llama.cpp).
#include <string>

#include "server/api_answers.h"
#include "server/chat_features.h"
#include "server/fill_in_middle.h"
#include "server/generation.h"
#include "server/logprob_json.h"
#include "server/request_fields.h"
#include "server/routes.h"
#include "server/sampling_fields.h"
#include "server/unsupported_fields.h"

namespace m40::server {

namespace {

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

// llama.cpp's stop_type: "eos" (an end token), "word" (a stop string),
// "limit" (n_predict or the context), "none" (cancelled).
const char* stop_type(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::EndOfGeneration: return "eos";
    case engine::FinishReason::StopString: return "word";
    case engine::FinishReason::MaxTokens:
    case engine::FinishReason::ContextFull: return "limit";
    case engine::FinishReason::Cancelled: return "none";
  }
  return "none";
}

json timings_json(const engine::RequestTimings& t) {
  const int evaluated = t.prompt_tokens - t.cached_tokens;
  auto per_token_ms = [](double seconds, int n) { return n > 0 ? seconds * 1e3 / n : 0.0; };
  auto per_second = [](double seconds, int n) { return seconds > 0 ? n / seconds : 0.0; };
  return {{"cache_n", t.cached_tokens},
          {"prompt_n", evaluated},
          {"prompt_ms", t.prompt_seconds * 1e3},
          {"prompt_per_token_ms", per_token_ms(t.prompt_seconds, evaluated)},
          {"prompt_per_second", per_second(t.prompt_seconds, evaluated)},
          {"predicted_n", t.generated_tokens},
          {"predicted_ms", t.generate_seconds * 1e3},
          {"predicted_per_token_ms", per_token_ms(t.generate_seconds, t.generated_tokens)},
          {"predicted_per_second", per_second(t.generate_seconds, t.generated_tokens)}};
}

// llama.cpp's completion_probabilities: per token {id, token, logprob,
// bytes, top_logprobs: [{id, token, logprob, bytes}]}.
json completion_probabilities(const tokenizer::Vocab& vocab, const std::vector<engine::TokenLogprob>& tokens) {
  json out = logprob_entries(vocab, tokens);
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[i]["id"] = tokens[i].token;
    for (size_t k = 0; k < tokens[i].top.size(); ++k) out[i]["top_logprobs"][k]["id"] = tokens[i].top[k].first;
  }
  return out;
}

// The last object of an answer: its totals.
json final_json(const std::string& model, const std::string& content, engine::FinishReason reason,
                const engine::RequestTimings& t) {
  return {{"index", 0},
          {"content", content},
          {"id_slot", -1},
          {"stop", true},
          {"model", model},
          {"tokens_predicted", t.generated_tokens},
          {"tokens_evaluated", t.prompt_tokens},
          {"tokens_cached", t.cached_tokens},
          {"truncated", false},
          {"stop_type", stop_type(reason)},
          {"timings", timings_json(t)}};
}

// llama.cpp's defaults (common_params_sampling): temperature 0.8, top_k 40,
// top_p 0.95, min_p 0.05, repeat_penalty 1 (off), n_predict -1.
engine::RequestParams llama_cpp_params(const json& body) {
  engine::RequestParams p;
  p.sampler.repeat_penalty = 1.0f;
  read_sampling_fields(body, p);
  return p;
}

std::vector<int32_t> completion_tokens(ResidentModel& m, const json& body) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw HttpError{400, "'prompt' is required"};
  if (it->is_string()) return raw_prompt(m, it->get<std::string>(), false, m.scheduler->n_ctx());
  if (it->is_array() && !it->empty()) return token_ids(*it, m.vocab->size(), "'prompt'");
  throw HttpError{400, "'prompt' must be a string or a list of token ids"};
}

void handle(ServerContext& s, const HttpRequest& req, HttpResponse& res, bool infill) {
  const json body = parse_body(req);
  const std::string model_ref = model_field(body);
  refuse_unimplemented_llama_cpp_fields(body, infill);
  engine::RequestParams params = llama_cpp_params(body);
  if (auto n_probs = get_int(body, "n_probs"); n_probs && *n_probs > 0) {
    if (*n_probs > 20) throw HttpError{400, "'n_probs' must be between 0 and 20"};
    params.logprobs = static_cast<int>(*n_probs);
  }
  const bool probabilities = params.logprobs >= 0;
  const ChatFeatures features = openai_completion_features(body);  // json_schema, grammar, response_format
  const bool stream = get_bool(body, "stream").value_or(false);
  auto lease = s.models.acquire(model_ref, std::nullopt);
  ResidentModel& m = lease->model();
  if (infill) {
    const std::string prefix = get_string(body, "input_prefix").value_or("");
    const std::string suffix = get_string(body, "input_suffix").value_or("");
    const std::string middle = get_string(body, "prompt").value_or("");
    params.prompt = infill_prompt(m, prefix, suffix, middle, m.scheduler->n_ctx());
  } else {
    params.prompt = completion_tokens(m, body);
  }
  params.grammar = completion_plan(m, features).grammar;
  const std::string model = m.name;
  const tokenizer::Vocab* vocab = m.vocab.get();

  auto request = submit(m, std::move(params));
  if (!stream) {
    const Completion c = collect(s, req, *request).front();
    json answer = final_json(model, c.text, c.finish_reason, c.timings);
    if (probabilities) answer["completion_probabilities"] = completion_probabilities(*vocab, c.logprobs);
    send_json(res, answer);
    return;
  }
  StreamFormat f;
  f.on_text = [probabilities, vocab](const engine::StreamEvent& e) {
    json chunk = {{"index", 0}, {"content", e.text}, {"id_slot", -1}, {"stop", false}};
    if (probabilities) chunk["completion_probabilities"] = completion_probabilities(*vocab, e.logprobs);
    return sse(chunk);
  };
  f.on_end = [model, probabilities, vocab](const engine::StreamEvent& done) {
    json last = final_json(model, "", done.finish_reason, done.timings);
    if (probabilities && !done.logprobs.empty()) last["completion_probabilities"] = completion_probabilities(*vocab, done.logprobs);
    return sse(last);
  };
  f.on_error = [](const std::string& message) {
    return sse({{"error", {{"code", 500}, {"message", message}, {"type", "server_error"}}}});
  };
  stream_response(s, res, "text/event-stream", request, std::move(lease), std::move(f));
}

}  // namespace

void register_llama_cpp_routes(ServerContext& s) {
  s.router.post("/completion", route(s, ApiFlavor::OpenAI, [&s](const HttpRequest& req, HttpResponse& res) {
                  handle(s, req, res, false);
                }));
  s.router.post("/completions", route(s, ApiFlavor::OpenAI, [&s](const HttpRequest& req, HttpResponse& res) {
                  handle(s, req, res, false);
                }));
  s.router.post("/infill", route(s, ApiFlavor::OpenAI, [&s](const HttpRequest& req, HttpResponse& res) {
                  handle(s, req, res, true);
                }));
}

}  // namespace m40::server

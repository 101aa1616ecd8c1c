// The OpenAI API: /v1/completions, /v1/chat/completions (streamed as
// Server-Sent Events ending in `data: [DONE]`) and /v1/models.
#include <algorithm>
#include <string>

#include "server/model_catalog.h"
#include "server/api_answers.h"
#include "server/chat_features.h"
#include "server/fill_in_middle.h"
#include "server/generation.h"
#include "server/logprob_json.h"
#include "server/request_fields.h"
#include "server/sampling_fields.h"
#include "server/routes.h"
#include "server/unsupported_fields.h"

namespace m40::server {

namespace {

// OpenAI's defaults where they differ from llama.cpp's: temperature 1,
// top_p 1, no repetition penalty (OpenAI has frequency/presence instead).
engine::RequestParams openai_params(const json& body) {
  engine::RequestParams p;
  p.sampler.temperature = 1.0f;
  p.sampler.top_p = 1.0f;
  p.sampler.repeat_penalty = 1.0f;
  read_sampling_fields(body, p);
  return p;
}

bool wants_stream(const json& body) { return get_bool(body, "stream").value_or(false); }

bool wants_usage(const json& body) {
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return false;
  if (!it->is_object()) throw HttpError{400, "'stream_options' must be an object"};
  return get_bool(*it, "include_usage").value_or(false);
}

// How many answers (choices) a request asks for: `n`, 1 to kMaxChoices.
constexpr int kMaxChoices = 16;
int choice_count(const json& body) {
  const auto n = get_int(body, "n").value_or(1);
  if (n < 1 || n > kMaxChoices) {
    throw HttpError{400, "'n' must be between 1 and " + std::to_string(kMaxChoices) + ", got " + std::to_string(n)};
  }
  return static_cast<int>(n);
}

// The usage of all choices (`n` to each prompt): each prompt once, as its
// first choice read it (the others fork its blocks), the completions together.
json usage_json(const std::vector<engine::RequestTimings>& choices, int n) {
  int prompt = 0;
  int cached = 0;
  int completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i % static_cast<size_t>(n) == 0) {
      prompt += choices[i].prompt_tokens;
      cached += choices[i].cached_tokens;
    }
    completion += choices[i].generated_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string finish_name(engine::FinishReason r) { return std::string(engine::finish_reason_name(r)); }

// What a request asks of log-probabilities: -1 none, else how many
// alternatives each token comes with. Chat: `logprobs: true` and
// `top_logprobs` 0-20; completions: `logprobs` 0-5 (OpenAI's ranges).
int requested_logprobs(const json& body, bool chat) {
  if (chat) {
    const bool on = get_bool(body, "logprobs").value_or(false);
    const auto top = get_int(body, "top_logprobs");
    if (top && !on) throw HttpError{400, "'top_logprobs' needs 'logprobs': true"};
    if (top && (*top < 0 || *top > 20)) throw HttpError{400, "'top_logprobs' must be between 0 and 20"};
    return on ? static_cast<int>(top.value_or(0)) : -1;
  }
  const auto n = get_int(body, "logprobs");
  if (!n) return -1;
  if (*n < 0 || *n > 5) throw HttpError{400, "'logprobs' must be between 0 and 5"};
  return static_cast<int>(*n);
}

// Chat completions: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}.
json chat_logprobs(const tokenizer::Vocab& vocab, const std::vector<engine::TokenLogprob>& tokens) {
  return {{"content", logprob_entries(vocab, tokens)}, {"refusal", nullptr}};
}

// Completions: parallel lists of tokens, their log-probabilities, the
// alternatives ({token: logprob}) and each token's byte offset in the text,
// counted from `offset` (and advanced past the tokens).
json completion_logprobs(const tokenizer::Vocab& vocab, const std::vector<engine::TokenLogprob>& tokens, size_t& offset) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const auto& t : tokens) {
    const std::string& piece = vocab.piece(t.token);
    out["tokens"].push_back(piece);
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top) top[vocab.piece(id)] = lp;
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += piece.size();
  }
  return out;
}

// A finished choice's reason: "tool_calls" when the answer ended by itself
// after calling tools.
std::string finish_name(engine::FinishReason r, bool called_tools) {
  return called_tools && r == engine::FinishReason::EndOfGeneration ? "tool_calls" : finish_name(r);
}

json openai_tool_calls(const std::vector<chat::ToolCall>& calls) {
  json out = json::array();
  for (const auto& c : calls) {
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

// The assistant message of a whole answer: content (null when the answer
// is only tool calls, as OpenAI sends it), reasoning_content (llama.cpp's
// and DeepSeek's field) and tool_calls.
json assistant_message(const chat::ParsedAnswer& a) {
  json message = {{"role", "assistant"},
                  {"content", a.content.empty() && !a.tool_calls.empty() ? json(nullptr) : json(a.content)}};
  if (!a.reasoning.empty()) message["reasoning_content"] = a.reasoning;
  if (!a.tool_calls.empty()) message["tool_calls"] = openai_tool_calls(a.tool_calls);
  return message;
}

// A streamed piece as a chat delta; null when it holds nothing to send.
json chat_delta(const chat::AnswerDelta& d) {
  json delta = json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.calls.empty()) {
    json calls = json::array();
    for (const auto& c : d.calls) {
      json call = {{"index", c.index}};
      json fn = json::object();
      if (!c.id.empty()) {
        call["id"] = c.id;
        call["type"] = "function";
      }
      if (!c.name.empty()) fn["name"] = c.name;
      fn["arguments"] = c.arguments;
      call["function"] = std::move(fn);
      calls.push_back(std::move(call));
    }
    delta["tool_calls"] = std::move(calls);
  }
  return delta.empty() ? json(nullptr) : delta;
}

json openai_model(const AvailableModel& m) {
  return {{"id", m.name},
          {"object", "model"},
          {"created", std::chrono::duration_cast<std::chrono::seconds>(m.modified.time_since_epoch()).count()},
          {"owned_by", "m40-llm"}};
}

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
json flatten_content(const json& content) {
  if (content.is_null() || content.is_string()) return content.is_null() ? json("") : content;
  if (!content.is_array()) throw HttpError{400, "a message's 'content' must be a string or a list of parts"};
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
      throw HttpError{400, "only text content parts are supported"};
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

json openai_messages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    throw HttpError{400, "'messages' must be a non-empty list of messages"};
  }
  json messages = json::array();
  for (const auto& m : *it) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      throw HttpError{400, "each message must be an object with a string 'role'"};
    }
    json copy = m;
    copy["content"] = flatten_content(m.contains("content") ? m["content"] : json(nullptr));
    messages.push_back(std::move(copy));
  }
  return messages;
}

bool all_token_ids(const json& list) {
  return !list.empty() && std::all_of(list.begin(), list.end(), [](const json& t) { return t.is_number_integer(); });
}

// A completions request's prompts: a string, a list of strings, a list of
// token ids, or a list of such lists; each with its text as `echo` shows it.
struct CompletionPrompt {
  std::vector<int32_t> tokens;
  std::string text;
};
constexpr size_t kMaxPrompts = 16;
std::vector<CompletionPrompt> completion_prompts(ResidentModel& m, const json& body, bool truncate) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw HttpError{400, "'prompt' is required"};
  const int n_ctx = m.scheduler->n_ctx();
  auto from_text = [&](const std::string& text) { return CompletionPrompt{raw_prompt(m, text, truncate, n_ctx), text}; };
  auto from_ids = [&](const json& ids) {
    CompletionPrompt p{token_ids(ids, m.vocab->size(), "'prompt'"), {}};
    p.text = m.vocab->decode(p.tokens, {.remove_special = true});
    return p;
  };
  if (it->is_string()) return {from_text(it->get<std::string>())};
  if (!it->is_array() || it->empty()) {
    throw HttpError{400, "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists"};
  }
  if (all_token_ids(*it)) return {from_ids(*it)};
  if (it->size() > kMaxPrompts) throw HttpError{400, "'prompt' may hold at most " + std::to_string(kMaxPrompts) + " prompts"};
  std::vector<CompletionPrompt> out;
  for (const auto& p : *it) {
    if (p.is_string()) out.push_back(from_text(p.get<std::string>()));
    else if (p.is_array() && all_token_ids(p)) out.push_back(from_ids(p));
    else throw HttpError{400, "each prompt of a list must be a string or a list of token ids"};
  }
  return out;
}

void handle_completion(ServerContext& s, const HttpRequest& req, HttpResponse& res, bool chat) {
  const json body = parse_body(req);
  const std::string model_ref = model_field(body);
  refuse_unimplemented_openai_fields(body, chat);
  engine::RequestParams params = openai_params(body);
  const int n = choice_count(body);
  params.logprobs = requested_logprobs(body, chat);
  const bool logprobs = params.logprobs >= 0;
  const bool stream = wants_stream(body);
  const bool usage = wants_usage(body);
  const json messages = chat ? openai_messages(body) : json();
  const ChatFeatures features = chat ? openai_chat_features(body) : openai_completion_features(body);
  auto lease = s.models.acquire(model_ref, std::nullopt);
  ResidentModel& m = lease->model();
  const bool truncate = get_bool(body, "truncate").value_or(false);
  AnswerPlan plan;
  if (chat) {
    params.prompt = feature_chat_prompt(m, messages, features, truncate, m.scheduler->n_ctx(), plan);
  } else if (auto suffix = get_string(body, "suffix"); suffix && !suffix->empty()) {
    // Fill in the middle: the prompt is the text before the cursor.
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) throw HttpError{400, "'suffix' needs 'prompt' to be a string (the text before it)"};
    params.prompt = infill_prompt(m, it->get_ref<const std::string&>(), *suffix, "", m.scheduler->n_ctx());
    plan = completion_plan(m, features);
  } else {
    plan = completion_plan(m, features);
  }
  params.grammar = plan.grammar;
  // One set of parameters per prompt (completions may list several).
  std::vector<engine::RequestParams> prompts;
  std::vector<std::string> echoed;  // per prompt: the text `echo` starts its choices with
  const bool echo = !chat && get_bool(body, "echo").value_or(false);
  if (echo && logprobs) throw HttpError{400, "'echo' with 'logprobs' is not supported: the prompt's own log-probabilities are not computed"};
  if (chat || !params.prompt.empty()) {
    prompts.push_back(params);
    if (echo) echoed.push_back(body["prompt"].get<std::string>());
  } else {
    for (auto& p : completion_prompts(m, body, truncate)) {
      prompts.push_back(params);
      prompts.back().prompt = std::move(p.tokens);
      if (echo) echoed.push_back(std::move(p.text));
    }
  }
  if (truncate) {
    for (auto& p : prompts) truncate_prompt(m, p);
  }
  auto echo_of = [echoed, n](size_t choice) { return echoed.empty() ? std::string() : echoed[choice / static_cast<size_t>(n)]; };
  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_now();
  const std::string model = m.name;
  const char* object = chat ? "chat.completion" : "text_completion";

  auto request = submit(m, std::move(prompts), n);
  if (!stream) {
    const std::vector<Completion> answers = collect(s, req, *request);
    json choices = json::array();
    std::vector<engine::RequestTimings> timings;
    for (size_t i = 0; i < answers.size(); ++i) {
      const Completion& c = answers[i];
      json choice = {{"index", i}};
      bool called_tools = false;
      if (chat) {
        const chat::ParsedAnswer answer = read_answer(plan, c.text);
        called_tools = !answer.tool_calls.empty();
        choice["message"] = assistant_message(answer);
      } else {
        choice["text"] = echo_of(i) + c.text;
      }
      size_t offset = 0;
      choice["logprobs"] = !logprobs ? json(nullptr)
                           : chat    ? chat_logprobs(*m.vocab, c.logprobs)
                                     : completion_logprobs(*m.vocab, c.logprobs, offset);
      choice["finish_reason"] = finish_name(c.finish_reason, called_tools);
      choices.push_back(std::move(choice));
      timings.push_back(c.timings);
    }
    send_json(res, {{"id", id}, {"object", object}, {"created", created}, {"model", model},
                    {"choices", std::move(choices)}, {"usage", usage_json(timings, n)}});
    return;
  }

  const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [=](json choice) {
    json j = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
              {"choices", json::array({std::move(choice)})}};
    if (usage) j["usage"] = nullptr;
    return j;
  };
  StreamFormat f;
  if (echo) {
    f.on_start = [=](int index) {
      return sse(chunk({{"index", index}, {"text", echo_of(static_cast<size_t>(index))}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    };
  }
  if (chat) {
    f.on_start = [=](int index) {
      return sse(chunk({{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                        {"finish_reason", nullptr}}));
    };
  }
  // Each choice's byte offset in its text so far (completions' text_offset).
  auto offsets = std::make_shared<std::vector<size_t>>(static_cast<size_t>(request->choices()), 0);
  const tokenizer::Vocab* vocab = m.vocab.get();
  auto logprobs_of = [=](const engine::StreamEvent& e) {
    if (!logprobs) return json(nullptr);
    return chat ? chat_logprobs(*vocab, e.logprobs) : completion_logprobs(*vocab, e.logprobs, (*offsets)[static_cast<size_t>(e.choice)]);
  };
  // Each choice's answer parser, where the plan splits the text into
  // content, reasoning and tool calls.
  auto parsers = std::make_shared<std::vector<std::unique_ptr<chat::StreamingAnswerParser>>>();
  if (chat && splits_answer(plan)) {
    for (int i = 0; i < n; ++i) parsers->push_back(answer_stream(plan));
  }
  auto delta_of = [=](int index, const std::string& text) -> json {
    if (parsers->empty()) return json{{"content", text}};
    return chat_delta((*parsers)[static_cast<size_t>(index)]->push(text));
  };
  f.on_text = [=](const engine::StreamEvent& e) {
    json choice = {{"index", e.choice}};
    json lp = logprobs_of(e);
    if (chat) {
      json delta = delta_of(e.choice, e.text);
      if (delta.is_null() && lp.is_null()) return std::string();  // held back by the parser
      choice["delta"] = delta.is_null() ? json{{"content", ""}} : std::move(delta);
    } else {
      choice["text"] = e.text;
    }
    choice["logprobs"] = std::move(lp);
    choice["finish_reason"] = nullptr;
    return sse(chunk(std::move(choice)));
  };
  f.on_end = [=](const engine::StreamEvent& done) {
    std::string out;
    bool called_tools = false;
    if (!parsers->empty()) {
      auto& parser = *(*parsers)[static_cast<size_t>(done.choice)];
      if (json rest = chat_delta(parser.finish()); !rest.is_null()) {
        out += sse(chunk({{"index", done.choice}, {"delta", std::move(rest)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      }
      called_tools = !parser.answer().tool_calls.empty();
    }
    json choice = {{"index", done.choice}};
    if (chat) choice["delta"] = json::object();
    else choice["text"] = "";
    choice["logprobs"] = done.logprobs.empty() ? json(nullptr) : logprobs_of(done);
    choice["finish_reason"] = finish_name(done.finish_reason, called_tools);
    return out + sse(chunk(std::move(choice)));
  };
  f.on_finish = [=](const std::vector<engine::StreamEvent>& ends) {
    std::string out;
    if (usage) {
      std::vector<engine::RequestTimings> timings(ends.size());
      for (const auto& e : ends) timings[static_cast<size_t>(e.choice)] = e.timings;
      out += sse({{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                  {"choices", json::array()}, {"usage", usage_json(timings, n)}});
    }
    return out + "data: [DONE]\n\n";
  };
  // The stream's last event: the error, then [DONE] as after any stream.
  f.on_error = [](const std::string& message) {
    return sse({{"error", {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}) +
           "data: [DONE]\n\n";
  };
  stream_response(s, res, "text/event-stream", request, std::move(lease), std::move(f));
}

}  // namespace

void register_openai_routes(ServerContext& s) {
  s.router.post("/v1/completions", route(s, ApiFlavor::OpenAI, [&s](const HttpRequest& req, HttpResponse& res) {
                handle_completion(s, req, res, false);
              }));
  s.router.post("/v1/chat/completions",
              route(s, ApiFlavor::OpenAI, [&s](const HttpRequest& req, HttpResponse& res) {
                handle_completion(s, req, res, true);
              }));
  s.router.get("/v1/models", route(s, ApiFlavor::OpenAI, [&s](const HttpRequest&, HttpResponse& res) {
               json data = json::array();
               for (const auto& entry : available_models(s.models)) data.push_back(openai_model(entry));
               send_json(res, {{"object", "list"}, {"data", data}});
             }));
  s.router.get(R"(/v1/models/(.+))", route(s, ApiFlavor::OpenAI, [&s](const HttpRequest& req, HttpResponse& res) {
               const std::string id = req.params.at(0);
               for (const auto& entry : available_models(s.models)) {
                 if (entry.name == id || entry.name == id + ":latest" || ollama_name(entry.name) == id) return send_json(res, openai_model(entry));
               }
               throw HttpError{404, "the model '" + id + "' does not exist", "invalid_request_error", "model_not_found"};
             }));
}

}  // namespace m40::server

// The HTTP server end to end: a real server on a loopback ephemeral port over
// the shared TinyStories model (CPU backend), spoken to with httplib::Client.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <thread>

#include "engine/backend_factory.h"
#include "event_streams.h"
#include "engine/generator.h"
#include "engine/scheduler.h"
#include "in_process_server.h"
#include "paced_backend.h"
#include "server/server.h"
#include "store/store_test_home.h"
#include "test_paths.h"

using namespace m40;
using json = nlohmann::json;

namespace {

std::filesystem::path model_path() { return test::shared_model("TinyStories-656K-Q8_0.gguf"); }

using test::Pacing;
using test::PacedBackend;

class ServerTest : public test::InProcessServerTest {
 protected:
  void start(server::ServerOptions o = {}) {
    o.allow_paths = true;  // requests name the shared model by its path
    if (o.n_ctx == 0) o.n_ctx = 256;
    o.wrap_backend = [p = pacing_](std::unique_ptr<backend::Backend> b) -> std::unique_ptr<backend::Backend> {
      return std::make_unique<PacedBackend>(std::move(b), p);
    };
    start_server(o, model_path());
  }

  // Generation on the CPU takes seconds under load: a long read timeout.
  httplib::Client client() const { return InProcessServerTest::client(60); }
  httplib::Result post(const std::string& path, const json& body, const httplib::Headers& headers = {}) const {
    return client().Post(path, headers, body.dump(), "application/json");
  }

  std::shared_ptr<Pacing> pacing_ = std::make_shared<Pacing>();
};

using test::ndjson_lines;
using test::sse_data;

// What engine::Generator produces for the same tokens and settings.
std::string generator_text(const std::vector<int32_t>& prompt, int max_tokens, std::vector<std::string> stop = {}) {
  auto model = model::LoadedModel::open(model_path().string());
  auto vocab = tokenizer::Vocab::from_metadata(model->file.metadata());
  engine::BackendOptions bo;
  bo.n_ctx = 256;
  bo.threads = 2;
  bo.force_cpu = true;
  auto backend = engine::make_backend(*model, bo);
  engine::GenerationOptions go;
  go.sampler.temperature = 0;
  go.sampler.repeat_penalty = 1.0f;
  go.max_tokens = max_tokens;
  go.stop = std::move(stop);
  std::string text;
  engine::Generator(*backend, vocab).generate(prompt, go, [&](std::string_view piece) {
    text += piece;
    return true;
  });
  return text;
}

server::ServerOptions with(int parallel, int max_queue = 16, std::string api_key = "") {
  server::ServerOptions o;
  o.parallel = parallel;
  o.max_queue = max_queue;
  o.api_key = std::move(api_key);
  return o;
}

std::vector<int32_t> raw_tokens(const std::string& text) {
  auto vocab = tokenizer::Vocab::from_file(model_path().string());
  return vocab.encode(text, {.add_special = true, .parse_special = true});
}

}  // namespace

TEST_F(ServerTest, CompletionGreedyEqualsTheGenerator) {
  start(with(2));
  auto r = post("/v1/completions", {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 24}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  const std::string text = j["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text, generator_text(raw_tokens("Once upon a time"), 24));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(raw_tokens("Once upon a time").size()));
}

TEST_F(ServerTest, CompletionStreamsTheSameTextAsServerSentEvents) {
  start(with(2));
  const json req = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 16}};
  auto plain = post("/v1/completions", req);
  json stream_req = req;
  stream_req["stream"] = true;
  stream_req["stream_options"] = {{"include_usage", true}};
  auto r = post("/v1/completions", stream_req);
  ASSERT_TRUE(plain && r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const auto events = sse_data(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    if (!e["choices"].empty()) {
      text += e["choices"][0]["text"].get<std::string>();
      if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
    } else {
      usage = e["usage"];
    }
  }
  EXPECT_EQ(text, json::parse(plain->body)["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 16);
}

TEST_F(ServerTest, ChatCompletionPlainAndStreamed) {
  start(with(2));
  const json req = {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}},
                    {"temperature", 0},
                    {"max_tokens", 12}};
  auto r = post("/v1/chat/completions", req);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const std::string answer = j["choices"][0]["message"]["content"];
  EXPECT_FALSE(answer.empty());

  json sreq = req;
  sreq["stream"] = true;
  auto s = post("/v1/chat/completions", sreq);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  const auto events = sse_data(s->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, answer);
}

TEST_F(ServerTest, StopStringEndsTheAnswerBeforeIt) {
  start(with(2));
  const std::string full = generator_text(raw_tokens("Once upon a time"), 40);
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(10, 4);
  auto r = post("/v1/completions",
                {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 40}, {"stop", {stop}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, OllamaGenerateStreamsNdjsonWithTimings) {
  start(with(2));
  auto r = post("/api/generate", {{"model", "TinyStories-656K-Q8_0"},
                                  {"prompt", "Once upon a time"},
                                  {"raw", true},
                                  {"options", {{"temperature", 0}, {"repeat_penalty", 1.0}, {"num_predict", 10}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto lines = ndjson_lines(r->body);
  ASSERT_GE(lines.size(), 2u);
  std::string text;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_FALSE(lines[i]["done"].get<bool>());
    text += lines[i]["response"].get<std::string>();
  }
  const json& last = lines.back();
  EXPECT_TRUE(last["done"].get<bool>());
  EXPECT_EQ(last["done_reason"], "length");
  EXPECT_EQ(last["eval_count"], 10);
  EXPECT_GT(last["prompt_eval_count"].get<int>(), 0);
  EXPECT_GT(last["total_duration"].get<int64_t>(), 0);
  EXPECT_GT(last["eval_duration"].get<int64_t>(), 0);
  EXPECT_TRUE(last.contains("load_duration"));
  EXPECT_EQ(text, generator_text(raw_tokens("Once upon a time"), 10));
}

// Ollama's context: the answer returns its prompt's and its own tokens; a
// request that sends them back continues that exchange (its new prompt
// read after them, without a second BOS), reading only what is not cached.
TEST_F(ServerTest, OllamaGenerateContextCarriesTheExchangeOn) {
  start(with(2));
  const json greedy = {{"temperature", 0}, {"repeat_penalty", 1.0}, {"num_predict", 10}};
  json longer = greedy;
  longer["num_predict"] = 24;  // prompt and answer fill a whole KV block, which the next request finds cached
  auto r = post("/api/generate", {{"model", "TinyStories-656K-Q8_0"}, {"prompt", "Once upon a time"}, {"raw", true},
                                  {"stream", false}, {"options", longer}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json first = json::parse(r->body);
  const std::vector<int32_t> prompt = raw_tokens("Once upon a time");
  const auto context = first["context"].get<std::vector<int32_t>>();
  ASSERT_EQ(context.size(), prompt.size() + 24);
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), context.begin()));
  auto d = post("/detokenize", {{"tokens", std::vector<int32_t>(context.begin() + static_cast<long>(prompt.size()), context.end())}});
  ASSERT_TRUE(d);
  EXPECT_EQ(json::parse(d->body)["content"], first["response"]);

  // Streamed, the last line carries it too.
  auto s = post("/api/generate", {{"model", "TinyStories-656K-Q8_0"}, {"prompt", " Then"}, {"raw", true},
                                  {"context", context}, {"options", greedy}});
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body;
  const json last = ndjson_lines(s->body).back();
  std::vector<int32_t> continued = context;
  std::vector<int32_t> then = raw_tokens(" Then");
  then.erase(then.begin());  // its BOS: the context already starts with one
  continued.insert(continued.end(), then.begin(), then.end());
  std::string text;
  for (const auto& line : ndjson_lines(s->body)) text += line["response"].get<std::string>();
  EXPECT_EQ(text, generator_text(continued, 10));
  const auto second_context = last["context"].get<std::vector<int32_t>>();
  ASSERT_EQ(second_context.size(), continued.size() + 10);
  EXPECT_TRUE(std::equal(continued.begin(), continued.end(), second_context.begin()));
  EXPECT_LT(last["prompt_eval_count"].get<size_t>(), continued.size());  // the context's full blocks were cached

  auto bad = post("/api/generate", {{"model", "TinyStories-656K-Q8_0"}, {"prompt", "x"}, {"context", {1, -2}}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("context"), std::string::npos);
}

// A list of prompts: n choices to each, prompt p's choice i at index
// p * n + i, each the answer the generator gives that prompt.
TEST_F(ServerTest, CompletionsAnswerAListOfPrompts) {
  start(with(2));
  const std::vector<std::string> texts = {"Once upon a time", "The dog"};
  const auto second_ids = raw_tokens(texts[1]);
  const json prompts = json::array({texts[0], second_ids});  // a string and a list of token ids
  auto r = post("/v1/completions", {{"prompt", prompts}, {"n", 2}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], generator_text(raw_tokens(texts[i / 2]), 6)) << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], raw_tokens(texts[0]).size() + second_ids.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);

  // Streamed: each index's pieces add up to its answer; echo starts each with its prompt.
  auto st = post("/v1/completions", {{"prompt", texts}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}, {"echo", true}});
  ASSERT_TRUE(st);
  ASSERT_EQ(st->status, 200) << st->body;
  std::vector<std::string> streamed(2);
  for (const auto& data : sse_data(st->body)) {
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    for (const auto& c : chunk["choices"]) streamed.at(c["index"].get<size_t>()) += c["text"].get<std::string>();
  }
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(streamed[i], texts[i] + generator_text(raw_tokens(texts[i]), 6)) << i;

  auto bad = post("/v1/completions", {{"prompt", json::array({"a", 3})}, {"max_tokens", 1}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
}

// Ollama's logprobs: each answer token's log-probability with top_logprobs
// alternatives, whole and spread over the streamed chunks.
TEST_F(ServerTest, OllamaLogprobsCoverEveryAnswerToken) {
  start(with(2));
  const json body = {{"model", "TinyStories-656K-Q8_0"}, {"prompt", "Once upon a time"}, {"raw", true}, {"stream", false},
                     {"logprobs", true}, {"top_logprobs", 2},
                     {"options", {{"temperature", 0}, {"repeat_penalty", 1.0}, {"num_predict", 8}}}};
  auto r = post("/api/generate", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json whole = json::parse(r->body);
  ASSERT_EQ(whole["logprobs"].size(), 8u) << r->body;
  std::string text;
  for (const auto& t : whole["logprobs"]) {
    text += t["token"].get<std::string>();
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);  // greedy: the most likely
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
  }
  EXPECT_EQ(text, whole["response"]);

  json streamed_body = body;
  streamed_body["stream"] = true;
  auto st = post("/api/generate", streamed_body);
  ASSERT_TRUE(st);
  size_t tokens = 0;
  for (const auto& line : ndjson_lines(st->body)) {
    if (line.contains("logprobs")) tokens += line["logprobs"].size();
  }
  EXPECT_EQ(tokens, 8u);

  auto bad = post("/api/chat", {{"model", "TinyStories-656K-Q8_0"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                {"logprobs", true}, {"top_logprobs", 21}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

TEST_F(ServerTest, OllamaChatWithoutStreaming) {
  start(with(2));
  auto r = post("/api/chat", {{"model", "TinyStories-656K-Q8_0"},
                              {"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                              {"stream", false},
                              {"options", {{"temperature", 0}, {"num_predict", 8}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_TRUE(j["done"].get<bool>());
  EXPECT_EQ(j["message"]["role"], "assistant");
  EXPECT_TRUE(j["message"]["content"].is_string());
  EXPECT_LE(j["eval_count"].get<int>(), 8);
}

TEST_F(ServerTest, InfoRoutes) {
  start(with(2));
  auto c = client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "TinyStories-656K-Q8_0");
  auto tags = c.Get("/api/tags");
  ASSERT_TRUE(tags);
  EXPECT_EQ(json::parse(tags->body)["models"][0]["name"], "TinyStories-656K-Q8_0:latest");
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto root = c.Get("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->body, "m40-llm is running");
  auto version = c.Get("/api/version");
  ASSERT_TRUE(version);
  EXPECT_TRUE(json::parse(version->body)["version"].is_string());
  auto ps = c.Get("/api/ps");
  ASSERT_TRUE(ps);
  EXPECT_EQ(ps->status, 200);
  auto show = post("/api/show", {{"model", "TinyStories-656K-Q8_0"}});
  ASSERT_TRUE(show);
  EXPECT_EQ(show->status, 200);
  EXPECT_EQ(json::parse(show->body)["details"]["format"], "gguf");
  auto tok = post("/tokenize", {{"content", "Once upon a time"}});
  ASSERT_TRUE(tok);
  ASSERT_EQ(tok->status, 200);
  const json tokens = json::parse(tok->body)["tokens"];
  EXPECT_FALSE(tokens.empty());
  auto detok = post("/detokenize", {{"tokens", tokens}});
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["content"], "Once upon a time");
}

TEST_F(ServerTest, MetricsCountRequestsAndTokens) {
  start(with(2));
  ASSERT_TRUE(post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 3}, {"temperature", 0}}));
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("# TYPE m40_requests_total counter"), std::string::npos);
  EXPECT_NE(m->body.find("m40_requests_total 1\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("m40_generated_tokens_total 3\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("m40_slots_total 2\n"), std::string::npos);
  EXPECT_NE(m->body.find("m40_queue_depth 0\n"), std::string::npos);
  EXPECT_NE(m->body.find("m40_kv_cache_cells 512\n"), std::string::npos) << m->body;  // 2 slots x 256
  // Tokens per second cover the interval since the previous scrape: 0 at the
  // first, positive after tokens were generated, 0 again when none were.
  EXPECT_NE(m->body.find("m40_generated_tokens_per_second 0\n"), std::string::npos) << m->body;
  ASSERT_TRUE(post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 3}, {"temperature", 0}}));
  const auto rate = [&] {
    auto body = client().Get("/metrics")->body;
    const std::string key = "\nm40_generated_tokens_per_second ";
    const size_t at = body.find(key);
    EXPECT_NE(at, std::string::npos) << body;
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + key.size()));
  };
  EXPECT_GT(rate(), 0.0);
  EXPECT_EQ(rate(), 0.0);
}

TEST_F(ServerTest, BadRequestsGetClearErrors) {
  start(with(2));
  auto c = client();
  auto malformed = c.Post("/v1/completions", "{\"prompt\": ", "application/json");
  ASSERT_TRUE(malformed);
  EXPECT_EQ(malformed->status, 400);
  const json err = json::parse(malformed->body);
  EXPECT_TRUE(err["error"]["message"].is_string());
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");

  auto wrong_type = post("/v1/completions", {{"prompt", "Hi"}, {"temperature", "hot"}});
  ASSERT_TRUE(wrong_type);
  EXPECT_EQ(wrong_type->status, 400);
  EXPECT_NE(wrong_type->body.find("temperature"), std::string::npos);

  auto bad_messages = post("/v1/chat/completions", {{"messages", "hello"}});
  ASSERT_TRUE(bad_messages);
  EXPECT_EQ(bad_messages->status, 400);

  auto bad_options = post("/api/generate", {{"prompt", "Hi"}, {"options", {{"num_predict", "ten"}}}});
  ASSERT_TRUE(bad_options);
  EXPECT_EQ(bad_options->status, 400);
  EXPECT_TRUE(json::parse(bad_options->body)["error"].is_string());

  auto unknown = c.Get("/v1/nothing-here");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_TRUE(json::parse(unknown->body)["error"]["message"].is_string());

  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "once upon a time ";
  auto too_long = post("/v1/completions", {{"prompt", long_prompt}});
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400);
  EXPECT_NE(too_long->body.find("context"), std::string::npos) << too_long->body;
}

// Integers past int32 used to be narrowed with a wrap: max_tokens 2^32 read as
// 0, a prompt token 2^32 + 1 as token 1, top_k 2^32 + 1 as 1 (greedy). Token
// limits and top_k are clamped (the context bounds the answer anyway; a top_k
// past the vocabulary is no limit); token ids outside the vocabulary are 400.
constexpr uint64_t kPastInt64 = 9223372036854775808ull;  // 2^63: JSON parses it as unsigned

TEST_F(ServerTest, TokenLimitsPastInt32MeanNoLimit) {
  start(with(2));
  auto completion = [&](json extra) {
    json body = {{"prompt", "Once upon a time"}, {"temperature", 0}};
    body.update(extra);
    return post("/v1/completions", body);
  };
  auto unlimited = completion(json::object());
  ASSERT_TRUE(unlimited);
  ASSERT_EQ(unlimited->status, 200) << unlimited->body;
  const json whole = json::parse(unlimited->body);
  ASSERT_GT(whole["usage"]["completion_tokens"].get<int>(), 0);
  for (const json& limit : {json{{"max_tokens", 4294967296ll}}, json{{"max_tokens", 2147483648ll}},
                            json{{"max_tokens", kPastInt64}}, json{{"max_tokens", 1e19}},
                            json{{"max_completion_tokens", 4294967296ll}}}) {
    auto r = completion(limit);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << limit << ": " << r->body;
    if (r->status != 200) continue;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]) << limit;
    EXPECT_EQ(j["choices"][0]["text"], whole["choices"][0]["text"]) << limit;
  }
  auto negative = completion({{"max_completion_tokens", -2}});
  ASSERT_TRUE(negative);
  EXPECT_EQ(negative->status, 400);
  EXPECT_NE(negative->body.find("max_completion_tokens"), std::string::npos) << negative->body;

  // Ollama: num_predict past int32 is no limit, as are -1 and -2.
  auto generate = [&](json num_predict) {
    auto r = post("/api/generate", {{"prompt", "Once upon a time"}, {"raw", true}, {"stream", false},
                                    {"options", {{"temperature", 0}, {"num_predict", num_predict}}}});
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << num_predict << ": " << r->body;
    return json::parse(r->body);
  };
  const json no_limit = generate(-1);
  ASSERT_GT(no_limit["eval_count"].get<int>(), 0);
  for (const json& n : {json(4294967296ll), json(kPastInt64), json(-2)}) {
    EXPECT_EQ(generate(n)["eval_count"], no_limit["eval_count"]) << n;
  }
  EXPECT_EQ(generate(3)["eval_count"], 3);
}

TEST_F(ServerTest, PromptTokenIdsPastInt32AreOutsideTheVocabulary) {
  start(with(2));
  for (const json& id : {json(4294967297ll), json(-4294967295ll), json(kPastInt64), json(100000)}) {
    auto r = post("/v1/completions", {{"prompt", json::array({1, id})}, {"max_tokens", 2}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << id << ": " << r->body;
    EXPECT_NE(r->body.find("out of range"), std::string::npos) << r->body;
  }
}

// top_k past int32 (either sign) is no limit, not top_k 1.
TEST_F(ServerTest, TopKPastInt32IsNoLimit) {
  start(with(2));
  auto sampled = [&](const std::string& path, json top_k) {
    json body = {{"prompt", "Once upon a time"}, {"seed", 7}, {"temperature", 1.5}, {"top_k", top_k}};
    if (path == "/v1/completions") {
      body["max_tokens"] = 24;
    } else {
      body = {{"prompt", "Once upon a time"}, {"raw", true}, {"stream", false},
              {"options", {{"seed", 7}, {"temperature", 1.5}, {"top_p", 1}, {"top_k", top_k}, {"num_predict", 24}}}};
    }
    auto r = post(path, body);
    EXPECT_TRUE(r);
    if (!r) return std::string();
    EXPECT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    return path == "/v1/completions" ? j["choices"][0]["text"].get<std::string>() : j["response"].get<std::string>();
  };
  for (const std::string path : {"/v1/completions", "/api/generate"}) {
    const std::string off = sampled(path, 0);
    EXPECT_NE(off, sampled(path, 1)) << path;  // the test can tell top_k 1 apart
    EXPECT_EQ(sampled(path, 4294967297ll), off) << path;
    EXPECT_EQ(sampled(path, -4294967295ll), off) << path;
    EXPECT_EQ(sampled(path, kPastInt64), off) << path;
  }
}

// keep_alive 1e10 s overflowed steady_clock and "nan" rounded to a negative
// duration: both unloaded the model at once. Now the first never expires and
// the second is refused.
TEST_F(ServerTest, KeepAlivePastTheClockNeverExpiresAndNanIsRefused) {
  start(with(2));
  auto generate = [&](json keep_alive) {
    return post("/api/generate", {{"prompt", "Hi"}, {"stream", false}, {"keep_alive", keep_alive},
                                  {"options", {{"num_predict", 2}}}});
  };
  auto ps = [&] {
    auto r = client().Get("/api/ps");
    EXPECT_TRUE(r);
    return r ? json::parse(r->body)["models"] : json::array();
  };
  auto centuries = generate(1e10);
  ASSERT_TRUE(centuries);
  ASSERT_EQ(centuries->status, 200) << centuries->body;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the reaper would have run
  json models = ps();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]["expires_at"], "9999-12-31T23:59:59Z");

  for (const json& bad : {json("nan"), json("inf"), json("-inf"), json("NaNs")}) {
    auto r = generate(bad);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad << ": " << r->body;
    EXPECT_NE(r->body.find("keep_alive"), std::string::npos) << r->body;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(ps().size(), 1u);
}

// "truncate": true lets a prompt over the context through: it keeps its BOS
// and its last tokens, leaving the token limit (at most half the context)
// to answer in — the same answer as sending those tokens.
TEST_F(ServerTest, APromptOverTheContextIsTruncatedWhenTheRequestAllowsIt) {
  start(with(1));  // --ctx 256
  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "once upon a time " + std::to_string(i) + " ";
  auto r = post("/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 8}, {"temperature", 0}, {"truncate", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json answer = json::parse(r->body);
  EXPECT_EQ(answer["usage"]["prompt_tokens"], 248);  // 256 - 8

  auto tok = post("/tokenize", {{"content", long_prompt}, {"add_special", true}});
  ASSERT_TRUE(tok);
  const std::vector<int> all = json::parse(tok->body)["tokens"].get<std::vector<int>>();
  ASSERT_GT(all.size(), 256u);
  std::vector<int> kept{all.front()};  // BOS
  kept.insert(kept.end(), all.end() - 247, all.end());
  auto same = post("/v1/completions", {{"prompt", kept}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(same);
  ASSERT_EQ(same->status, 200) << same->body;
  EXPECT_EQ(json::parse(same->body)["choices"][0]["text"], answer["choices"][0]["text"]);

  // Ollama: the same field; without a token limit, half the context is left.
  auto ollama = post("/api/generate", {{"prompt", long_prompt}, {"raw", true}, {"stream", false}, {"truncate", true},
                                       {"options", {{"temperature", 0}, {"num_predict", 4}}}});
  ASSERT_TRUE(ollama);
  ASSERT_EQ(ollama->status, 200) << ollama->body;
  EXPECT_EQ(json::parse(ollama->body)["prompt_eval_count"], 252);
  auto unlimited = post("/api/generate", {{"prompt", long_prompt}, {"raw", true}, {"stream", false}, {"truncate", true},
                                          {"options", {{"temperature", 0}, {"num_predict", 1}}}});
  ASSERT_TRUE(unlimited);
  EXPECT_EQ(json::parse(unlimited->body)["prompt_eval_count"], 255);
  auto refused = post("/api/generate", {{"prompt", long_prompt}, {"raw", true}, {"stream", false}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
}

TEST_F(ServerTest, HugeBodyIsRefusedWithoutHarm) {
  start(with(2));
  const std::string huge = "{\"prompt\": \"" + std::string(10u << 20, 'a') + "\"}";
  auto r = client().Post("/v1/completions", huge, "application/json");
  if (r) {
    EXPECT_TRUE(r->status == 413 || r->status == 400) << r->status;
  }
  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, ApiKeyIsRequiredExceptForHealth) {
  start(with(1, 16, "sekret"));
  auto c = client();
  auto none = c.Get("/v1/models");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");
  auto wrong = c.Get("/v1/models", {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto ok = c.Get("/v1/models", {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto tags = c.Get("/api/tags");
  ASSERT_TRUE(tags);
  EXPECT_EQ(tags->status, 401);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, HealthIs503WhileAModelLoads) {
  // The load waits at this gate (bounded), so the test sees it in progress.
  auto gate_open = std::make_shared<std::atomic<bool>>(false);
  server::ServerOptions o;
  o.port = 0;
  o.force_cpu = true;
  o.threads = 2;
  o.n_ctx = 128;
  o.allow_paths = true;
  o.wrap_backend = [gate_open](std::unique_ptr<backend::Backend> b) {
    for (int i = 0; i < 3000 && !gate_open->load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return b;
  };
  server_ = std::make_unique<server::Server>(o);
  port_ = server_->start();
  auto idle = client().Get("/health");
  ASSERT_TRUE(idle);
  EXPECT_EQ(idle->status, 200);  // no model asked for yet: nothing loads
  auto none = post("/v1/completions", {{"prompt", "Hi"}});
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 400) << none->body;  // no model named, none loaded

  int status = 0;
  std::thread request([&] {
    auto r = post("/v1/completions", {{"model", model_path().string()}, {"prompt", "Hi"}, {"max_tokens", 2}});
    if (r) status = r->status;
  });
  bool saw_loading = false;
  for (int i = 0; i < 500 && !saw_loading; ++i) {
    auto health = client().Get("/health");
    saw_loading = health && health->status == 503 && json::parse(health->body)["status"] == "loading";
    if (!saw_loading) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(saw_loading);
  EXPECT_FALSE(server_->ready());
  gate_open->store(true);
  request.join();
  EXPECT_EQ(status, 200);
  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, TwoConcurrentStreamsBothCompleteAsAlone) {
  start(with(2));
  pacing_->delay_ms = 3;  // long enough that the two overlap
  const json a = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 30}, {"stream", true}};
  const json b = {{"prompt", "The little dog"}, {"temperature", 0}, {"max_tokens", 30}, {"stream", true}};
  std::string body_a, body_b;
  int status_a = 0, status_b = 0;
  std::thread ta([&] {
    auto r = post("/v1/completions", a);
    if (r) status_a = r->status, body_a = r->body;
  });
  std::thread tb([&] {
    auto r = post("/v1/completions", b);
    if (r) status_b = r->status, body_b = r->body;
  });
  ta.join();
  tb.join();
  ASSERT_EQ(status_a, 200);
  ASSERT_EQ(status_b, 200);
  auto text_of = [](const std::string& body) {
    std::string text;
    for (const auto& d : sse_data(body)) {
      if (d == "[DONE]") break;
      const json e = json::parse(d);
      if (!e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
    }
    return text;
  };
  EXPECT_EQ(sse_data(body_a).back(), "[DONE]");
  EXPECT_EQ(sse_data(body_b).back(), "[DONE]");
  // Batched together, each answer is still the one it gets alone.
  EXPECT_EQ(text_of(body_a), generator_text(raw_tokens("Once upon a time"), 30));
  EXPECT_EQ(text_of(body_b), generator_text(raw_tokens("The little dog"), 30));
}

TEST_F(ServerTest, ClientThatDisconnectsFreesItsSlot) {
  start(with(1));
  pacing_->delay_ms = 20;  // the full answer would take 5 s
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto c = client();
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  c.send(req, res, error);  // ends early: the receiver said stop
  EXPECT_GE(chunks, 3);
  pacing_->delay_ms = 0;
  const auto t0 = std::chrono::steady_clock::now();
  // The only slot must come free: a new request completes.
  auto r = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const json m = json::parse(r->body);
  EXPECT_EQ(m["usage"]["completion_tokens"], 4);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  auto metrics = client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("m40_requests_cancelled_total 1\n"), std::string::npos) << metrics->body;
}

// The KV positions running requests hold: more than the prompt while one
// runs, 0 once it has finished.
TEST_F(ServerTest, MetricsShowKvCacheUse) {
  start(with(2));
  pacing_->delay_ms = 20;  // each step takes 20 ms: the request runs about a second
  const auto cells_used = [&] {
    const std::string body = client().Get("/metrics")->body;
    const std::string key = "\nm40_kv_cache_cells_used ";
    const size_t at = body.find(key);
    EXPECT_NE(at, std::string::npos) << body;
    return at == std::string::npos ? -1L : std::stol(body.substr(at + key.size()));
  };
  EXPECT_EQ(cells_used(), 0);
  std::thread request([&] { post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 48}, {"temperature", 0}}); });
  long seen = 0;
  for (int i = 0; i < 200 && seen <= 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = std::max(seen, cells_used());
  }
  request.join();
  EXPECT_GT(seen, 4) << "the prompt alone is 5 positions";
  EXPECT_LE(seen, 5 + 48);
  pacing_->delay_ms = 0;
  // The engine updates the gauge after the step that ended the request,
  // which may be after the client has its answer: wait (bounded) for that.
  long after = cells_used();
  for (int i = 0; i < 200 && after != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    after = cells_used();
  }
  EXPECT_EQ(after, 0);
}

TEST_F(ServerTest, QueueFullAnswers503) {
  start(with(1, 1));
  pacing_->gate_open = false;  // the engine stops at its first step
  const json hold = {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}};
  std::vector<std::thread> holders;
  std::atomic<int> ok{0};
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([&] {
      auto r = post("/v1/completions", hold);
      if (r && r->status == 200) ok.fetch_add(1);
    });
  }
  // Wait (bounded) until one request has the slot and one waits.
  bool full = false;
  for (int i = 0; i < 250 && !full; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto m = client().Get("/metrics");
    full = m && m->body.find("m40_queue_depth 1\n") != std::string::npos &&
           m->body.find("m40_slots_busy 1\n") != std::string::npos;
  }
  EXPECT_TRUE(full);
  auto r = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
  auto o = post("/api/generate", {{"prompt", "Hi"}, {"options", {{"num_predict", 2}}}});
  ASSERT_TRUE(o);
  EXPECT_EQ(o->status, 503);
  pacing_->gate_open = true;
  for (auto& t : holders) t.join();
  EXPECT_EQ(ok.load(), 2);  // the held requests still complete
}

TEST(HostPort, ParsesEnvironmentForms) {
  std::string host = "127.0.0.1";
  int port = 11434;
  server::parse_host_port("0.0.0.0:8080", host, port);
  EXPECT_EQ(host, "0.0.0.0");
  EXPECT_EQ(port, 8080);
  server::parse_host_port("http://localhost:9000/", host, port);
  EXPECT_EQ(host, "localhost");
  EXPECT_EQ(port, 9000);
  server::parse_host_port("example", host, port);
  EXPECT_EQ(host, "example");
  EXPECT_EQ(port, 9000);
  server::parse_host_port("[::1]:7000", host, port);
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 7000);
  EXPECT_THROW(server::parse_host_port("h:99999", host, port), Error);
}

// Ollama's options.num_gpu: the layers on GPUs the model is loaded with. A
// count other than the resident model's reloads it (load_duration > 0);
// -1 or none takes it as loaded; layers on a GPU this server does not use
// (it runs --cpu here) are refused by name.
TEST_F(ServerTest, NumGpuReloadsWithThatCountOrIsRefusedWithoutAGpu) {
  start(with(1));
  auto generate = [&](json options) {
    options["num_predict"] = 2;
    return post("/api/generate", {{"prompt", "Hi"}, {"stream", false}, {"options", options}, {"raw", true}});
  };
  auto loaded_again = [&](json options) {
    auto r = generate(std::move(options));
    EXPECT_TRUE(r);
    if (!r) return false;
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body).value("load_duration", int64_t{0}) > 0;
  };
  ASSERT_TRUE(generate(json::object()));  // loaded as the server says
  EXPECT_TRUE(loaded_again({{"num_gpu", 0}}));
  EXPECT_FALSE(loaded_again({{"num_gpu", 0}}));
  EXPECT_FALSE(loaded_again(json::object()));
  EXPECT_FALSE(loaded_again({{"num_gpu", -1}}));
  auto r = generate({{"num_gpu", 3}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("options.num_gpu 3 asks for layers on a GPU, and this server runs its models on the CPU (--cpu)"),
            std::string::npos)
      << r->body;
  r = generate({{"num_gpu", -2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("options.num_gpu must be a layer count"), std::string::npos) << r->body;
}

// options.num_ctx reloads the model with that context, as Ollama does;
// requests without it (and the OpenAI routes) take the model as loaded.
// Ollama's num_ctx: more than the resident model's context reloads it with
// that context; less is the request's own limit (the KV pool is shared:
// nothing reloads), for its prompt and its answer.
TEST_F(ServerTest, NumCtxIsTheRequestsContextAndALargerOneReloads) {
  start(with(1));
  auto context_of_resident = [&] {
    auto r = client().Get("/api/ps");
    EXPECT_TRUE(r);
    const json models = r ? json::parse(r->body)["models"] : json::array();
    return models.size() == 1 ? models[0]["context_length"].get<int>() : -1;
  };
  auto generate = [&](json options, const std::string& prompt = "Hi", json extra = json::object()) {
    if (!options.contains("num_predict")) options["num_predict"] = 2;
    json body = {{"prompt", prompt}, {"stream", false}, {"options", options}, {"raw", true}};
    body.update(extra);
    return post("/api/generate", body);
  };
  EXPECT_EQ(context_of_resident(), 256);  // the server's --ctx
  auto r = generate({{"num_ctx", 512}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(context_of_resident(), 512);
  r = generate(json::object());  // no num_ctx: whatever is loaded
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(context_of_resident(), 512);
  auto openai = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(openai);
  EXPECT_EQ(openai->status, 200) << openai->body;
  EXPECT_EQ(context_of_resident(), 512);

  // num_ctx 32 within the loaded 512: no reload; a prompt of 60 tokens does
  // not fit it, truncated it does, and the answer ends at 32 positions.
  std::string long_prompt;
  for (int i = 0; i < 4; ++i) long_prompt += "once upon a time there was a cat and a dog who lived by the sea. ";
  r = generate({{"num_ctx", 32}}, long_prompt);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("32"), std::string::npos) << r->body;
  r = generate({{"num_ctx", 32}, {"num_predict", -1}}, long_prompt, {{"truncate", true}, {"cache_prompt", false}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json cut = json::parse(r->body);
  EXPECT_EQ(cut["done_reason"], "length");
  EXPECT_EQ(cut["prompt_eval_count"].get<int>() + cut["eval_count"].get<int>(), 32 + 1) << r->body;  // the last token is not fed
  EXPECT_EQ(context_of_resident(), 512);

  for (const json& bad : {json(0), json(-5), json(int64_t{1} << 40)}) {
    r = generate({{"num_ctx", bad}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad << ": " << r->body;
    EXPECT_NE(r->body.find("num_ctx"), std::string::npos) << r->body;
  }
  EXPECT_EQ(context_of_resident(), 512);  // a refused request changes nothing
}

// The second turn of a chat begins with the first turn's rendered prompt:
// its KV blocks are reused and reported (OpenAI's cached_tokens; Ollama's
// prompt_eval_count counts only what was evaluated), the answer is the one
// a full read gives, and cache_prompt: false reads it all.
TEST_F(ServerTest, ASecondChatTurnReportsItsCachedTokens) {
  start(with(2));
  const std::string story =
      "Once upon a time there was a little girl named Lily. She liked to play outside in the park with her friends. "
      "One day she found a big red ball under a tree.";
  // With a system message TinyStories' fallback template writes a
  // transcript, which each later turn extends.
  json messages = json::array({{{"role", "system"}, {"content", "You tell stories to children."}},
                               {{"role", "user"}, {"content", story}}});
  auto first = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const json one = json::parse(first->body);
  EXPECT_EQ(one["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  messages.push_back({{"role", "assistant"}, {"content", one["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "What did she do with the ball?"}});

  auto second = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  const json two = json::parse(second->body);
  const int prompt = two["usage"]["prompt_tokens"], cached = two["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, one["usage"]["prompt_tokens"].get<int>() / 16 * 16);
  EXPECT_LT(cached, prompt);

  auto uncached = post("/v1/chat/completions",
                       {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"cache_prompt", false}});
  ASSERT_TRUE(uncached);
  const json three = json::parse(uncached->body);
  EXPECT_EQ(three["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(three["choices"][0]["message"]["content"], two["choices"][0]["message"]["content"]);

  // Ollama: the same conversation again, all of it cached but the last
  // token (whole blocks and the partly filled last one, copied).
  auto ollama = post("/api/chat", {{"model", "TinyStories-656K-Q8_0"}, {"messages", messages}, {"stream", false},
                                   {"options", {{"temperature", 0}, {"num_predict", 8}}}});
  ASSERT_TRUE(ollama);
  ASSERT_EQ(ollama->status, 200) << ollama->body;
  EXPECT_EQ(json::parse(ollama->body)["prompt_eval_count"].get<int>(), 1);

  const std::string metrics = client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("\nm40_prompt_tokens_cached_total " + std::to_string(cached + prompt - 1) + "\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("\nm40_kv_blocks_total "), std::string::npos);
}

// OpenAI's n: several answers to one prompt, whole and streamed; the later
// choices fork the first one's prompt blocks, all but the last token
// (counted in /metrics).
TEST_F(ServerTest, NChoicesAnswerWholeAndStreamed) {
  start(with(2));
  const std::string prompt = "Once upon a time there was a little girl named Lily. She liked to play outside in the park.";
  auto r = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"n", 3}, {"ignore_eos", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json whole = json::parse(r->body);
  ASSERT_EQ(whole["choices"].size(), 3u) << r->body;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(whole["choices"][i]["index"], i);
    EXPECT_EQ(whole["choices"][i]["text"], whole["choices"][0]["text"]);  // greedy
    EXPECT_EQ(whole["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(whole["usage"]["completion_tokens"], 18);
  const int prompt_tokens = whole["usage"]["prompt_tokens"];
  const std::string metrics = client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("\nm40_prompt_tokens_cached_total " + std::to_string(2 * (prompt_tokens - 1)) + "\n"),
            std::string::npos)
      << metrics;

  auto streamed = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                                {"max_tokens", 4}, {"temperature", 0}, {"n", 2}, {"stream", true}, {"ignore_eos", true},
                                                {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::vector<std::string> text(2);
  std::vector<int> finished(2, 0);
  int done_markers = 0;
  json usage;
  for (const auto& data : sse_data(streamed->body)) {
    if (data == "[DONE]") {
      ++done_markers;
      continue;
    }
    const json e = json::parse(data);
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
    for (const auto& c : e["choices"]) {
      const int index = c["index"];
      ASSERT_TRUE(index == 0 || index == 1) << data;
      if (c["delta"].contains("content")) text[index] += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) ++finished[index];
    }
  }
  EXPECT_EQ(done_markers, 1);
  EXPECT_EQ(finished, (std::vector<int>{1, 1}));
  EXPECT_EQ(text[0], text[1]);
  EXPECT_FALSE(text[0].empty());
  EXPECT_EQ(usage["completion_tokens"], 8);

  for (const json& bad : {json(0), json(17), json("2")}) {
    auto refused = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}, {"n", bad}});
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << bad << ": " << refused->body;
    EXPECT_NE(refused->body.find("'n'"), std::string::npos) << refused->body;
  }
}

// OpenAI's logprobs: chat (logprobs + top_logprobs) and completions
// (logprobs: N), whole and streamed; the tokens spell the answer.
TEST_F(ServerTest, LogprobsComeWithTheAnswersTokens) {
  start(with(1));
  const json messages = json::array({{{"role", "user"}, {"content", "Once upon a time"}}});
  auto r = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 6}, {"temperature", 0},
                                         {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 3}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json chat = json::parse(r->body)["choices"][0];
  const auto& content = chat["logprobs"]["content"];
  ASSERT_EQ(content.size(), 6u) << r->body;
  std::string spelled;
  for (const auto& t : content) {
    for (const auto& b : t["bytes"]) spelled += static_cast<char>(b.get<int>());
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    // Greedy without penalties: the token is the most likely one.
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);
    EXPECT_DOUBLE_EQ(t["top_logprobs"][0]["logprob"].get<double>(), t["logprob"].get<double>());
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
  }
  EXPECT_EQ(spelled, chat["message"]["content"].get<std::string>());

  // Streamed: the same tokens, spread over the chunks.
  auto s = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true},
                                         {"logprobs", true}, {"top_logprobs", 3}, {"stream", true}});
  ASSERT_TRUE(s);
  json streamed = json::array();
  for (const auto& data : sse_data(s->body)) {
    if (data == "[DONE]") continue;
    const json e = json::parse(data);
    for (const auto& c : e["choices"]) {
      if (c.contains("logprobs") && !c["logprobs"].is_null()) {
        for (const auto& t : c["logprobs"]["content"]) streamed.push_back(t);
      }
    }
  }
  EXPECT_EQ(streamed, content);

  // Completions: parallel lists, offsets into the text.
  auto c = post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0},
                                    {"ignore_eos", true}, {"logprobs", 2}});
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  const json completion = json::parse(c->body)["choices"][0];
  const auto& lp = completion["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u) << c->body;
  std::string joined;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size());
    joined += lp["tokens"][i].get<std::string>();
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
  }
  EXPECT_EQ(joined, completion["text"].get<std::string>());

  // Without the field: null, as OpenAI answers.
  auto plain = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(plain);
  EXPECT_TRUE(json::parse(plain->body)["choices"][0]["logprobs"].is_null());
  for (const json& bad : {json{{"top_logprobs", 2}}, json{{"logprobs", true}, {"top_logprobs", 21}}}) {
    json body = {{"messages", messages}, {"max_tokens", 2}};
    body.update(bad);
    auto refused = post("/v1/chat/completions", body);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << bad << ": " << refused->body;
  }
  auto refused = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}, {"logprobs", 6}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
}

// Fields the APIs define that the server does not implement are refused by
// name, never answered as if absent; their neutral values pass.
TEST_F(ServerTest, UnimplementedFieldsAreRefusedByName) {
  start(with(1));
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}};
  struct Case {
    const char* path;
    json extra;
    const char* field;
  };
  const Case refused[] = {
      {"/v1/chat/completions", {{"functions", json::array({tool["function"]})}}, "'functions'"},
      {"/v1/chat/completions", {{"modalities", {"text", "audio"}}}, "'modalities'"},
      {"/v1/chat/completions", {{"store", true}}, "'store'"},
      {"/v1/completions", {{"tools", json::array({tool})}}, "'tools'"},
      {"/v1/completions", {{"echo", true}, {"logprobs", 1}}, "'echo'"},
      {"/v1/completions", {{"best_of", 3}}, "'best_of'"},
      {"/api/generate", {{"template", "{{ .Prompt }}"}}, "'template'"},
      {"/api/generate", {{"options", {{"mirostat", 2}}}}, "'options.mirostat'"},
      {"/api/chat", {{"options", {{"num_batch", 64}}}}, "'options.num_batch'"},
  };
  auto body_for = [&](const char* path, const json& extra) {
    json body = {{"stream", false}};
    if (std::string(path) == "/v1/completions" || std::string(path) == "/api/generate") body["prompt"] = "Hi";
    else body["messages"] = messages;
    if (std::string(path).rfind("/v1/", 0) == 0) body["max_tokens"] = 2;
    else body["options"] = {{"num_predict", 2}};
    for (const auto& [k, v] : extra.items()) {
      if (k == "options") body["options"].update(v);
      else body[k] = v;
    }
    return body;
  };
  for (const auto& c : refused) {
    auto r = post(c.path, body_for(c.path, c.extra));
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, 400) << c.path << " " << c.extra << ": " << r->body;
    EXPECT_NE(r->body.find(c.field), std::string::npos) << c.path << ": " << r->body;
  }
  // Neutral values are what the field's absence means.
  const Case neutral[] = {
      {"/v1/chat/completions", {{"tools", json::array()}, {"tool_choice", "none"}, {"modalities", {"text"}}}, ""},
      {"/v1/completions", {{"echo", false}, {"suffix", ""}, {"best_of", 1}}, ""},
      {"/api/chat", {{"think", false}, {"tools", json::array()}}, ""},
      {"/api/generate", {{"context", json::array()}, {"template", ""}}, ""},
  };
  for (const auto& c : neutral) {
    auto r = post(c.path, body_for(c.path, c.extra));
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, 200) << c.path << " " << c.extra << ": " << r->body;
  }
  // llama.cpp's n_predict is the token limit.
  auto limited = post("/v1/completions", {{"prompt", "Once upon a time"}, {"n_predict", 3}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_TRUE(limited);
  EXPECT_EQ(json::parse(limited->body)["usage"]["completion_tokens"], 3) << limited->body;
}

// Models loaded on demand: a request's `model` (a store name or a GGUF path)
// is loaded when it is not resident, keep_alive unloads idle models,
// /api/pull fills the store, load failures leave the server running, and a
// non-streaming request whose client left is cancelled.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "server/server.h"
#include "store/fake_hub.h"
#include "store/pull.h"
#include "in_process_server.h"
#include "wrapped_backend.h"
#include "store/store_test_home.h"
#include "test_paths.h"

using namespace m40;
using json = nlohmann::json;

namespace {

std::filesystem::path q8_model() { return test::tiny_q8_model(); }
std::filesystem::path q2_model() { return test::tiny_q2_model(); }

// Every forward step sleeps this long, so requests stay in the engine while
// the test acts.
class SlowBackend : public test::WrappedBackend {
 public:
  SlowBackend(std::unique_ptr<backend::Backend> inner, std::shared_ptr<std::atomic<int>> delay_ms)
      : WrappedBackend(std::move(inner)), delay_ms_(std::move(delay_ms)) {}
  void forward(const backend::Batch& batch, std::span<float> logits) override {
    if (int d = delay_ms_->load(); d > 0) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    inner().forward(batch, logits);
  }

 private:
  std::shared_ptr<std::atomic<int>> delay_ms_;
};

class ModelLoadingTest : public test::InProcessServerTest {
 protected:
  std::vector<std::filesystem::path> required_models() const override { return {q8_model(), q2_model()}; }

  // Copies a shared model into the store under `name`.
  void store_model(const std::filesystem::path& file, const std::string& name) {
    store::PullOptions o;
    o.ref = file.string();
    o.name = name;
    o.log = std::tmpfile();
    store::pull_model(store::Store::from_environment(), o);
    std::fclose(o.log);
  }

  void start(const std::string& default_model = "", int parallel = 2, server::KeepAlive keep_alive = {}) {
    server::ServerOptions o;
    o.n_ctx = 256;
    o.parallel = parallel;
    // Requests name the shared models by their paths, and pulls reach the
    // fake hub on 127.0.0.1.
    o.allow_paths = true;
    o.allow_private_pulls = true;
    o.keep_alive = keep_alive;
    o.wrap_backend = [d = delay_ms_, refused = refused_ctx_](std::unique_ptr<backend::Backend> b) -> std::unique_ptr<backend::Backend> {
      if (b->n_ctx() == refused->load()) throw Error("out of memory for this context (the test says so)");
      return std::make_unique<SlowBackend>(std::move(b), d);
    };
    start_server(o, default_model);
  }

  // Loading a model under load takes seconds on the CPU: a long read timeout.
  httplib::Client client(int read_timeout_s = 60) const { return InProcessServerTest::client(read_timeout_s); }
  httplib::Result post(const std::string& path, const json& body) const {
    return client().Post(path, body.dump(), "application/json");
  }
  json get_json(const std::string& path) const {
    auto r = client().Get(path);
    return r ? json::parse(r->body) : json();
  }
  // The names /api/ps shows.
  std::vector<std::string> loaded() const {
    std::vector<std::string> names;
    const json ps = get_json("/api/ps");
    if (!ps.contains("models")) ADD_FAILURE() << "/api/ps: " << ps;
    for (const auto& m : ps["models"]) names.push_back(m["name"]);
    return names;
  }
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    std::smatch m;
    const std::regex line("\n" + name + " ([0-9.e+]+)\n");
    return std::regex_search(r->body, m, line) ? std::stod(m[1]) : -1;
  }
  // A greedy Ollama generate; the answer's text ("" on failure).
  std::string generate(const std::string& model, const std::string& prompt, int n = 12, json keep_alive = nullptr) {
    json body = {{"model", model}, {"prompt", prompt}, {"raw", true}, {"stream", false},
                 {"options", {{"temperature", 0}, {"num_predict", n}}}};
    if (!keep_alive.is_null()) body["keep_alive"] = keep_alive;
    auto r = post("/api/generate", body);
    if (!r || r->status != 200) {
      ADD_FAILURE() << (r ? r->body : "no answer");
      return "";
    }
    return json::parse(r->body)["response"];
  }

  std::shared_ptr<std::atomic<int>> delay_ms_ = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> refused_ctx_ = std::make_shared<std::atomic<int>>(-1);  // a backend of this context fails
};

}  // namespace

TEST_F(ModelLoadingTest, AStoreModelIsListedAndLoadedWhenARequestNamesIt) {
  store_model(q8_model(), "tiny:q8_0");
  start();
  const json tags = get_json("/api/tags");
  ASSERT_EQ(tags["models"].size(), 1u) << tags;
  EXPECT_EQ(tags["models"][0]["name"], "tiny:q8_0");
  EXPECT_EQ(tags["models"][0]["size"], std::filesystem::file_size(q8_model()));
  EXPECT_EQ(tags["models"][0]["details"]["family"], "llama");
  EXPECT_EQ(get_json("/v1/models")["data"][0]["id"], "tiny:q8_0");
  EXPECT_TRUE(loaded().empty());  // nothing loads until asked

  auto r = post("/v1/chat/completions", {{"model", "tiny:q8_0"}, {"max_tokens", 4}, {"temperature", 0},
                                         {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["model"], "tiny:q8_0");
  const json ps = get_json("/api/ps");
  ASSERT_EQ(ps["models"].size(), 1u);
  EXPECT_EQ(ps["models"][0]["name"], "tiny:q8_0");
  EXPECT_EQ(ps["models"][0]["size_vram"], 0);  // CPU backend
  // The size counts the KV pool besides the weights, as Ollama's does.
  EXPECT_GT(ps["models"][0]["size"].get<uint64_t>(), std::filesystem::file_size(q8_model()));
  EXPECT_EQ(ps["models"][0]["device"], "CPU");
  // The store's sha256, as /api/tags gives it, so `m40-llm ps` shows the ID `list` shows.
  EXPECT_EQ(ps["models"][0]["digest"], tags["models"][0]["digest"]);
  EXPECT_EQ(ps["models"][0]["digest"].get<std::string>().size(), 64u);
  EXPECT_EQ(ps["models"][0]["context_length"], 256);
  EXPECT_NE(ps["models"][0]["expires_at"], "9999-12-31T23:59:59Z");  // 5 minutes by default
  // The store's file answers the same as the file it came from.
  EXPECT_EQ(generate("tiny:q8_0", "Once upon a time"), generate(q8_model().string(), "Once upon a time"));
}

TEST_F(ModelLoadingTest, AnUnknownModelIs404InEachApisShape) {
  start(q8_model().string());
  auto openai = post("/v1/completions", {{"model", "no-such-model"}, {"prompt", "Hi"}});
  ASSERT_TRUE(openai);
  EXPECT_EQ(openai->status, 404);
  EXPECT_EQ(json::parse(openai->body)["error"]["code"], "model_not_found");
  auto ollama = post("/api/chat", {{"model", "no-such-model"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_TRUE(ollama);
  EXPECT_EQ(ollama->status, 404);
  EXPECT_NE(json::parse(ollama->body)["error"].get<std::string>().find("no-such-model"), std::string::npos);
  auto model = client().Get("/v1/models/no-such-model");
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 404);
  // The default model still answers requests that name none.
  auto r = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ModelLoadingTest, KeepAliveUnloadsAnIdleModel) {
  store_model(q8_model(), "tiny:q8_0");
  start();
  generate("tiny:q8_0", "Hi", 2, 0);  // 0: unload right after
  EXPECT_TRUE(loaded().empty());

  generate("tiny:q8_0", "Hi", 2, -1);  // negative: forever
  const json ps = get_json("/api/ps");
  ASSERT_EQ(ps["models"].size(), 1u);
  EXPECT_EQ(ps["models"][0]["expires_at"], "9999-12-31T23:59:59Z");

  generate("tiny:q8_0", "Hi", 2, "1s");
  EXPECT_EQ(loaded(), std::vector<std::string>{"tiny:q8_0"});
  bool unloaded = false;
  for (int i = 0; i < 200 && !unloaded; ++i) {  // bounded: 10 s
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    unloaded = loaded().empty();
  }
  EXPECT_TRUE(unloaded);

  // Ollama's way to load and unload without generating: an empty prompt.
  auto load = post("/api/generate", {{"model", "tiny:q8_0"}});
  ASSERT_TRUE(load);
  EXPECT_EQ(json::parse(load->body)["done_reason"], "load");
  EXPECT_EQ(loaded().size(), 1u);
  auto unload = post("/api/generate", {{"model", "tiny:q8_0"}, {"keep_alive", 0}});
  ASSERT_TRUE(unload);
  EXPECT_EQ(json::parse(unload->body)["done_reason"], "unload");
  EXPECT_TRUE(loaded().empty());

  auto bad = post("/api/generate", {{"model", "tiny:q8_0"}, {"prompt", "Hi"}, {"keep_alive", "soon"}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

TEST_F(ModelLoadingTest, ARequestForAnotherModelWaitsForTheRunningOnesThenSwitches) {
  store_model(q8_model(), "tiny:q8_0");
  store_model(q2_model(), "tiny:q2_k");
  start();
  const std::string q8_alone = generate("tiny:q8_0", "Once upon a time", 24);
  const std::string q2_alone = generate("tiny:q2_k", "Once upon a time", 24);
  ASSERT_FALSE(q8_alone.empty());
  ASSERT_NE(q8_alone, q2_alone);  // the two models answer differently

  delay_ms_->store(20);  // the q8 stream runs ~0.5 s while the q2 request arrives
  std::string streamed;
  std::thread stream([&] {
    auto r = post("/api/generate", {{"model", "tiny:q8_0"}, {"prompt", "Once upon a time"}, {"raw", true},
                                    {"options", {{"temperature", 0}, {"num_predict", 24}}}});
    if (!r || r->status != 200) return;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) streamed += json::parse(line).value("response", "");
    }
  });
  // Once q8 is resident, the stream holds it (it asked for the load).
  for (int i = 0; i < 400 && loaded() != std::vector<std::string>{"tiny:q8_0"}; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(generate("tiny:q2_k", "Once upon a time", 24), q2_alone);
  stream.join();
  EXPECT_EQ(streamed, q8_alone);  // not cut short by the switch
  EXPECT_EQ(loaded(), std::vector<std::string>{"tiny:q2_k"});
}

TEST_F(ModelLoadingTest, AModelThatCannotLoadIsAnErrorAndTheServerGoesOn) {
  const auto broken = home_.path() / "broken.gguf";
  {
    std::ofstream out(broken);
    out << "GGUF but not really";
  }
  start(q8_model().string());
  auto r = post("/api/generate", {{"model", broken.string()}, {"prompt", "Hi"}, {"stream", false}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_NE(json::parse(r->body)["error"].get<std::string>().find("cannot load model 'broken'"), std::string::npos)
      << r->body;
  auto o = post("/v1/completions", {{"model", broken.string()}, {"prompt", "Hi"}});
  ASSERT_TRUE(o);
  EXPECT_EQ(o->status, 500);
  EXPECT_EQ(json::parse(o->body)["error"]["code"], "model_load_failed");
  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_FALSE(generate("", "Once upon a time", 4).empty());  // the default model loads again
}

// A request naming a corrupt file used to unload the resident model first
// (the next request paid a reload): the file is now opened and checked
// before anything is unloaded.
TEST_F(ModelLoadingTest, AModelThatCannotLoadLeavesTheResidentOneLoaded) {
  const auto corrupt = home_.path() / "corrupt.gguf";
  {  // a real model's header with its tensor data cut off
    std::ifstream in(q2_model(), std::ios::binary);
    std::string bytes(4096, '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::ofstream(corrupt, std::ios::binary) << bytes;
  }
  start(q8_model().string());
  const json before = get_json("/api/ps");
  ASSERT_EQ(before["models"].size(), 1u);
  auto r = post("/api/generate", {{"model", corrupt.string()}, {"prompt", "Hi"}, {"stream", false}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_NE(r->body.find("cannot load model 'corrupt'"), std::string::npos) << r->body;
  EXPECT_EQ(loaded(), std::vector<std::string>{"TinyStories-656K-Q8_0:latest"});
  // The same model, not a reload of it.
  auto next = post("/api/generate", {{"prompt", "Hi"}, {"stream", false}, {"options", {{"num_predict", 2}}}});
  ASSERT_TRUE(next);
  ASSERT_EQ(next->status, 200) << next->body;
  EXPECT_EQ(json::parse(next->body)["load_duration"], 0);
}

// A load that fails after the resident model was unloaded (a context the
// memory cannot hold) reloads the resident model as it was.
TEST_F(ModelLoadingTest, ALoadThatFailsForMemoryReloadsTheResidentModel) {
  start(q8_model().string());
  refused_ctx_->store(512);
  auto r = post("/api/generate", {{"prompt", "Hi"}, {"stream", false}, {"options", {{"num_ctx", 512}, {"num_predict", 2}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_NE(r->body.find("out of memory"), std::string::npos) << r->body;
  const json ps = get_json("/api/ps");
  ASSERT_EQ(ps["models"].size(), 1u) << ps;
  EXPECT_EQ(ps["models"][0]["context_length"], 256);
  EXPECT_FALSE(generate("", "Once upon a time", 4).empty());
}

TEST_F(ModelLoadingTest, PullStreamsProgressThenSuccessAndTheModelServes) {
  test::FakeHub hub;
  hub.add_file("files/tiny-story.gguf", q8_model());
  start();
  auto r = post("/api/pull", {{"model", hub.endpoint() + "/files/tiny-story.gguf"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<json> lines;
  std::istringstream in(r->body);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(json::parse(line));
  }
  ASSERT_GE(lines.size(), 3u) << r->body;
  EXPECT_EQ(lines.front()["status"], "pulling manifest");
  EXPECT_EQ(lines.back(), json({{"status", "success"}}));
  const auto size = std::filesystem::file_size(q8_model());
  bool saw_complete = false;
  for (const auto& l : lines) {
    if (!l.contains("completed")) continue;
    EXPECT_LE(l["completed"].get<uint64_t>(), size);
    saw_complete = saw_complete || (l["total"] == size && l["completed"] == size);
  }
  EXPECT_TRUE(saw_complete) << r->body;
  EXPECT_EQ(get_json("/api/tags")["models"][0]["name"], "tiny-story:latest");
  EXPECT_FALSE(generate("tiny-story", "Once upon a time", 4).empty());

  auto missing = post("/api/pull", {{"model", hub.endpoint() + "/files/missing.gguf"}, {"stream", false}});
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404) << missing->body;
  EXPECT_TRUE(json::parse(missing->body).contains("error"));
  auto nothing = post("/api/pull", {{"model", ""}});
  ASSERT_TRUE(nothing);
  EXPECT_EQ(nothing->status, 400);
}

TEST_F(ModelLoadingTest, ANonStreamingRequestIsCancelledWhenItsClientLeaves) {
  start(q8_model().string(), 1);
  delay_ms_->store(40);  // 200 tokens: ~8 s, far longer than the client waits
  auto impatient = client(1);  // gives up after 1 s and closes the connection
  auto r = impatient.Post("/v1/completions",
                          json({{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"ignore_eos", true}}).dump(),
                          "application/json");
  EXPECT_FALSE(r);  // timed out
  bool cancelled = false;
  for (int i = 0; i < 100 && !cancelled; ++i) {  // bounded: 5 s
    cancelled = metric("m40_requests_cancelled_total") == 1;
    if (!cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(cancelled);
  EXPECT_LT(metric("m40_generated_tokens_total"), 200);
  bool slot_free = false;  // the gauge follows the counter within a step
  for (int i = 0; i < 100 && !slot_free; ++i) {
    slot_free = metric("m40_slots_busy") == 0;
    if (!slot_free) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(slot_free);
  delay_ms_->store(0);
  auto next = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200);
}

// Fill-in-the-middle and echo through the server. A tiny random model in
// StarCoder's vocabulary (which has <fim_prefix>, <fim_suffix> and
// <fim_middle>) is written by `m40-llm gen-model`; an answer to prompt +
// suffix must be the answer to the prompt spelled out with those markers
// (a raw prompt whose special tokens are parsed): the same tokens, the same
// greedy text.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>

#include "binary_runner.h"
#include "in_process_server.h"
#include "test_paths.h"

using namespace m40;
using json = nlohmann::ordered_json;

namespace {

std::filesystem::path starcoder_vocab() { return test::shared_model("vocab/ggml-vocab-starcoder.gguf"); }

class FillInTheMiddleTest : public test::InProcessServerTest {
 protected:
  std::vector<std::filesystem::path> required_models() const override {
    return {starcoder_vocab(), test::shared_model("arch/tiny-qwen2-F32.gguf")};
  }
  void SetUp() override {
    InProcessServerTest::SetUp();
    if (IsSkipped()) return;
    model_ = home_.path() / "fim-coder.gguf";
    const auto r = test::run_binary({"gen-model", model_.string(), "--shape", "tiny-qwen2", "--type", "f16",
                                     "--tokenizer-from", starcoder_vocab().string(), "--layers", "1", "--threads", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    server::ServerOptions o;
    o.allow_paths = true;
    o.n_ctx = 256;
    start_server(o, model_);
  }
  json post_json(const std::string& path, json body, int status = 200) const {
    auto r = client(60).Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return nullptr;
    EXPECT_EQ(r->status, status) << r->body;
    return json::parse(r->body);
  }

  std::filesystem::path model_;
};

TEST_F(FillInTheMiddleTest, SuffixPutsThePromptAroundTheModelsMarkers) {
  const json greedy = {{"temperature", 0}, {"max_tokens", 8}, {"repeat_penalty", 1}};
  json fim = greedy;
  fim["prompt"] = "def add(a, b):\n    return ";
  fim["suffix"] = "\n\nprint(add(1, 2))\n";
  json spelled = greedy;
  spelled["prompt"] = "<fim_prefix>def add(a, b):\n    return <fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>";
  const json a = post_json("/v1/completions", fim);
  const json b = post_json("/v1/completions", spelled);
  EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);

  // Ollama's generate with a suffix: the same prompt, Ollama's defaults made greedy.
  const json o = post_json("/api/generate", {{"model", model_.string()}, {"prompt", fim["prompt"]}, {"suffix", fim["suffix"]},
                                             {"stream", false}, {"options", {{"temperature", 0}, {"num_predict", 8}, {"repeat_penalty", 1}}}});
  EXPECT_EQ(o["response"], a["choices"][0]["text"]);
}

TEST_F(FillInTheMiddleTest, ShowListsInsertAndAModelWithoutMarkersRefuses) {
  const json show = post_json("/api/show", {{"model", model_.string()}});
  const json caps = show["capabilities"];
  EXPECT_NE(std::find(caps.begin(), caps.end(), "insert"), caps.end()) << caps.dump();

  const auto plain = test::shared_model("arch/tiny-qwen2-F32.gguf").string();
  const json r = post_json("/v1/completions", {{"model", plain}, {"prompt", "x = "}, {"suffix", ";"}}, 400);
  EXPECT_NE(r.dump().find("fill-in-the-middle"), std::string::npos) << r.dump();
  const json no_caps = post_json("/api/show", {{"model", plain}})["capabilities"];
  EXPECT_EQ(std::find(no_caps.begin(), no_caps.end(), "insert"), no_caps.end()) << no_caps.dump();
}

TEST_F(FillInTheMiddleTest, EchoStartsTheTextWithThePrompt) {
  const json body = {{"prompt", "int main() {"}, {"temperature", 0}, {"max_tokens", 5}};
  const json plain = post_json("/v1/completions", body);
  json echo_body = body;
  echo_body["echo"] = true;
  const json echoed = post_json("/v1/completions", echo_body);
  EXPECT_EQ(echoed["choices"][0]["text"], "int main() {" + plain["choices"][0]["text"].get<std::string>());
  // Streamed: the prompt comes first, then the same pieces.
  echo_body["stream"] = true;
  auto r = client(60).Post("/v1/completions", echo_body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string text;
  size_t at = 0;
  while ((at = r->body.find("data: {", at)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", at);
    const json chunk = json::parse(r->body.substr(at + 6, end - at - 6));
    for (const auto& c : chunk["choices"]) text += c["text"].get<std::string>();
    at = end;
  }
  EXPECT_EQ(text, echoed["choices"][0]["text"]);
  // The prompt's own log-probabilities are not computed: refused, not faked.
  echo_body.erase("stream");
  echo_body["logprobs"] = 1;
  post_json("/v1/completions", echo_body, 400);
}

// llama.cpp's own routes: /infill (input_prefix, input_suffix, and prompt as
// the middle's beginning) and /completion, in llama.cpp's answer shape.
TEST_F(FillInTheMiddleTest, LlamaCppInfillAndCompletionRoutes) {
  const json greedy = {{"temperature", 0}, {"n_predict", 6}};
  json infill = greedy;
  infill["input_prefix"] = "def add(a, b):\n    return ";
  infill["input_suffix"] = "\n";
  infill["prompt"] = "a";
  const json a = post_json("/infill", infill);
  json spelled = greedy;
  spelled["prompt"] = "<fim_prefix>def add(a, b):\n    return <fim_suffix>\n<fim_middle>a";
  const json b = post_json("/completion", spelled);
  EXPECT_EQ(a["content"], b["content"]);
  EXPECT_EQ(a["tokens_evaluated"], b["tokens_evaluated"]);
  EXPECT_EQ(a["tokens_predicted"], 6);
  EXPECT_EQ(a["stop"], true);
  EXPECT_EQ(a["stop_type"], "limit");
  EXPECT_TRUE(a["timings"].contains("predicted_per_second"));

  // Streamed: content pieces, then a last object with stop: true.
  spelled["stream"] = true;
  auto r = client(60).Post("/completion", spelled.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  bool stopped = false;
  size_t at = 0;
  while ((at = r->body.find("data: {", at)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", at);
    const json chunk = json::parse(r->body.substr(at + 6, end - at - 6));
    text += chunk["content"].get<std::string>();
    stopped = chunk["stop"].get<bool>();
    at = end;
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, b["content"]);

  // What it does not implement is named.
  // n_probs: each token's log-probability and that many alternatives.
  json probs = greedy;
  probs["prompt"] = "x = ";
  probs["n_probs"] = 3;
  const json p = post_json("/completion", probs);
  ASSERT_EQ(p["completion_probabilities"].size(), 6u) << p.dump();
  std::string spelled_text;
  for (const auto& t : p["completion_probabilities"]) {
    spelled_text += t["token"].get<std::string>();
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_EQ(t["top_logprobs"][0]["id"], t["id"]);  // greedy: the most likely
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
  }
  EXPECT_EQ(spelled_text, p["content"]);
  probs["post_sampling_probs"] = true;
  EXPECT_NE(post_json("/completion", probs, 400).dump().find("post_sampling_probs"), std::string::npos);
  json extra = infill;
  extra["input_extra"] = json::array({{{"filename", "a.py"}, {"text", "x = 1"}}});
  EXPECT_NE(post_json("/infill", extra, 400).dump().find("input_extra"), std::string::npos);
}

}  // namespace

// Load: 64 clients streaming at once from one `m40-llm serve` process (half
// OpenAI SSE, half Ollama NDJSON). Every request completes without error,
// its streamed pieces concatenate to the non-streamed greedy answer for the
// same prompt (tokens in order, none lost), and the server's memory does
// not grow across rounds.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <sstream>
#include <thread>

#include "serve_process.h"
#include "test_paths.h"

using json = nlohmann::json;

namespace {

constexpr int kClients = 64;
constexpr int kTokens = 16;
const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog", "Lily and Ben went", "One day, a bird"};

struct Outcome {
  int status = 0;
  std::string text;
  std::string problem;  // empty: a well-formed stream that ended properly
};

httplib::Client client_for(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(10);
  c.set_read_timeout(120);
  return c;
}

// One streaming request; OpenAI's SSE or Ollama's NDJSON.
Outcome stream_once(int port, const std::string& prompt, bool openai) {
  Outcome o;
  auto c = client_for(port);
  json body;
  if (openai) {
    body = {{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}, {"stream", true}};
  } else {
    body = {{"prompt", prompt}, {"raw", true},
            {"options", {{"temperature", 0}, {"repeat_penalty", 1.0}, {"num_predict", kTokens}}}};
  }
  auto r = c.Post(openai ? "/v1/completions" : "/api/generate", body.dump(), "application/json");
  if (!r) {
    o.problem = "no answer: " + httplib::to_string(r.error());
    return o;
  }
  o.status = r->status;
  std::istringstream in(r->body);
  std::string line;
  bool ended = false;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (openai) {
      if (line.rfind("data: ", 0) != 0) continue;
      const std::string data = line.substr(6);
      if (data == "[DONE]") break;
      const json j = json::parse(data);
      if (j.contains("error")) o.problem = "error event: " + data;
      o.text += j["choices"][0]["text"].get<std::string>();
      ended = ended || !j["choices"][0]["finish_reason"].is_null();
    } else {
      const json j = json::parse(line);
      if (j.contains("error")) o.problem = "error line: " + line;
      o.text += j.value("response", "");
      ended = ended || j.value("done", false);
    }
  }
  if (!ended && o.problem.empty()) o.problem = "the stream did not end: " + r->body;
  return o;
}

std::string greedy_answer(int port, const std::string& prompt) {
  auto c = client_for(port);
  auto r = c.Post("/v1/completions", json({{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}}).dump(),
                  "application/json");
  if (!r || r->status != 200) return "";
  return json::parse(r->body)["choices"][0]["text"];
}

}  // namespace

TEST(ServerLoad, SixtyFourConcurrentStreamsCompleteInOrderWithStableMemory) {
  const auto model = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  m40::test::ServeProcess serve({model.string(), "--cpu", "--parallel", "16", "--queue", "64", "--ctx", "128",
                                 "--threads", "2"});
  ASSERT_TRUE(serve.running()) << serve.stderr_text();

  std::vector<std::string> expected;
  for (const auto& p : kPrompts) {
    expected.push_back(greedy_answer(serve.port(), p));
    ASSERT_FALSE(expected.back().empty()) << p;
  }
  auto round = [&] {
    std::vector<Outcome> outcomes(kClients);
    std::vector<std::thread> clients;
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&, i] {
        outcomes[i] = stream_once(serve.port(), kPrompts[i % kPrompts.size()], i % 2 == 0);
      });
    }
    for (auto& t : clients) t.join();
    for (int i = 0; i < kClients; ++i) {
      SCOPED_TRACE("client " + std::to_string(i));
      EXPECT_EQ(outcomes[i].status, 200);
      EXPECT_EQ(outcomes[i].problem, "");
      EXPECT_EQ(outcomes[i].text, expected[i % kPrompts.size()]);
    }
  };
  round();  // warm-up: thread pools, allocator arenas
  const long rss_before = serve.rss_kib();
  round();
  round();
  const long rss_after = serve.rss_kib();
  ASSERT_GT(rss_before, 0);
  // Generous: allocator noise is fine, growth per request is not.
  EXPECT_LE(rss_after, rss_before + rss_before / 2 + 32 * 1024) << "VmRSS " << rss_before << " kB -> " << rss_after << " kB";
  EXPECT_EQ(serve.stop(), 0) << serve.stderr_text();
}

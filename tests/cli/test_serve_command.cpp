// `m40-llm serve` as users start it: the binary on a free loopback port,
// answering, then stopping cleanly on SIGTERM; and its start-up errors.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "binary_runner.h"
#include "serve_process.h"

using namespace m40;

TEST(ServeCommand, ServesOnAFreePortAndStopsOnSigterm) {
  const auto model = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  test::ServeProcess serve({model.string(), "--cpu", "--parallel", "2", "--ctx", "128", "--threads", "2"});
  ASSERT_TRUE(serve.running()) << "no port announced: " << serve.stderr_text();
  httplib::Client client("127.0.0.1", serve.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(30);
  bool healthy = false;
  for (int i = 0; i < 500 && !healthy; ++i) {
    auto r = client.Get("/health");
    healthy = r && r->status == 200;
    if (!healthy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(healthy);
  auto r = client.Post("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})",
                       "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(nlohmann::json::parse(r->body)["usage"]["completion_tokens"], 5);
  EXPECT_EQ(serve.stop(), 0) << serve.stderr_text();  // SIGTERM: a clean exit
}

TEST(ServeCommand, AFileThatIsNoModelIsAnErrorNotAHang) {
  const auto not_a_model = std::filesystem::path(::testing::TempDir()) / "m40_serve_not_a_model.gguf";
  {
    std::ofstream out(not_a_model);
    out << "this is not a GGUF file";
  }
  const auto result = test::run_binary({"serve", not_a_model.string(), "--port", "0"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("error:"), std::string::npos) << result.err;
  std::filesystem::remove(not_a_model);
}

TEST(ServeCommand, ABadHostVariableIsAnError) {
  const auto model = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  ::setenv("M40_LLM_HOST", "127.0.0.1:notaport", 1);
  const auto result = test::run_binary({"serve", model.string()});
  ::unsetenv("M40_LLM_HOST");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("port"), std::string::npos) << result.err;
}

TEST(ServeCommand, WithoutAModelItServesTheStoreOnDemand) {
  const auto model = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  test::ServeProcess serve({"--cpu", "--threads", "1", "--ctx", "128", "--keep-alive", "0", "--allow-paths"});
  ASSERT_TRUE(serve.running()) << serve.stderr_text();
  EXPECT_NE(serve.stderr_text().find("models load on demand"), std::string::npos);
  httplib::Client client("127.0.0.1", serve.port());
  client.set_read_timeout(30);
  auto r = client.Post("/api/generate",
                       nlohmann::json({{"model", model.string()}, {"prompt", "Hi"}, {"stream", false},
                                       {"options", {{"num_predict", 3}}}}).dump(),
                       "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto ps = client.Get("/api/ps");
  ASSERT_TRUE(ps);
  EXPECT_EQ(nlohmann::json::parse(ps->body)["models"].size(), 0u);  // --keep-alive 0: unloaded after the request
  EXPECT_EQ(serve.stop(), 0) << serve.stderr_text();
}

TEST(ServeCommand, ABadKeepAliveIsAnError) {
  ::setenv("M40_LLM_KEEP_ALIVE", "soon", 1);
  const auto result = test::run_binary({"serve", "--port", "0"});
  ::unsetenv("M40_LLM_KEEP_ALIVE");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("keep_alive 'soon'"), std::string::npos) << result.err;
}

TEST(ServeCommand, ABadVramSizeIsAnError) {
  const auto result = test::run_binary({"serve", "--vram", "lots", "--port", "0"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("memory size 'lots'"), std::string::npos) << result.err;
}

TEST(ServeCommand, APrefillSlowdownMustBeAFactor) {
  for (const char* bad : {"-1", "fast"}) {
    const auto result = test::run_binary({"serve", "--prefill-slowdown", bad, "--port", "0"});
    EXPECT_NE(result.exit_code, 0) << bad;  // CLI11's code for a value refused
    EXPECT_NE(result.err.find("is not a factor: give 0 (pacing off) or a number such as 2"), std::string::npos)
        << result.err;
  }
}

// Web pages besides local ones: --origins, else $M40_LLM_ORIGINS.
TEST(ServeCommand, AllowedOriginsComeFromTheOptionOrTheEnvironment) {
  const auto model = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  auto status_for = [](int port, const std::string& origin) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5);
    auto r = client.Get("/api/version", {{"Origin", origin}});
    return r ? r->status : 0;
  };
  ::setenv("M40_LLM_ORIGINS", "https://env.example, https://*.env.example", 1);
  {
    test::ServeProcess serve({model.string(), "--cpu", "--threads", "1", "--ctx", "128"});
    ASSERT_TRUE(serve.running()) << serve.stderr_text();
    EXPECT_EQ(status_for(serve.port(), "https://env.example"), 200);
    EXPECT_EQ(status_for(serve.port(), "https://app.env.example"), 200);
    EXPECT_EQ(status_for(serve.port(), "https://flag.example"), 403);
  }
  {
    test::ServeProcess serve({model.string(), "--cpu", "--threads", "1", "--ctx", "128", "--origins", "https://flag.example"});
    ASSERT_TRUE(serve.running()) << serve.stderr_text();
    EXPECT_EQ(status_for(serve.port(), "https://flag.example"), 200);
    EXPECT_EQ(status_for(serve.port(), "https://env.example"), 403);  // the option wins
    EXPECT_EQ(status_for(serve.port(), "http://localhost:8080"), 200);
  }
  ::unsetenv("M40_LLM_ORIGINS");
}

// --allow-paths, --allow-private-pulls and --max-pull-size reach the
// server: without them a request's file path is refused and a pull from
// 127.0.0.1 too; with them the path loads and the pull is held to the cap.
TEST(ServeCommand, PathsAndPrivatePullsAreRefusedUnlessItsOptionsAllowThem) {
  const auto model = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  const auto help = test::run_binary({"serve", "--help"});
  for (const char* option : {"--allow-paths", "--allow-private-pulls", "--max-pull-size"}) {
    EXPECT_NE(help.out.find(option), std::string::npos) << option << " is not in serve --help:\n" << help.out;
  }
  const auto statuses = [&](int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(30);
    auto generate = client.Post("/api/generate",
                                nlohmann::json({{"model", model.string()}, {"prompt", "Hi"}, {"stream", false},
                                                {"options", {{"num_predict", 2}}}}).dump(),
                                "application/json");
    // A pull from this machine: port 1 answers nothing, so only the
    // refusal (403) or the cap (400) can come before a connection error.
    auto pull = client.Post("/api/pull", nlohmann::json({{"model", "http://127.0.0.1:1/model.gguf"}, {"stream", false}}).dump(),
                            "application/json");
    return std::make_pair(generate ? generate->status : 0, pull ? pull->status : 0);
  };
  {
    test::ServeProcess serve({"--cpu", "--threads", "1", "--ctx", "128"});
    ASSERT_TRUE(serve.running()) << serve.stderr_text();
    const auto [generate, pull] = statuses(serve.port());
    EXPECT_EQ(generate, 404);
    EXPECT_EQ(pull, 403);
  }
  {
    test::ServeProcess serve({"--cpu", "--threads", "1", "--ctx", "128", "--allow-paths", "--allow-private-pulls",
                              "--max-pull-size", "1G"});
    ASSERT_TRUE(serve.running()) << serve.stderr_text();
    const auto [generate, pull] = statuses(serve.port());
    EXPECT_EQ(generate, 200);
    EXPECT_EQ(pull, 500);  // connection refused: the pull was made
  }
  const auto bad = test::run_binary({"serve", "--max-pull-size", "lots", "--port", "0"});
  EXPECT_NE(bad.exit_code, 0);
}

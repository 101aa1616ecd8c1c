// `m40-llm serve` as users start it: the binary on a free loopback port,
// answering, then stopping cleanly on SIGTERM; and its start-up errors.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

#include "binary_runner.h"
#include "serve_process.h"

using namespace m40;

namespace {

// Waits (bounded) for the process to exit; kills it if it does not.
int wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

}  // namespace

TEST(ServeCommand, ServesOnAFreePortAndStopsOnSigterm) {
  const auto model = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  const auto err_path = std::filesystem::path(::testing::TempDir()) / ("m40_serve_" + std::to_string(::getpid()) + ".err");
  std::vector<std::string> storage{test::binary_path(), "serve", model.string(), "--port", "0", "--cpu",
                                   "--parallel", "2", "--ctx", "128", "--threads", "2"};
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, storage[0].c_str(), &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);

  // The port is in the first line on stderr.
  int port = 0;
  const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
  for (int i = 0; i < 500 && port == 0; ++i) {
    std::smatch m;
    const std::string err = test::read_text_file(err_path);
    if (std::regex_search(err, m, listening)) port = std::stoi(m[1]);
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (port == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    FAIL() << "no port announced: " << test::read_text_file(err_path);
  }
  httplib::Client client("127.0.0.1", port);
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

  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid, std::chrono::seconds(15)), 0) << test::read_text_file(err_path);
  std::filesystem::remove(err_path);
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
  test::ServeProcess serve({"--cpu", "--threads", "1", "--ctx", "128", "--keep-alive", "0"});
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

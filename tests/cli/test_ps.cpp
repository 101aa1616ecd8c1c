// `m40-llm ps` against a real `m40-llm serve` on a free loopback port, and
// the wording of its table.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include "binary_runner.h"
#include "cli/running_models.h"
#include "common/error.h"
#include "serve_process.h"

namespace {

namespace fs = std::filesystem;
using m40::test::run_binary;

// A loopback port nothing listens on (bound, read and released).
int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool wait_healthy(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  for (int i = 0; i < 1000; ++i) {
    if (auto r = client.Get("/health"); r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST(PsCommand, ListsTheModelARunningServerHasLoaded) {
  const auto model = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!fs::exists(model)) GTEST_SKIP() << "shared models missing";
  m40::test::ServeProcess serve({model.string(), "--cpu", "--ctx", "128", "--threads", "1"});
  ASSERT_NE(serve.port(), 0) << serve.stderr_text();
  ASSERT_TRUE(wait_healthy(serve.port())) << serve.stderr_text();

  const auto r = run_binary({"ps", "--port", std::to_string(serve.port())});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex header(R"(^NAME +ID +SIZE +PROCESSOR +UNTIL +DEVICE\n)");
  EXPECT_TRUE(std::regex_search(r.out, header)) << r.out;
  EXPECT_NE(r.out.find("TinyStories-656K-Q8_0"), std::string::npos) << r.out;
  // The weights (the file's 749,728 bytes, most of it) and the KV pool.
  std::smatch size;
  ASSERT_TRUE(std::regex_search(r.out, size, std::regex(R"(TinyStories-656K-Q8_0:latest +- +(\d+) KB)"))) << r.out;
  EXPECT_GT(std::stoi(size[1]), 700) << r.out;
  EXPECT_LT(std::stoi(size[1]), 2000) << r.out;
  EXPECT_NE(r.out.find("100% CPU"), std::string::npos) << r.out;  // --cpu
  EXPECT_NE(r.out.find(" CPU\n"), std::string::npos) << r.out;      // DEVICE: the CPU backend
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;

  // $M40_LLM_HOST finds it too, as `serve` reads it. (UNTIL counts down in
  // whole seconds between the two calls: "5 minutes" may become "4 minutes".)
  ::setenv("M40_LLM_HOST", ("127.0.0.1:" + std::to_string(serve.port())).c_str(), 1);
  const auto via_env = run_binary({"ps"});
  ::unsetenv("M40_LLM_HOST");
  EXPECT_EQ(via_env.exit_code, 0) << via_env.err;
  const std::regex countdown(R"(\d+ minutes from now)");
  EXPECT_EQ(std::regex_replace(via_env.out, countdown, "N minutes from now"),
            std::regex_replace(r.out, countdown, "N minutes from now"));
}

TEST(PsCommand, NoServerIsOneLineSayingToStartOne) {
  const auto r = run_binary({"ps", "--port", std::to_string(unused_port())});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: no m40-llm server answers at http://127.0.0.1:", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("m40-llm serve"), std::string::npos) << r.err;
}

TEST(RunningModels, ProcessorAndUntilReadAsOllamaPrintsThem) {
  using namespace m40::cli;
  EXPECT_EQ(processor_text(1000, 0), "100% CPU");
  EXPECT_EQ(processor_text(1000, 1000), "100% GPU");
  EXPECT_EQ(processor_text(1000, 520), "48%/52% CPU/GPU");

  const int64_t now = *parse_rfc3339("2026-01-01T12:00:00Z");
  EXPECT_EQ(*parse_rfc3339("2026-01-01T05:00:00.8375-07:00"), now);
  EXPECT_EQ(parse_rfc3339("yesterday"), std::nullopt);
  EXPECT_EQ(until_text("2026-01-01T12:04:30Z", now), "4 minutes from now");
  EXPECT_EQ(until_text("2026-01-01T12:01:10Z", now), "About a minute from now");
  EXPECT_EQ(until_text("9999-12-31T23:59:59Z", now), "Forever");
  EXPECT_EQ(until_text("2026-01-01T11:59:00Z", now), "Stopping...");
  EXPECT_EQ(until_text("", now), "Never");

  const auto ps = nlohmann::json::parse(R"({"models": [{"name": "llama3:latest", "size": 6654289920,
      "digest": "sha256:365c0bd3c000a25d28ddbf732fe1c6add414de7275464c4e4d1c3b5fcb5d8ad1",
      "size_vram": 6654289920, "expires_at": "2026-01-01T12:04:30Z"}]})");
  const auto rows = running_models_table(ps, now);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1], (std::vector<std::string>{"llama3:latest", "365c0bd3c000", "6.7 GB", "100% GPU", "4 minutes from now"}));
  EXPECT_THROW(running_models_table(nlohmann::json::parse(R"({"error": "x"})"), now), m40::Error);

  // An m40-llm server adds the backend: a DEVICE column.
  const auto ours = nlohmann::json::parse(R"({"models": [{"name": "tiny:q8_0", "size": 749728, "digest": "c773a9eb8883751131f30e0c1965c56b1102a4972fdac6a6f71fe156ba6d8cb7",
      "size_vram": 749728, "expires_at": "9999-12-31T23:59:59Z", "device": "CUDA"}]})");
  const auto our_rows = running_models_table(ours, now);
  ASSERT_EQ(our_rows.size(), 2u);
  EXPECT_EQ(our_rows[0].back(), "DEVICE");
  EXPECT_EQ(our_rows[1], (std::vector<std::string>{"tiny:q8_0", "c773a9eb8883", "750 KB", "100% GPU", "Forever", "CUDA"}));
}

// What a request may make the server fetch or read, on 127.0.0.1 only:
// /api/pull refuses loopback and private addresses (every connection,
// redirects and registries included) unless allow_private_pulls, refuses
// other schemes than http(s), caps the download (max_pull_size), stops when
// its client leaves and when the server stops; and no route opens a file a
// request names unless allow_paths, answering alike whether or not the file
// exists. Each test is bounded in time (a pull that would hang is waited for
// a few seconds, then the fake hub lets go).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "in_process_server.h"
#include "server/server.h"
#include "store/fake_hub.h"
#include "store/store_test_home.h"
#include "test_paths.h"

using namespace m40;
using json = nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

namespace fs = std::filesystem;

fs::path q8_model() { return test::tiny_q8_model(); }
fs::path q2_model() { return test::tiny_q2_model(); }
constexpr uint64_t kQ8Size = 749728;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string last_line(const std::string& body) {
  std::istringstream lines(body);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

// Whether no pull holds the partial file's lock (or there is none).
bool unlocked(const fs::path& partial) {
  const int fd = ::open(partial.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return true;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

// Waits (bounded) until the partial file is unlocked; the seconds it took,
// or -1 when it stayed locked for `limit`.
double seconds_until_unlocked(const fs::path& partial, std::chrono::milliseconds limit) {
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < limit) {
    if (unlocked(partial)) return seconds_since(t0);
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

bool wait_for_size(const fs::path& path, uint64_t bytes, std::chrono::milliseconds limit = 5000ms) {
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < limit) {
    std::error_code ec;
    if (fs::file_size(path, ec) == bytes && !ec) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

template <class Edit>
server::ServerOptions options(Edit edit) {
  server::ServerOptions o;
  edit(o);
  return o;
}

class HostilePullTest : public test::InProcessServerTest {
 protected:
  std::vector<fs::path> required_models() const override { return {q8_model(), q2_model()}; }
  void TearDown() override {
    hub_.release_stalls();
    InProcessServerTest::TearDown();
    ::unsetenv("M40_LLM_HF_ENDPOINT");
    ::unsetenv("M40_LLM_OLLAMA_REGISTRY");
  }

  // A server whose default model is the Q8 file (given as `serve MODEL`).
  void start(server::ServerOptions o = {}) {
    o.n_ctx = 128;
    start_server(o, q8_model());
  }
  int hub_port() const { return std::stoi(hub_.endpoint().substr(hub_.endpoint().rfind(':') + 1)); }
  fs::path partial(const std::string& name) const { return home_.path() / "models" / name / "latest" / "model.gguf.partial"; }
  bool stored(const std::string& name) const { return fs::exists(home_.path() / "models" / name / "latest" / "model.gguf"); }

  test::FakeHub hub_;
};

// ---- addresses ------------------------------------------------------------------

// The fake hub is on 127.0.0.1, spelled in every way a URL can: no request
// reaches it, and the answer says why. With allow_private_pulls the pull
// goes through.
TEST_F(HostilePullTest, APullFromALoopbackOrPrivateAddressIsRefused) {
  hub_.add_file("files/tiny.gguf", q8_model());
  start();
  const std::string port = std::to_string(hub_port());
  for (const std::string& host : {std::string("127.0.0.1"), std::string("localhost"), std::string("[::ffff:127.0.0.1]"),
                                  std::string("2130706433"), std::string("127.1"), std::string("0x7f.0.0.1")}) {
    const std::string url = "http://" + host + ":" + port + "/files/tiny.gguf";
    auto r = post("/api/pull", {{"model", url}, {"stream", false}});
    ASSERT_TRUE(r) << url;
    EXPECT_EQ(r->status, 403) << url << ": " << r->body;
    EXPECT_NE(r->body.find("not a public internet address"), std::string::npos) << r->body;
    EXPECT_NE(r->body.find("--allow-private-pulls"), std::string::npos) << r->body;
  }
  auto streamed = post("/api/pull", {{"model", hub_.endpoint() + "/files/tiny.gguf"}});
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);  // the stream had begun
  const json last = json::parse(last_line(streamed->body));
  EXPECT_NE(last.value("error", "").find("not a public internet address"), std::string::npos) << streamed->body;

  // The registries' listings and manifests are fetched under the same rule.
  ::setenv("M40_LLM_HF_ENDPOINT", hub_.endpoint().c_str(), 1);
  ::setenv("M40_LLM_OLLAMA_REGISTRY", hub_.endpoint().c_str(), 1);
  for (const char* ref : {"hf.co/test/tinystories:Q8_0", "tinystories:q8"}) {
    auto r = post("/api/pull", {{"model", ref}, {"stream", false}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << ref << ": " << r->body;
  }
  EXPECT_TRUE(hub_.requests().empty());
  EXPECT_FALSE(stored("tiny"));

  start(options([](auto& o) { o.allow_private_pulls = true; }));
  auto allowed = post("/api/pull", {{"model", hub_.endpoint() + "/files/tiny.gguf"}, {"stream", false}});
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->status, 200) << allowed->body;
  EXPECT_TRUE(stored("tiny"));
}

// ---- schemes --------------------------------------------------------------------

TEST_F(HostilePullTest, OnlyHttpAndHttpsArePulledRedirectsIncluded) {
  start(options([](auto& o) { o.allow_private_pulls = true; }));
  for (const char* ref : {"file:///etc/hostname", "file://localhost/etc/passwd", "ftp://127.0.0.1/model.gguf",
                          "gopher://127.0.0.1:70/model.gguf", "dict://127.0.0.1:11211/stat", "FILE:///etc/hostname"}) {
    auto r = post("/api/pull", {{"model", ref}, {"stream", false}});
    ASSERT_TRUE(r) << ref;
    EXPECT_EQ(r->status, 400) << ref << ": " << r->body;
  }
  hub_.add_redirect("file.gguf", "file:///etc/hostname");
  hub_.add_redirect("gopher.gguf", "gopher://127.0.0.1:70/model.gguf");
  for (const char* name : {"file.gguf", "gopher.gguf"}) {
    auto r = post("/api/pull", {{"model", hub_.redirect_url(name)}, {"stream", false}});
    ASSERT_TRUE(r) << name;
    EXPECT_EQ(r->status, 400) << name << ": " << r->body;
    EXPECT_NE(r->body.find("not supported"), std::string::npos) << r->body;
  }
  EXPECT_FALSE(fs::exists(home_.path() / "models") && !fs::is_empty(home_.path() / "models"));
}

// ---- size -----------------------------------------------------------------------

TEST_F(HostilePullTest, MaxPullSizeRefusesALargerModelBeforeItsBytes) {
  hub_.add_file("files/tiny.gguf", q8_model());
  start(options([](auto& o) {
    o.allow_private_pulls = true;
    o.max_pull_size = 100000;
  }));
  auto r = post("/api/pull", {{"model", hub_.endpoint() + "/files/tiny.gguf"}, {"stream", false}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("more than the server's --max-pull-size"), std::string::npos) << r->body;
  EXPECT_FALSE(fs::exists(partial("tiny")));
  EXPECT_FALSE(stored("tiny"));

  start(options([](auto& o) {
    o.allow_private_pulls = true;
    o.max_pull_size = kQ8Size;
  }));
  r = post("/api/pull", {{"model", hub_.endpoint() + "/files/tiny.gguf"}, {"stream", false}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// ---- the client leaves, the server stops -------------------------------------

// The hub stalls halfway; the client gives up after a second. The pull
// stops (its partial file's lock is let go), whether it streamed or not,
// and what arrived stays for a resume.
TEST_F(HostilePullTest, APullStopsWhenItsClientLeaves) {
  hub_.add_file("files/tiny.gguf", q8_model()).stall_at_half = true;
  start(options([](auto& o) { o.allow_private_pulls = true; }));
  for (const bool stream : {true, false}) {
    auto impatient = client(1);
    auto r = impatient.Post("/api/pull", json({{"model", hub_.endpoint() + "/files/tiny.gguf"}, {"stream", stream}}).dump(),
                            "application/json");
    EXPECT_FALSE(r) << "stream " << stream << ": the pull did not stall";
    const double took = seconds_until_unlocked(partial("tiny"), 4000ms);
    EXPECT_GE(took, 0) << "stream " << stream << ": the pull went on after its client left";
    EXPECT_EQ(fs::file_size(partial("tiny")), kQ8Size / 2) << "stream " << stream;
  }
  hub_.release_stalls();
  auto resumed = post("/api/pull", {{"model", hub_.endpoint() + "/files/tiny.gguf"}, {"stream", false}});
  ASSERT_TRUE(resumed);
  EXPECT_EQ(resumed->status, 200) << resumed->body;
  const auto requests = hub_.requests_for("/files/tiny.gguf");
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().range, "bytes=" + std::to_string(kQ8Size / 2) + "-");
}

// A second pull of a name whose pull runs is the client's conflict (409),
// not a server failure; the running pull goes on undisturbed.
TEST_F(HostilePullTest, APullOfANameBeingPulledIs409) {
  hub_.add_file("files/tiny.gguf", q8_model()).stall_at_half = true;
  start(options([](auto& o) { o.allow_private_pulls = true; }));
  const std::string url = hub_.endpoint() + "/files/tiny.gguf";
  auto first = std::async(std::launch::async, [&] { return client(15).Post("/api/pull", json({{"model", url}, {"stream", false}}).dump(), "application/json"); });
  ASSERT_TRUE(wait_for_size(partial("tiny"), kQ8Size / 2));
  auto second = post("/api/pull", {{"model", url}, {"stream", false}});
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, 409) << second->body;
  EXPECT_NE(second->body.find("already"), std::string::npos) << second->body;
  hub_.release_stalls();
  auto done = first.get();
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 200) << done->body;
  EXPECT_TRUE(stored("tiny"));
}

// Stopping the server (SIGTERM) ends a pull that waits on a stalled source
// within the transport's grace, with an error line, the partial file kept.
TEST_F(HostilePullTest, APullStopsWhenTheServerStops) {
  hub_.add_file("files/tiny.gguf", q8_model()).stall_at_half = true;
  start(options([](auto& o) { o.allow_private_pulls = true; }));
  std::string body;
  std::mutex body_mutex;
  std::thread puller([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/api/pull";
    req.body = json({{"model", hub_.endpoint() + "/files/tiny.gguf"}}).dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      std::lock_guard lock(body_mutex);
      body.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    auto c = client(15);
    c.send(req, res, error);
  });
  ASSERT_TRUE(wait_for_size(partial("tiny"), kQ8Size / 2));
  auto stopped = std::async(std::launch::async, [&] { server_->stop(); });
  const bool in_time = stopped.wait_for(10s) == std::future_status::ready;  // a server that waits for the hub never ends
  hub_.release_stalls();  // lets a server that does not stop go on
  stopped.wait();
  puller.join();
  EXPECT_TRUE(in_time);
  const std::string last = last_line(body);
  ASSERT_FALSE(last.empty()) << body;
  EXPECT_NE(json::parse(last).value("error", "").find("shutting down"), std::string::npos) << body;
  EXPECT_TRUE(unlocked(partial("tiny")));
  EXPECT_EQ(fs::file_size(partial("tiny")), kQ8Size / 2);
}

// ---- file paths -----------------------------------------------------------------

// A request's `model` naming a file: refused on every route, with the same
// status and message (the path aside) for a model file that exists, other
// files that exist and paths that do not, so that no client learns what
// the disk holds. The default model keeps its path; allow_paths opens the
// others.
TEST_F(HostilePullTest, ARequestCannotNameAFileUnlessPathsAreAllowed) {
  start();
  const std::vector<std::string> paths = {q2_model().string(),   "/etc/hostname",     "/etc/passwd",
                                          "/no/such/model.gguf", "/etc/no-such-file", "../../../../etc/hostname",
                                          "./model.gguf",        "~/model.gguf"};
  const auto bodies = [](const std::string& model) -> std::vector<std::pair<std::string, json>> {
    const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
    return {{"/api/generate", {{"model", model}, {"prompt", "Hi"}, {"stream", false}}},
            {"/api/chat", {{"model", model}, {"messages", messages}, {"stream", false}}},
            {"/v1/completions", {{"model", model}, {"prompt", "Hi"}, {"max_tokens", 2}}},
            {"/v1/chat/completions", {{"model", model}, {"messages", messages}, {"max_tokens", 2}}},
            {"/api/show", {{"model", model}}},
            {"/tokenize", {{"model", model}, {"content", "Hi"}}},
            {"/api/pull", {{"model", model}, {"stream", false}}}};
  };
  for (size_t route = 0; route < bodies("").size(); ++route) {
    std::set<std::pair<int, std::string>> answers;
    for (const auto& path : paths) {
      const auto [route_path, body] = bodies(path)[route];
      auto r = post(route_path, body);
      ASSERT_TRUE(r) << route_path << " " << path;
      EXPECT_NE(r->status, 200) << route_path << " " << path << ": " << r->body;
      std::string text = r->body;
      for (size_t at; (at = text.find(path)) != std::string::npos;) text.replace(at, path.size(), "PATH");
      answers.insert({r->status, text});
    }
    EXPECT_EQ(answers.size(), 1u) << bodies("")[route].first << ": " << [&] {
      std::string all;
      for (const auto& [status, text] : answers) all += std::to_string(status) + " " + text + "\n";
      return all;
    }();
  }
  EXPECT_FALSE(fs::exists(home_.path() / "models") && !fs::is_empty(home_.path() / "models"));

  // The model given on the command line answers by its path.
  auto own = post("/api/generate", {{"model", q8_model().string()}, {"prompt", "Hi"}, {"stream", false},
                                    {"options", {{"num_predict", 2}}}});
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 200) << own->body;

  start(options([](auto& o) { o.allow_paths = true; }));
  auto other = post("/api/generate", {{"model", q2_model().string()}, {"prompt", "Hi"}, {"stream", false},
                                      {"options", {{"num_predict", 2}}}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200) << other->body;
  auto copied = post("/api/pull", {{"model", q2_model().string()}, {"stream", false}});
  ASSERT_TRUE(copied);
  EXPECT_EQ(copied->status, 200) << copied->body;
}

}  // namespace

// The server under hostile traffic, on 127.0.0.1 only: slow and idle
// connections, oversized and malformed requests, pages of other origins,
// shutdown with clients attached, client mistakes that must be 4xx. Each
// test is bounded in time (a few seconds) and the size probes in memory:
// the server runs in this process, so the growth of this process's peak
// resident memory over a probe is the server's (the probes' own buffers are
// made before it starts).
#include <gtest/gtest.h>
#include <httplib.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "in_process_server.h"
#include "paced_backend.h"
#include "raw_http.h"
#include "serve_process.h"
#include "server/origin_policy.h"
#include "server/server.h"
#include "store/store_test_home.h"
#include "test_paths.h"

using namespace m40;
using json = nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::filesystem::path model_path() { return test::shared_model("TinyStories-656K-Q8_0.gguf"); }


class HostileTrafficTest : public test::InProcessServerTest {
 protected:
  void start(server::ServerOptions o = {}) {
    if (o.n_ctx == 0) o.n_ctx = 256;
    o.wrap_backend = [p = pacing_](std::unique_ptr<backend::Backend> b) -> std::unique_ptr<backend::Backend> {
      return std::make_unique<test::PacedBackend>(std::move(b), p);
    };
    start_server(o, model_path());
  }

  // One request over a raw connection; what came back before the server
  // closed it (or `timeout` passed).
  std::string exchange(const std::string& request, std::chrono::milliseconds timeout = 2s) const {
    test::RawConnection c(port_);
    EXPECT_TRUE(c.connected());
    c.send(request);
    return c.read_until_closed(timeout);
  }

  std::shared_ptr<test::Pacing> pacing_ = std::make_shared<test::Pacing>();
};

// Connections that send a header byte now and then until the test ends.
class Tricklers {
 public:
  Tricklers(int port, int count) {
    for (int i = 0; i < count; ++i) conns_.push_back(std::make_unique<test::RawConnection>(port));
    thread_ = std::thread([this] {
      const std::string header = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(4096, 'a');
      for (size_t at = 0; !stop_.load() && at < header.size(); ++at) {
        for (auto& c : conns_) c->send(header.substr(at, 1));
        for (int i = 0; i < 10 && !stop_.load(); ++i) std::this_thread::sleep_for(20ms);
      }
    });
  }
  ~Tricklers() { stop(); }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    conns_.clear();
  }
  size_t connected() const {
    size_t n = 0;
    for (const auto& c : conns_) n += c->connected() ? 1 : 0;
    return n;
  }

 private:
  std::vector<std::unique_ptr<test::RawConnection>> conns_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string gzip_of_zeros(size_t n) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY);  // +16: gzip
  std::string zeros(1u << 20, '\0');
  std::string out;
  char buf[1u << 16];
  for (size_t done = 0; done < n; done += zeros.size()) {
    z.next_in = reinterpret_cast<Bytef*>(zeros.data());
    z.avail_in = static_cast<uInt>(zeros.size());
    const int flush = done + zeros.size() >= n ? Z_FINISH : Z_NO_FLUSH;
    do {
      z.next_out = reinterpret_cast<Bytef*>(buf);
      z.avail_out = sizeof buf;
      deflate(&z, flush);
      out.append(buf, sizeof buf - z.avail_out);
    } while (z.avail_out == 0);
  }
  deflateEnd(&z);
  return out;
}

// ServerOptions with what `edit` sets.
template <class Edit>
server::ServerOptions options(Edit edit) {
  server::ServerOptions o;
  edit(o);
  return o;
}

std::string prompt_of(size_t bytes) {
  std::string text;
  text.reserve(bytes);
  while (text.size() + 17 <= bytes) text += "once upon a time ";
  return text;
}

}  // namespace

// ---- 1. connections ---------------------------------------------------------

// cpp-httplib tied a thread to each connection: 25 tricklers (its pool)
// stopped every route until they ended. Here 200 leave /health answering.
// (Times are not asserted: a stalled route does not answer at all, which
// the client's bound catches on a loaded machine too.)
TEST_F(HostileTrafficTest, TwoHundredSlowConnectionsLeaveHealthAnswering) {
  start();
  Tricklers slow(port_, 200);
  ASSERT_EQ(slow.connected(), 200u);
  std::this_thread::sleep_for(300ms);  // every one has begun its header
  for (int i = 0; i < 10; ++i) {
    auto r = client(10).Get("/health");
    ASSERT_TRUE(r) << "no answer to /health with 200 slow connections open";
    EXPECT_EQ(r->status, 200);
    std::this_thread::sleep_for(50ms);
  }
  // A generation goes through as well.
  auto g = post("/api/generate", {{"prompt", "Hi"}, {"stream", false}, {"options", {{"num_predict", 4}}}});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 200) << g->body;
}

TEST_F(HostileTrafficTest, AHeaderOrBodyThatDoesNotArriveInTimeIs408AndTheConnectionCloses) {
  start(options([](auto& o) {
    o.limits.header_timeout = 500ms;
    o.limits.body_timeout = 500ms;
  }));
  {  // a header a byte every 100 ms
    test::RawConnection c(port_);
    const std::string header = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(100, 'a');
    std::string got;
    bool closed = false;
    for (char ch : header) {
      if (!c.send(std::string(1, ch))) break;
      got += c.read_until_closed(100ms, &closed);
      if (closed) break;
    }
    EXPECT_TRUE(closed);
    EXPECT_EQ(test::status_of(got), 408) << got;  // before the whole header (10 s of bytes) was sent
  }
  {  // a body that stops short of its Content-Length
    test::RawConnection c(port_);
    c.send("POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"prompt\":");
    bool closed = false;
    const std::string got = c.read_until_closed(10s, &closed);
    EXPECT_TRUE(closed);
    EXPECT_EQ(test::status_of(got), 408) << got;
  }
  {  // an idle connection closes without an answer
    test::RawConnection c(port_);
    bool closed = false;
    EXPECT_EQ(c.read_until_closed(10s, &closed), "");
    EXPECT_TRUE(closed);
  }
}

TEST_F(HostileTrafficTest, OneAddressMayHoldOnlyItsShareOfConnections) {
  start(options([](auto& o) { o.limits.max_connections_per_client = 8; }));
  std::vector<std::unique_ptr<test::RawConnection>> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(std::make_unique<test::RawConnection>(port_));
  std::this_thread::sleep_for(100ms);  // all accepted
  test::RawConnection ninth(port_);
  ninth.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  bool closed = false;
  const std::string got = ninth.read_until_closed(2s, &closed);
  EXPECT_EQ(test::status_of(got), 503) << got;
  EXPECT_NE(got.find("connections"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  idle.pop_back();
  idle.pop_back();
  std::this_thread::sleep_for(100ms);  // the server has seen them close
  auto r = client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HostileTrafficTest, PipelinedRequestsAreAllAnswered) {
  start();
  const std::string get = "GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const std::string body = R"({"content": "Once upon a time"})";
  const std::string post_tokenize = "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                    "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  const std::string last = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  const std::string got = exchange(get + post_tokenize + get + last);
  size_t answers = 0;
  for (size_t at = got.find("HTTP/1.1 200"); at != std::string::npos; at = got.find("HTTP/1.1 200", at + 1)) ++answers;
  EXPECT_EQ(answers, 4u) << got;
  EXPECT_NE(got.find("\"tokens\""), std::string::npos) << got;
  EXPECT_NE(got.find("\"status\":\"ok\""), std::string::npos) << got;
}

// ---- 2. sizes, before anything is buffered or parsed --------------------------

TEST_F(HostileTrafficTest, AGzipBodyIsRefusedWithoutInflatingIt) {
  start();
  const std::string bomb = gzip_of_zeros(256u << 20);  // 256 MiB of zeros in about 250 KB
  ASSERT_LT(bomb.size(), 1u << 20);
  test::PeakMemory memory;
  const std::string got = exchange("POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                   "Content-Encoding: gzip\r\nContent-Length: " + std::to_string(bomb.size()) + "\r\n\r\n" + bomb, 10s);
  EXPECT_EQ(test::status_of(got), 415) << got.substr(0, 200);
  EXPECT_LT(memory.growth_mib(), 100);
}

TEST_F(HostileTrafficTest, AChunkedBodyOverTheLimitIs413) {
  start();
  std::string chunk(64u << 10, ' ');
  char size[16];
  std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
  const std::string framed = size + chunk + "\r\n";
  test::PeakMemory memory;
  test::RawConnection c(port_);
  c.send("POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
  for (int i = 0; i < 256 && c.send(framed); ++i) {  // 16 MiB, twice the limit
  }
  const std::string got = c.read_until_closed(2s);
  EXPECT_EQ(test::status_of(got), 413) << got.substr(0, 200);
  EXPECT_LT(memory.growth_mib(), 100);
}

TEST_F(HostileTrafficTest, HeaderCountAndLineLengthAreCapped) {
  start();
  std::string many = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 200; ++i) many += "X-" + std::to_string(i) + ": a\r\n";
  EXPECT_EQ(test::status_of(exchange(many + "\r\n")), 431);
  const std::string long_line = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + std::string(12u << 10, 'a') + "\r\n\r\n";
  EXPECT_EQ(test::status_of(exchange(long_line)), 431);
  const std::string long_target = "GET /" + std::string(10u << 10, 'a') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const int status = test::status_of(exchange(long_target));
  EXPECT_TRUE(status == 414 || status == 431) << status;
  // Within the caps, all is well.
  EXPECT_EQ(test::status_of(exchange("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")), 200);
}

TEST_F(HostileTrafficTest, ARequestLineWithoutLfIsRefusedAtOnce) {
  start();
  const std::string line = "GET /" + std::string(4u << 20, 'a');
  test::PeakMemory memory;
  test::RawConnection c(port_);
  c.send(line);  // stops early when the server has answered and closed
  bool closed = false;
  const std::string got = c.read_until_closed(10s, &closed);
  const int status = test::status_of(got);
  EXPECT_TRUE(status == 431 || status == 414 || status == 400) << got.substr(0, 200);
  EXPECT_TRUE(closed);
  EXPECT_LT(memory.growth_mib(), 100);
}

TEST_F(HostileTrafficTest, NegativeHugeOrDuplicatedContentLengthIsRefusedAtOnce) {
  start();
  const std::string head = "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  struct Probe {
    std::string header;
    std::vector<int> statuses;
  };
  for (const Probe& p : {Probe{"Content-Length: -1\r\n", {400}},
                         Probe{"Content-Length: 99999999999999999999999\r\n", {400, 413}},
                         Probe{"Content-Length: 10000000000\r\n", {413}},
                         Probe{"Content-Length: 5\r\nContent-Length: 5\r\n", {400}},
                         Probe{"Content-Length: 5, 5\r\n", {400}}}) {
    test::RawConnection c(port_);
    c.send(head + p.header + "\r\n");  // no body: the answer must not wait for one (a 408 would)
    const std::string got = c.read_until("\r\n\r\n", 10s);
    const int status = test::status_of(got);
    EXPECT_NE(std::find(p.statuses.begin(), p.statuses.end(), status), p.statuses.end()) << p.header << got;
  }
}

// curl -d sends application/x-www-form-urlencoded: cpp-httplib refused
// such bodies over 8 KB.
TEST_F(HostileTrafficTest, AJsonBodySentAsAFormIsReadAsJson) {
  start();
  const json body = {{"content", prompt_of(20000)}};
  auto r = client().Post("/tokenize", body.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 200);
  EXPECT_GT(json::parse(r->body)["tokens"].size(), 1000u);
}

// Tokenizing an 8 MiB prompt cost 630 MB and 2 s; the context (256 tokens
// here) holds a few KB of it. The memory it takes shows it was not
// tokenized.
TEST_F(HostileTrafficTest, APromptThatCannotFitIsRefusedBeforeItIsTokenized) {
  start();
  const std::string body = json({{"prompt", prompt_of((8u << 20) - 4096)}, {"max_tokens", 4}}).dump();
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  {
    test::PeakMemory memory;
    const std::string got = exchange(request, 20s);
    EXPECT_EQ(test::status_of(got), 400) << got.substr(0, 300);
    EXPECT_NE(got.find("context"), std::string::npos) << got.substr(0, 300);
    EXPECT_LT(memory.growth_mib(), 100);
  }

  // Eight at once (5 GB before): each costs its body and its parse only.
  test::PeakMemory memory;
  std::vector<std::future<std::string>> all;
  for (int i = 0; i < 8; ++i) all.push_back(std::async(std::launch::async, [&] { return exchange(request, 20s); }));
  for (auto& f : all) EXPECT_EQ(test::status_of(f.get()), 400);
  EXPECT_LT(memory.growth_mib(), 600);  // measured 282 MiB: bodies and parses; one tokenization adds 630
}

// /tokenize tokenized its whole content: 8 MiB took ~600 MB. A text whose
// tokens could never be a prompt (context 256 here) is refused untouched.
TEST_F(HostileTrafficTest, TokenizeRefusesATextThatCannotFitAPrompt) {
  start();
  const std::string body = json({{"content", prompt_of((8u << 20) - 4096)}}).dump();
  test::PeakMemory memory;
  auto r = client().Post("/tokenize", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body.substr(0, 300);
  EXPECT_NE(r->body.find("context"), std::string::npos) << r->body.substr(0, 300);
  EXPECT_LT(memory.growth_mib(), 100);
  // A text that fits is still tokenized.
  auto small = client().Post("/tokenize", json({{"content", "once upon a time"}}).dump(), "application/json");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200) << small->body;
  EXPECT_FALSE(json::parse(small->body)["tokens"].empty());
}

// Each connection may send an 8 MiB body; 1024 connections could make the
// server hold 8 GiB. Bodies held at once are capped all together (64 MiB):
// past it a request is answered 503 before its body is read.
TEST_F(HostileTrafficTest, RequestBodiesHeldAtOnceAreCappedAcrossConnections) {
  start();
  constexpr size_t kBody = 7u << 20;
  const std::string head = "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           "Content-Length: " + std::to_string(kBody) + "\r\n\r\n";
  test::PeakMemory memory;
  std::vector<std::unique_ptr<test::RawConnection>> senders;
  for (int i = 0; i < 16; ++i) {
    senders.push_back(std::make_unique<test::RawConnection>(port_));
    ASSERT_TRUE(senders.back()->connected());
    senders.back()->send(head + std::string(1024, ' '));  // the body starts and stalls
  }
  int refused = 0;
  for (auto& c : senders) {
    const std::string got = c->read_until_closed(300ms);
    if (test::status_of(got) == 503) ++refused;
  }
  // 64 MiB hold nine 7 MiB bodies: the other seven wait for nothing.
  EXPECT_EQ(refused, 7);
  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // Once those connections close their shares return.
  senders.clear();
  std::this_thread::sleep_for(200ms);
  test::RawConnection again(port_);
  again.send(head + std::string(1024, ' '));
  EXPECT_EQ(test::status_of(again.read_until_closed(300ms)), 0) << "a body within the budget is read, not refused";
  EXPECT_LT(memory.growth_mib(), 100);
}

TEST_F(HostileTrafficTest, AHugePromptWithTruncateIsCutBeforeItIsTokenized) {
  start();
  const std::string body =
      json({{"prompt", prompt_of((8u << 20) - 4096)}, {"max_tokens", 8}, {"temperature", 0}, {"truncate", true}}).dump();
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  test::PeakMemory memory;
  const std::string got = exchange(request, 20s);
  ASSERT_EQ(test::status_of(got), 200) << got.substr(0, 300);
  const json answer = json::parse(got.substr(got.find("\r\n\r\n") + 4));
  EXPECT_EQ(answer["usage"]["prompt_tokens"], 248);  // BOS and the last 247 tokens: 256 - 8
  EXPECT_LT(memory.growth_mib(), 100);
  // The same answer as the prompt's end alone.
  auto same = post("/v1/completions", {{"prompt", prompt_of(17 * 300)}, {"max_tokens", 8}, {"temperature", 0}, {"truncate", true}});
  ASSERT_TRUE(same);
  EXPECT_EQ(json::parse(same->body)["choices"][0]["text"], answer["choices"][0]["text"]);
}

// ---- 4. browsers ----------------------------------------------------------------

TEST_F(HostileTrafficTest, APageOfAnotherOriginIsRefused) {
  start();
  const httplib::Headers evil = {{"Origin", "http://evil.example"}};
  auto tags = client().Get("/api/tags", evil);
  ASSERT_TRUE(tags);
  EXPECT_EQ(tags->status, 403);
  EXPECT_FALSE(tags->has_header("Access-Control-Allow-Origin"));
  auto gen = post("/api/generate", {{"prompt", "Hi"}, {"stream", false}}, evil);
  ASSERT_TRUE(gen);
  EXPECT_EQ(gen->status, 403);
  auto chat = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}, evil);
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 403);
  EXPECT_NE(chat->body.find("--origins"), std::string::npos) << chat->body;
  auto lookalike = client().Get("/api/tags", {{"Origin", "http://localhost.evil.example"}});
  ASSERT_TRUE(lookalike);
  EXPECT_EQ(lookalike->status, 403);
}

TEST_F(HostileTrafficTest, LocalPagesAndAppShellsMayReadTheAnswers) {
  start();
  for (const char* origin : {"http://localhost:3000", "https://localhost", "http://127.0.0.1:8080", "http://[::1]:5173",
                             "app://obsidian.md", "tauri://localhost", "file://"}) {
    auto r = client().Get("/api/tags", {{"Origin", origin}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << origin;
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), origin);
  }
}

TEST_F(HostileTrafficTest, APreflightOfAnAllowedOriginIsAnswered) {
  start(options([](auto& o) { o.api_key = "sekret"; }));
  test::RawConnection c(port_);
  c.send("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost:5173\r\n"
         "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type, x-stainless-os\r\n"
         "Connection: close\r\n\r\n");
  const std::string got = c.read_until_closed(2s);
  EXPECT_EQ(test::status_of(got), 204) << got;  // no API key needed for a preflight
  EXPECT_NE(got.find("Access-Control-Allow-Origin: http://localhost:5173\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Access-Control-Allow-Methods: "), std::string::npos) << got;
  EXPECT_NE(got.find("POST"), std::string::npos) << got;
  const size_t headers = got.find("Access-Control-Allow-Headers: ");
  ASSERT_NE(headers, std::string::npos) << got;
  const std::string allowed = got.substr(headers, got.find("\r\n", headers) - headers);
  for (const char* h : {"Authorization", "Content-Type", "x-stainless-os"}) {
    EXPECT_NE(allowed.find(h), std::string::npos) << h << " in " << allowed;
  }
  const std::string refused = exchange("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n"
                                       "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(test::status_of(refused), 403) << refused;
}

TEST_F(HostileTrafficTest, TheOriginsOptionAllowsMoreAndAStarAllowsAll) {
  start(options([](auto& o) { o.origins = {"https://app.example.com", "https://*.trusted.dev"}; }));
  for (const char* ok : {"https://app.example.com", "https://chat.trusted.dev"}) {
    auto r = client().Get("/api/tags", {{"Origin", ok}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << ok;
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), ok);
  }
  auto other = client().Get("/api/tags", {{"Origin", "https://example.com"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 403);
  server_->stop();
  start(options([](auto& o) { o.origins = {"*"}; }));
  auto any = client().Get("/api/tags", {{"Origin", "https://anything.example"}});
  ASSERT_TRUE(any);
  EXPECT_EQ(any->status, 200);
}

TEST(OriginPolicy, ListsAndPatterns) {
  EXPECT_EQ(server::OriginPolicy::parse_list(" a, b,,c "), (std::vector<std::string>{"a", "b", "c"}));
  const server::OriginPolicy policy({"https://*.example.com"});
  EXPECT_TRUE(policy.allows("https://a.example.com"));
  EXPECT_FALSE(policy.allows("https://example.com.evil.net"));
  EXPECT_TRUE(policy.allows("http://localhost"));
  EXPECT_FALSE(policy.allows("http://localhostevil.net"));
  EXPECT_FALSE(policy.allows("null"));
  EXPECT_TRUE(server::host_allowed("localhost:11434", "127.0.0.1"));
  EXPECT_TRUE(server::host_allowed("[::1]:8080", "127.0.0.1"));
  EXPECT_TRUE(server::host_allowed("127.0.0.2:80", "127.0.0.2"));
  EXPECT_FALSE(server::host_allowed("evil.example:11434", "127.0.0.1"));
  EXPECT_FALSE(server::host_allowed("127.0.0.1.evil.example", "127.0.0.1"));
}

// DNS rebinding: evil.example resolved to 127.0.0.1, its page sends Host: evil.example.
TEST_F(HostileTrafficTest, AHostThatIsNotThisServerIsRefused) {
  start();
  auto host = [&](const std::string& value) {
    return test::status_of(exchange("GET /api/tags HTTP/1.1\r\nHost: " + value + "\r\nConnection: close\r\n\r\n"));
  };
  const std::string port = std::to_string(port_);
  EXPECT_EQ(host("evil.example:" + port), 403);
  EXPECT_EQ(host("evil.example"), 403);
  EXPECT_EQ(host("localhost:" + port), 200);
  EXPECT_EQ(host("127.0.0.1:" + port), 200);
  EXPECT_EQ(host("[::1]:" + port), 200);
  EXPECT_EQ(host("LOCALHOST"), 200);
}

// ---- 5. lifecycle ------------------------------------------------------------------

// Stopping (what SIGTERM does): streams end with an error event, requests
// that wait get 503, and slow clients do not hold the stop.
TEST_F(HostileTrafficTest, StopEndsStreamsWithAnErrorAndSlowClientsDoNotHoldIt) {
  start(options([](auto& o) { o.parallel = 2; }));
  pacing_->delay_ms = 30;  // 300 tokens: 9 s, far longer than the test
  auto tricklers = std::make_unique<Tricklers>(port_, 20);
  struct Stream {
    std::string body;
    std::mutex mutex;
    std::atomic<bool> started{false};
  };
  auto run_stream = [&](const std::string& path, const json& body, Stream& out) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      std::lock_guard lock(out.mutex);
      out.body.append(data, n);
      out.started = true;
      return true;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    auto c = client(15);
    c.send(req, res, error);
  };
  Stream sse, ndjson;
  std::thread a([&] {
    run_stream("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}}, sse);
  });
  std::thread b([&] {
    run_stream("/api/generate", {{"prompt", "Once upon a time"}, {"options", {{"num_predict", 300}}}}, ndjson);
  });
  for (int i = 0; i < 300 && !(sse.started && ndjson.started); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(sse.started && ndjson.started);
  int waiting_status = 0;  // both slots are busy: this one waits in the queue
  std::thread c([&] {
    auto r = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 4}});
    if (r) waiting_status = r->status;
  });
  std::this_thread::sleep_for(200ms);

  auto stopped = std::async(std::launch::async, [&] { server_->stop(); });
  const bool in_time = stopped.wait_for(10s) == std::future_status::ready;  // a server that waits for them never ends
  tricklers.reset();  // lets a server that waits for them go on
  stopped.wait();
  a.join();
  b.join();
  c.join();
  EXPECT_TRUE(in_time);
  EXPECT_EQ(waiting_status, 503);
  const std::string sse_tail = sse.body.substr(sse.body.size() > 400 ? sse.body.size() - 400 : 0);
  EXPECT_NE(sse_tail.find("data: {\"error\":"), std::string::npos) << sse_tail;
  EXPECT_NE(sse_tail.find("shutting down"), std::string::npos) << sse_tail;
  EXPECT_EQ(sse_tail.substr(sse_tail.size() >= 14 ? sse_tail.size() - 14 : 0), "data: [DONE]\n\n") << sse_tail;
  std::istringstream lines(ndjson.body);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty()) last = line;
  }
  EXPECT_TRUE(json::parse(last).contains("error")) << last;
}

TEST(ServeLifecycle, SigtermEndsTheProcessWithSlowClientsConnected) {
  const auto model = model_path();
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared models not found";
  std::signal(SIGPIPE, SIG_IGN);
  test::ServeProcess serve({model.string(), "--cpu", "--threads", "1", "--ctx", "128"});
  ASSERT_TRUE(serve.running()) << serve.stderr_text();
  Tricklers slow(serve.port(), 40);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(serve.stop(), 0) << serve.stderr_text();  // SIGTERM, then SIGKILL after 15 s (-1)
}

// cpp-httplib set SO_REUSEPORT: a second server bound the same port and
// the kernel split the clients between the two.
TEST_F(HostileTrafficTest, ASecondServerOnABusyPortFailsWithAddressInUse) {
  start();
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = port_;
  server::Server second(o);
  try {
    second.bind();
    ADD_FAILURE() << "a second server bound port " << port_;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("address in use"), std::string::npos) << e.what();
  }
}

// repeat_penalty 1e-40 is > 0 (the sampler's domain) but turned logits into
// +inf mid-answer: a 500 for the client's mistake.
TEST_F(HostileTrafficTest, SamplerValuesThatOverflowAreTheClientsMistake) {
  start();
  auto openai = post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"repeat_penalty", 1e-40}});
  ASSERT_TRUE(openai);
  EXPECT_EQ(openai->status, 400) << openai->body;
  EXPECT_NE(openai->body.find("repeat_penalty"), std::string::npos) << openai->body;
  auto ollama = post("/api/generate", {{"prompt", "Once upon a time"}, {"stream", false},
                                       {"options", {{"repeat_penalty", 1e-40}, {"num_predict", 8}}}});
  ASSERT_TRUE(ollama);
  EXPECT_EQ(ollama->status, 400) << ollama->body;
  auto streamed = post("/api/generate", {{"prompt", "Once upon a time"}, {"options", {{"frequency_penalty", 1e38}}}});
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 400) << streamed->body;
  auto bias = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}, {"logit_bias", {{"5", 1e30}}}});
  ASSERT_TRUE(bias);
  EXPECT_EQ(bias->status, 400) << bias->body;
}

TEST_F(HostileTrafficTest, TheBearerSchemeIsCaseInsensitive) {
  start(options([](auto& o) { o.api_key = "sekret"; }));
  for (const char* auth : {"Bearer sekret", "bearer sekret", "BEARER sekret"}) {
    auto r = client().Get("/v1/models", {{"Authorization", auth}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << auth;
  }
  for (const char* auth : {"bearer SEKRET", "Basic sekret", "Bearersekret"}) {
    auto r = client().Get("/v1/models", {{"Authorization", auth}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << auth;
  }
}

TEST_F(HostileTrafficTest, ANulInAModelNameIsRefused) {
  start();
  const std::string name = model_path().string() + std::string(1, '\0') + ".evil";
  for (const auto& [path, body] : std::vector<std::pair<std::string, json>>{
           {"/api/generate", {{"model", name}, {"prompt", "Hi"}, {"stream", false}}},
           {"/v1/completions", {{"model", name}, {"prompt", "Hi"}}},
           {"/api/show", {{"model", name}}},
           {"/api/pull", {{"model", name}, {"stream", false}}}}) {
    auto r = post(path, body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path << ": " << r->body;
    EXPECT_NE(r->body.find("NUL"), std::string::npos) << r->body;
  }
}

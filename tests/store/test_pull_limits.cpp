// What a pull refuses to fetch, against the fake hub on 127.0.0.1: a file
// larger than the store's free space or the caller's cap (judged from the
// declared length before the body, and from the GGUF header in the first
// bytes), a stream longer or shorter than its own GGUF header says, a
// redirect to another scheme than http(s), and a connection, redirects
// included, to an address the caller's check refuses; and the pieces it is
// built of (probe_gguf, is_public_address, parse_pull_ref without local
// files). Every transfer that could hang on the old code is bounded: the
// pull runs on a thread the test waits for at most a few seconds.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "binary_runner.h"
#include "common/error.h"
#include "fake_hub.h"
#include "store/gguf_extent.h"
#include "store/http_download.h"
#include "store/pull.h"
#include "store_test_home.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using m40::test::BinaryResult;
using m40::test::run_binary;

const char* kQ8 = "TinyStories-656K-Q8_0.gguf";
const char* kQ2 = "TinyStories-656K-Q2_K.gguf";
constexpr uint64_t kQ8Size = 749728;

std::string shared_bytes(const char* model) { return m40::test::read_text_file(m40::test::shared_model(model)); }

// A GGUF header with one F32 tensor of rows x cols values and no metadata,
// padded to the data section (32 bytes).
std::string gguf_header(uint64_t rows, uint64_t cols) {
  std::string out;
  const auto put = [&out](auto value) { out.append(reinterpret_cast<const char*>(&value), sizeof value); };
  put(uint32_t{0x46554747});  // "GGUF"
  put(uint32_t{3});
  put(uint64_t{1});  // tensors
  put(uint64_t{0});  // metadata
  const std::string name = "huge.weight";
  put(uint64_t{name.size()});
  out += name;
  put(uint32_t{2});
  put(cols);
  put(rows);
  put(uint32_t{0});  // F32
  put(uint64_t{0});  // offset
  out.resize((out.size() + 31) / 32 * 32, '\0');
  return out;
}

m40::store::GgufProbe probe_bytes(const std::string& bytes, uint64_t available) {
  return m40::store::probe_gguf(
      [&bytes](uint64_t at, void* out, size_t size) {
        if (at >= bytes.size()) return size_t{0};
        const size_t n = std::min<size_t>(size, bytes.size() - at);
        std::memcpy(out, bytes.data() + at, n);
        return n;
      },
      available);
}

// ---- probe_gguf -------------------------------------------------------------

TEST(GgufExtent, TheSharedModelsEndWhereTheirHeadersSay) {
  for (const char* model : {kQ8, kQ2}) {
    const std::string bytes = shared_bytes(model);
    const auto probe = probe_bytes(bytes, bytes.size());
    ASSERT_EQ(probe.status, m40::store::GgufProbe::Status::Done) << model << ": " << probe.problem;
    EXPECT_LE(probe.extent.min_size, bytes.size()) << model;
    EXPECT_GE(probe.extent.max_size, bytes.size()) << model;
    EXPECT_LT(probe.extent.max_size - probe.extent.min_size, 32u) << model;
    // A prefix that ends inside the header asks for more, past its end.
    const auto early = probe_bytes(bytes, 1000);
    ASSERT_EQ(early.status, m40::store::GgufProbe::Status::NeedMore) << model;
    EXPECT_GT(early.need, 1000u);
  }
}

TEST(GgufExtent, BytesThatAreNoGgufAreInvalidFromTheFirstFour) {
  const std::string page = "<html>Sign in to continue</html>\n";
  EXPECT_EQ(probe_bytes(page, 4).status, m40::store::GgufProbe::Status::Invalid);
  EXPECT_EQ(probe_bytes(page, 3).status, m40::store::GgufProbe::Status::NeedMore);
}

TEST(GgufExtent, AHugeTensorIsKnownFromTheHeaderAlone) {
  const std::string header = gguf_header(uint64_t{1} << 30, uint64_t{1} << 30);
  const auto probe = probe_bytes(header, header.size());
  ASSERT_EQ(probe.status, m40::store::GgufProbe::Status::Done) << probe.problem;
  EXPECT_EQ(probe.extent.min_size, header.size() + (uint64_t{1} << 62));
  // A string length past any file is asked for, not read.
  std::string long_key = header.substr(0, 8);  // magic, version
  const auto put = [&long_key](uint64_t v) { long_key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(0);                   // tensors
  put(1);                   // metadata
  put(uint64_t{1} << 50);   // the first key's length
  const auto key = probe_bytes(long_key, long_key.size());
  ASSERT_EQ(key.status, m40::store::GgufProbe::Status::NeedMore);
  EXPECT_EQ(key.need, 32 + (uint64_t{1} << 50));
}

// ---- is_public_address ------------------------------------------------------

bool public_text(const std::string& text) {
  sockaddr_storage storage{};
  if (text.find(':') != std::string::npos) {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(storage);
    in6.sin6_family = AF_INET6;
    EXPECT_EQ(::inet_pton(AF_INET6, text.c_str(), &in6.sin6_addr), 1) << text;
  } else {
    auto& in = reinterpret_cast<sockaddr_in&>(storage);
    in.sin_family = AF_INET;
    EXPECT_EQ(::inet_pton(AF_INET, text.c_str(), &in.sin_addr), 1) << text;
  }
  return m40::store::is_public_address(reinterpret_cast<const sockaddr&>(storage));
}

TEST(PublicAddress, LoopbackPrivateAndLinkLocalAreNotPublic) {
  for (const char* address :
       {"127.0.0.1", "127.255.255.254", "10.0.0.1", "172.16.0.1", "172.31.255.255", "192.168.1.1", "169.254.169.254",
        "100.64.0.1", "100.127.255.255", "0.0.0.0", "0.1.2.3", "224.0.0.1", "255.255.255.255", "198.18.0.1",
        "::1", "::", "fc00::1", "fd12:3456::1", "fe80::1", "febf::1", "fec0::1", "ff02::1", "::ffff:127.0.0.1",
        "::ffff:10.1.2.3", "::ffff:169.254.169.254", "::127.0.0.1", "64:ff9b::7f00:1", "64:ff9b:1::1",
        "2002:7f00:1::", "2002:c0a8:101::1", "2001:0:4136:e378::1"}) {
    EXPECT_FALSE(public_text(address)) << address;
  }
  for (const char* address : {"8.8.8.8", "1.1.1.1", "172.15.255.255", "172.32.0.1", "100.63.255.255", "100.128.0.1",
                              "192.169.0.1", "169.253.0.1", "2606:4700::1111", "2a00:1450:4001::1", "::ffff:8.8.8.8",
                              "64:ff9b::808:808", "2002:808:808::1"}) {
    EXPECT_TRUE(public_text(address)) << address;
  }
  sockaddr unix_family{};
  unix_family.sa_family = AF_UNIX;
  EXPECT_FALSE(m40::store::is_public_address(unix_family));
}

// ---- parse_pull_ref without local files ---------------------------------------

TEST(PullRefWithoutLocalFiles, APathIsRefusedAlikeWhetherOrNotItExists) {
  using m40::store::parse_pull_ref;
  const std::string existing = m40::test::shared_model(kQ8).string();
  const std::string missing = existing + ".missing.gguf";
  EXPECT_EQ(parse_pull_ref(existing).kind, m40::store::SourceKind::LocalFile);  // the CLI's default
  std::vector<std::string> messages;
  for (const std::string& ref : {existing, missing, std::string("/etc/hostname"), std::string("/no/such/file")}) {
    try {
      parse_pull_ref(ref, false);
      ADD_FAILURE() << ref << " was read as a reference";
    } catch (const m40::Error& e) {
      std::string message = e.what();
      message.replace(message.find(ref), ref.size(), "REF");
      messages.push_back(message);
    }
  }
  ASSERT_EQ(messages.size(), 4u);
  for (const auto& m : messages) EXPECT_EQ(m, messages[0]);
  // What is no path is read as before.
  EXPECT_EQ(parse_pull_ref("hf.co/Org/Repo:Q8_0", false).kind, m40::store::SourceKind::HuggingFaceRepo);
  EXPECT_EQ(parse_pull_ref("qwen3:8b", false).kind, m40::store::SourceKind::OllamaLibrary);
  EXPECT_EQ(parse_pull_ref("http://example.com/x.gguf", false).kind, m40::store::SourceKind::Url);
}

// ---- pulls ------------------------------------------------------------------

class PullLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("M40_LLM_HF_ENDPOINT", hub.endpoint().c_str(), 1);
    ::unsetenv("HF_TOKEN");
  }
  void TearDown() override {
    hub.release_stalls();
    ::unsetenv("M40_LLM_HF_ENDPOINT");
  }

  // pull_model on a thread, waited for at most `limit`: the error it
  // threw ("" for none), or "TIMED OUT" (the stalls are released then, so
  // that the thread ends).
  std::string pull(m40::store::PullOptions options, std::chrono::seconds limit = 5s) {
    std::FILE* log = std::tmpfile();
    options.log = log;
    auto done = std::async(std::launch::async, [options]() -> std::string {
      try {
        m40::store::pull_model(m40::store::Store::from_environment(), options);
        return "";
      } catch (const std::exception& e) {
        return e.what();
      }
    });
    std::string result;
    if (done.wait_for(limit) != std::future_status::ready) {
      hub.release_stalls();
      done.wait();
      result = "TIMED OUT";
    } else {
      result = done.get();
    }
    std::fclose(log);
    return result;
  }
  m40::store::PullOptions url_pull(const std::string& url) const {
    m40::store::PullOptions o;
    o.ref = url;
    return o;
  }

  // Nothing of any model: no file, no partial, no folder.
  void expect_nothing_stored() const {
    const fs::path models = home.path() / "models";
    EXPECT_FALSE(fs::exists(models) && !fs::is_empty(models))
        << "left in the store: " << fs::recursive_directory_iterator(models)->path();
  }

  m40::test::TempStoreHome home;
  m40::test::FakeHub hub;
};

// The server declares a length no disk has free, then waits before its
// first byte: the pull is refused from the header, not after a wait.
TEST_F(PullLimits, ADeclaredLengthPastTheFreeSpaceIsRefusedBeforeTheBody) {
  auto& f = hub.add("files/huge.gguf", shared_bytes(kQ8));
  f.declared_length = uint64_t{1} << 60;
  f.stall_after = 0;
  const std::string error = pull(url_pull(hub.endpoint() + "/files/huge.gguf"));
  EXPECT_NE(error.find("more than the"), std::string::npos) << error;
  EXPECT_NE(error.find("free on the store's disk"), std::string::npos) << error;
  EXPECT_NE(error.find("nothing was stored"), std::string::npos) << error;
  expect_nothing_stored();
}

// No declared length (chunked): the GGUF header in the first bytes says the
// file is 4 EiB, and the download stops there.
TEST_F(PullLimits, AGgufHeaderThatDeclaresMoreThanTheFreeSpaceStopsTheDownload) {
  const std::string header = gguf_header(uint64_t{1} << 30, uint64_t{1} << 30);
  auto& f = hub.add("files/huge.gguf", header + std::string(1 << 20, '\0'));
  f.chunked = true;
  f.stall_after = header.size() + 65536;
  const std::string error = pull(url_pull(hub.endpoint() + "/files/huge.gguf"));
  EXPECT_NE(error.find("its GGUF header declares tensors"), std::string::npos) << error;
  EXPECT_NE(error.find("free on the store's disk"), std::string::npos) << error;
  expect_nothing_stored();
}

// The response says 400000 bytes, the header needs 749728: the file can
// only be truncated, which is known once the header is in.
TEST_F(PullLimits, ADeclaredLengthUnlikeTheHeadersStopsTheDownloadWhenTheHeaderArrives) {
  auto& f = hub.add("files/cut.gguf", shared_bytes(kQ8).substr(0, 400000));
  f.declared_length = 400000;
  f.stall_after = 300000;
  const std::string error = pull(url_pull(hub.endpoint() + "/files/cut.gguf"));
  EXPECT_NE(error.find("its GGUF header makes the file " + std::to_string(kQ8Size)), std::string::npos) << error;
  EXPECT_NE(error.find("the server declares 400000"), std::string::npos) << error;
  expect_nothing_stored();
}

// A valid model with a megabyte more behind it: without a length, the
// stream is stopped once it runs past the end the header gives; with one,
// as soon as the header is read. (The old pull stored both: the tensors
// are all inside the file.)
TEST_F(PullLimits, AStreamLongerThanItsHeaderSaysIsRefused) {
  const std::string padded = shared_bytes(kQ8) + std::string(1 << 20, 'x');
  hub.add("files/chunked.gguf", padded).chunked = true;
  hub.add("files/sized.gguf", padded);
  const BinaryResult chunked = run_binary({"pull", hub.endpoint() + "/files/chunked.gguf"});
  EXPECT_EQ(chunked.exit_code, 1) << chunked.err;
  EXPECT_NE(chunked.err.find("runs past the"), std::string::npos) << chunked.err;
  EXPECT_NE(chunked.err.find("bytes its GGUF header gives"), std::string::npos) << chunked.err;
  const BinaryResult sized = run_binary({"pull", hub.endpoint() + "/files/sized.gguf"});
  EXPECT_EQ(sized.exit_code, 1) << sized.err;
  EXPECT_NE(sized.err.find("but the server declares " + std::to_string(padded.size())), std::string::npos) << sized.err;
  expect_nothing_stored();
}

// The caller's cap: a size from a Hugging Face listing is judged before any
// download request; a plain URL's from its response's header.
TEST_F(PullLimits, ACapRefusesALargerFileBeforeItsBytes) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8));
  hub.add_file("files/tiny.gguf", m40::test::shared_model(kQ8));
  auto options = url_pull("hf.co/test/tinystories:Q8_0");
  options.max_size = m40::store::SizeCap{100000, "the test's cap of 100 KB"};
  std::string error = pull(options);
  EXPECT_NE(error.find("more than the test's cap of 100 KB"), std::string::npos) << error;
  EXPECT_TRUE(hub.requests_for(std::string("/test/tinystories/resolve/main/") + kQ8).empty());
  options.ref = hub.endpoint() + "/files/tiny.gguf";
  error = pull(options);
  EXPECT_NE(error.find("as the server declares"), std::string::npos) << error;
  EXPECT_NE(error.find("more than the test's cap of 100 KB"), std::string::npos) << error;
  expect_nothing_stored();
  options.max_size = m40::store::SizeCap{kQ8Size, "exactly the file"};
  EXPECT_EQ(pull(options), "");
}

// libcurl follows only http and https, for redirects too.
TEST_F(PullLimits, RedirectsToOtherSchemesAreNotFollowed) {
  hub.add_redirect("file.gguf", "file:///etc/hostname");
  hub.add_redirect("ftp.gguf", "ftp://127.0.0.1:1/model.gguf");
  hub.add_redirect("gopher.gguf", "gopher://127.0.0.1:1/model.gguf");
  hub.add_redirect("dict.gguf", "dict://127.0.0.1:1/model.gguf");
  for (const char* name : {"file.gguf", "ftp.gguf", "gopher.gguf", "dict.gguf"}) {
    const std::string error = pull(url_pull(hub.redirect_url(name)));
    EXPECT_NE(error, "") << name;
    EXPECT_NE(error, "TIMED OUT") << name;
    EXPECT_NE(error.find("not supported"), std::string::npos) << name << ": " << error;
  }
  for (const char* ref : {"file:///etc/hostname", "ftp://127.0.0.1/model.gguf", "gopher://127.0.0.1/x.gguf"}) {
    EXPECT_THROW(m40::store::parse_pull_ref(ref), m40::Error) << ref;
  }
  expect_nothing_stored();
}

// The address check sees every connection: here the first hub counts as
// public and the second (where a redirect points) as private, so the
// redirect is refused and the second hub never hears of it.
TEST_F(PullLimits, EveryConnectionIsCheckedRedirectsIncluded) {
  m40::test::FakeHub other;
  other.add_file("files/tiny.gguf", m40::test::shared_model(kQ8));
  const int other_port = std::stoi(other.endpoint().substr(other.endpoint().rfind(':') + 1));
  hub.add_redirect("tiny.gguf", "http://localhost:" + std::to_string(other_port) + "/files/tiny.gguf");
  auto options = url_pull(hub.redirect_url("tiny.gguf"));
  options.address_allowed = [other_port](const sockaddr& a) {
    const uint16_t port = a.sa_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port)
                                                 : ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return port != other_port;
  };
  const std::string error = pull(options);
  EXPECT_NE(error.find("refusing to connect to localhost:" + std::to_string(other_port)), std::string::npos) << error;
  EXPECT_NE(error.find("not a public internet address"), std::string::npos) << error;
  EXPECT_EQ(hub.requests_for("/go/tiny.gguf").size(), 1u);
  EXPECT_TRUE(other.requests().empty());
  expect_nothing_stored();
  // The same pull with every address allowed goes through.
  options.address_allowed = nullptr;
  EXPECT_EQ(pull(options), "");
  EXPECT_EQ(other.requests_for("/files/tiny.gguf").size(), 1u);
}

// The listing requests (Hugging Face, Ollama) are checked as the download is.
TEST_F(PullLimits, ListingsAndManifestsAreCheckedToo) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8));
  auto options = url_pull("hf.co/test/tinystories:Q8_0");
  options.address_allowed = [](const sockaddr& a) { return m40::store::is_public_address(a); };
  std::string error = pull(options);
  EXPECT_NE(error.find("refusing to connect to 127.0.0.1:"), std::string::npos) << error;
  ::setenv("M40_LLM_OLLAMA_REGISTRY", hub.endpoint().c_str(), 1);
  options.ref = "tinystories:q8";
  error = pull(options);
  ::unsetenv("M40_LLM_OLLAMA_REGISTRY");
  EXPECT_NE(error.find("refusing to connect to 127.0.0.1:"), std::string::npos) << error;
  EXPECT_TRUE(hub.requests().empty());
  expect_nothing_stored();
}

}  // namespace

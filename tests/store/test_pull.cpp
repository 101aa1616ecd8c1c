// `m40-llm pull`, `list` and `rm` as users run them, against a fake Hugging
// Face server on 127.0.0.1: quantization choice, resume after a dropped
// connection, checksums, the no-op re-pull, one-line errors that leave
// nothing behind, and `rm` of what an unfinished pull left. The Ollama
// library's names are in test_ollama.cpp.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "background_pull.h"
#include "binary_runner.h"
#include "fake_hub.h"
#include "store_test_home.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using m40::test::BackgroundPull;
using m40::test::BinaryResult;
using m40::test::interrupt_pull_at;
using m40::test::run_binary;
using m40::test::wait_for_size;

const char* kQ8 = "TinyStories-656K-Q8_0.gguf";
const char* kQ2 = "TinyStories-656K-Q2_K.gguf";
const char* kQ8Sha = "c773a9eb8883751131f30e0c1965c56b1102a4972fdac6a6f71fe156ba6d8cb7";

std::string shared_bytes(const char* model) { return m40::test::read_text_file(m40::test::shared_model(model)); }

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

std::string last_line(const std::string& s) {
  const size_t end = s.empty() || s.back() != '\n' ? s.size() : s.size() - 1;
  const size_t start = s.rfind('\n', end == 0 ? 0 : end - 1);
  return s.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1));
}

class Pull : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("M40_LLM_HF_ENDPOINT", hub.endpoint().c_str(), 1);
    ::unsetenv("HF_TOKEN");
    hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8));
    hub.add_file(std::string("test/tinystories/") + kQ2, m40::test::shared_model(kQ2));
  }
  void TearDown() override { ::unsetenv("M40_LLM_HF_ENDPOINT"); }

  fs::path model_dir(const std::string& name, const std::string& tag) const { return home.path() / "models" / name / tag; }
  std::string stored(const std::string& name, const std::string& tag) const {
    return m40::test::read_text_file(model_dir(name, tag) / "model.gguf");
  }
  // Nothing of a model: no file, no partial, no manifest, no folder.
  void expect_nothing_stored() const {
    EXPECT_FALSE(fs::exists(home.path() / "models") && !fs::is_empty(home.path() / "models"))
        << "left in the store: " << fs::recursive_directory_iterator(home.path() / "models")->path();
    const BinaryResult list = run_binary({"list"});
    EXPECT_EQ(list.exit_code, 0);
    EXPECT_EQ(count_lines(list.out), 1) << list.out;  // the header only
  }

  m40::test::TempStoreHome home;
  m40::test::FakeHub hub;
};

TEST_F(Pull, AHuggingFaceQuantizationIsDownloadedVerifiedAndListed) {
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hf.co/test/tinystories:q8_0\n");
  EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;  // plain progress lines off a terminal
  EXPECT_NE(r.err.find("matches the source"), std::string::npos) << r.err;
  EXPECT_EQ(stored("hf.co/test/tinystories", "q8_0"), shared_bytes(kQ8));
  EXPECT_FALSE(fs::exists(model_dir("hf.co/test/tinystories", "q8_0") / "model.gguf.partial"));

  const auto manifest = nlohmann::json::parse(
      m40::test::read_text_file(model_dir("hf.co/test/tinystories", "q8_0") / "manifest.json"));
  EXPECT_EQ(manifest["name"], "hf.co/test/tinystories");
  EXPECT_EQ(manifest["tag"], "q8_0");
  EXPECT_EQ(manifest["sha256"], kQ8Sha);
  EXPECT_EQ(manifest["size"], 749728);
  EXPECT_EQ(manifest["quant"], "Q8_0");
  EXPECT_EQ(manifest["source"], hub.endpoint() + "/test/tinystories/resolve/main/" + kQ8);
  EXPECT_TRUE(manifest.contains("pulled_at"));

  const BinaryResult list = run_binary({"list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out.rfind("NAME", 0), 0u) << list.out;
  for (const char* column : {"ID", "SIZE", "QUANT", "MODIFIED"}) EXPECT_NE(list.out.find(column), std::string::npos);
  EXPECT_NE(list.out.find("hf.co/test/tinystories:q8_0"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("c773a9eb8883 "), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("750 KB"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("Q8_0"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find(" ago"), std::string::npos) << list.out;  // "less than a second ago", "2 seconds ago"
}

TEST_F(Pull, TheDefaultQuantizationIsQ4_K_M) {
  hub.add_file("test/tinystories/tinystories-Q4_K_M.gguf", m40::test::shared_model(kQ2));
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hf.co/test/tinystories:latest\n");
  EXPECT_EQ(hub.requests_for("/test/tinystories/resolve/main/tinystories-Q4_K_M.gguf").size(), 1u);
}

// Hugging Face lists a large repository in pages; a file on the last page
// is found only by following each page's Link: rel="next".
TEST_F(Pull, AListingInPagesIsFollowedToTheLastPage) {
  hub.add("test/tinystories/README.md", "# TinyStories\n");
  hub.add("test/tinystories/config.json", "{}");
  hub.add_file("test/tinystories/zz/tinystories-Q5_K_M.gguf", m40::test::shared_model(kQ2));
  hub.set_page_size(2);  // five files: three pages
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q5_K_M"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hf.co/test/tinystories:Q5_K_M\n");
  EXPECT_EQ(hub.requests_for("/api/models/test/tinystories/tree/main").size(), 3u);
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q5_K_M"), shared_bytes(kQ2));

  // A quantization that is on no page lists what every page holds.
  const BinaryResult missing = run_binary({"pull", "hf.co/test/tinystories:Q6_K"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("it has: Q2_K, Q5_K_M, Q8_0"), std::string::npos) << missing.err;
}

TEST_F(Pull, AFileOfARepositoryByPath) {
  const BinaryResult r = run_binary({"pull", std::string("test/tinystories/") + kQ2});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hf.co/test/tinystories:Q2_K\n");
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q2_K"), shared_bytes(kQ2));
}

TEST_F(Pull, PullingTheSameModelAgainIsANoOp) {
  ASSERT_EQ(run_binary({"pull", "hf.co/test/tinystories:Q8_0", "--name", "tiny:q8"}).exit_code, 0);
  const auto pulled_at = m40::test::read_text_file(model_dir("tiny", "q8") / "manifest.json");
  const BinaryResult again = run_binary({"pull", "hf.co/test/tinystories:Q8_0", "--name", "tiny:q8"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("tiny:q8 is up to date"), std::string::npos) << again.err;
  // Only the listing was asked for the second time, not the file.
  EXPECT_EQ(hub.requests_for(std::string("/test/tinystories/resolve/main/") + kQ8).size(), 1u);
  EXPECT_EQ(m40::test::read_text_file(model_dir("tiny", "q8") / "manifest.json"), pulled_at);
}

TEST_F(Pull, ADroppedConnectionResumesWithRangeAndTheFileIsIdentical) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8)).drop_first = true;
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("connection lost at 374864 bytes"), std::string::npos) << r.err;
  const auto requests = hub.requests_for(std::string("/test/tinystories/resolve/main/") + kQ8);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].range, "");
  EXPECT_EQ(requests[1].range, "bytes=374864-");
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q8_0"), shared_bytes(kQ8));
}

TEST_F(Pull, APartialFileLeftByAnEarlierPullIsResumed) {
  const std::string bytes = shared_bytes(kQ8);
  const fs::path dir = model_dir("hf.co/test/tinystories", "Q8_0");
  const std::string url = hub.endpoint() + "/test/tinystories/resolve/main/" + kQ8;
  const std::string etag = hub.add(std::string("test/tinystories/") + kQ8, bytes).etag;
  fs::create_directories(dir);
  std::ofstream(dir / "model.gguf.partial", std::ios::binary) << bytes.substr(0, 100000);
  std::ofstream(dir / "model.gguf.partial.json")
      << nlohmann::json{{"url", url}, {"etag", etag}, {"size", bytes.size()}}.dump();
  EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);  // a partial file is not a model

  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed a partial download at 100000 bytes"), std::string::npos) << r.err;
  const auto requests = hub.requests_for(std::string("/test/tinystories/resolve/main/") + kQ8);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].range, "bytes=100000-");
  EXPECT_EQ(requests[0].if_range, etag);
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q8_0"), bytes);
  EXPECT_FALSE(fs::exists(dir / "model.gguf.partial.json"));
}

// Bytes with no record of where they came from may be another file's: the
// download starts over rather than append to them.
TEST_F(Pull, APartialFileWithoutARecordIsStartedOver) {
  const fs::path dir = model_dir("tiny", "latest");
  fs::create_directories(dir);
  std::ofstream(dir / "model.gguf.partial", std::ios::binary) << shared_bytes(kQ2).substr(0, 100000);
  hub.add_file("files/q8.gguf", m40::test::shared_model(kQ8));
  const BinaryResult r = run_binary({"pull", hub.endpoint() + "/files/q8.gguf", "--name", "tiny"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto requests = hub.requests_for("/files/q8.gguf");
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].range, "");
  EXPECT_EQ(stored("tiny", "latest"), shared_bytes(kQ8));
}

// A pull of URL A under a name, interrupted, then a pull of URL B under the
// same name: B's bytes must not be appended to A's.
TEST_F(Pull, AResumeAfterTheSourceUrlChangedStartsFromZero) {
  hub.add_file("files/a.gguf", m40::test::shared_model(kQ2)).stall_at_half = true;
  hub.add_file("files/b.gguf", m40::test::shared_model(kQ8));
  const fs::path partial = model_dir("tiny", "latest") / "model.gguf.partial";
  interrupt_pull_at({"pull", hub.endpoint() + "/files/a.gguf", "--name", "tiny"}, partial, 553120 / 2);
  hub.release_stalls();

  const BinaryResult r = run_binary({"pull", hub.endpoint() + "/files/b.gguf", "--name", "tiny"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("resumed a partial download"), std::string::npos) << r.err;
  const auto requests = hub.requests_for("/files/b.gguf");
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].range, "");
  EXPECT_EQ(stored("tiny", "latest"), shared_bytes(kQ8));
  // Nothing was checked against a known hash, so nothing says "verified".
  EXPECT_EQ(r.err.find("verified"), std::string::npos) << r.err;
}

// The same URL, but the server's file was replaced between the two pulls
// (another ETag): the If-Range resume gets the whole new file.
TEST_F(Pull, AResumeAfterTheServersFileChangedStartsFromZero) {
  hub.add_file("files/m.gguf", m40::test::shared_model(kQ2)).stall_at_half = true;
  const fs::path partial = model_dir("m", "latest") / "model.gguf.partial";
  interrupt_pull_at({"pull", hub.endpoint() + "/files/m.gguf"}, partial, 553120 / 2);
  hub.release_stalls();
  const std::string new_etag = hub.add_file("files/m.gguf", m40::test::shared_model(kQ8)).etag;

  const BinaryResult r = run_binary({"pull", hub.endpoint() + "/files/m.gguf"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto requests = hub.requests_for("/files/m.gguf");
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range, "bytes=276560-");
  EXPECT_FALSE(requests[1].if_range.empty());
  EXPECT_NE(requests[1].if_range, new_etag);
  EXPECT_NE(r.err.find("starting the download over"), std::string::npos) << r.err;
  EXPECT_EQ(stored("m", "latest"), shared_bytes(kQ8));
}

// The ordinary case still resumes: same URL, same file.
TEST_F(Pull, AnInterruptedPlainUrlDownloadResumesWithIfRange) {
  auto& served = hub.add_file("files/r.gguf", m40::test::shared_model(kQ8));
  served.stall_at_half = true;
  const std::string etag = served.etag;
  const fs::path partial = model_dir("r", "latest") / "model.gguf.partial";
  interrupt_pull_at({"pull", hub.endpoint() + "/files/r.gguf"}, partial, 374864);
  EXPECT_TRUE(fs::exists(model_dir("r", "latest") / "model.gguf.partial.json"));
  hub.release_stalls();

  const BinaryResult r = run_binary({"pull", hub.endpoint() + "/files/r.gguf"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed a partial download at 374864 bytes"), std::string::npos) << r.err;
  const auto requests = hub.requests_for("/files/r.gguf");
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range, "bytes=374864-");
  EXPECT_EQ(requests[1].if_range, etag);
  EXPECT_EQ(stored("r", "latest"), shared_bytes(kQ8));
  EXPECT_FALSE(fs::exists(model_dir("r", "latest") / "model.gguf.partial.json"));
}

TEST_F(Pull, ACorruptDownloadIsRefusedAndDeleted) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8)).corrupt = true;
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: download of "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is corrupt: sha256"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::string("does not match the expected ") + kQ8Sha), std::string::npos) << r.err;
  expect_nothing_stored();
}

TEST_F(Pull, AMissingRepositoryOrFileIsOneLine) {
  BinaryResult r = run_binary({"pull", "hf.co/test/missing:Q8_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: repository test/missing not found on " + hub.endpoint() + " (HTTP 404)\n");

  r = run_binary({"pull", "hf.co/test/tinystories:Q5_K_M"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: no Q5_K_M GGUF file in hf.co/test/tinystories; it has: Q2_K, Q8_0\n");

  r = run_binary({"pull", hub.endpoint() + "/files/missing.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not found (HTTP 404): " + hub.endpoint() + "/files/missing.gguf"), std::string::npos) << r.err;
  EXPECT_EQ(count_lines(r.err), 2) << r.err;  // "pulling ..." and the error
  expect_nothing_stored();
}

TEST_F(Pull, ANetworkThatIsDownIsOneLine) {
  // A port nobody listens on: bind one, then close it.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(s);
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  ::setenv("M40_LLM_HF_ENDPOINT", endpoint.c_str(), 1);
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: cannot reach 127.0.0.1:", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("(is the network up?)"), std::string::npos) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  expect_nothing_stored();
}

TEST_F(Pull, APlainUrlFollowsRedirectsAndChecksTheLinkedEtag) {
  hub.add_file("files/good.gguf", m40::test::shared_model(kQ8)).linked_etag = kQ8Sha;
  BinaryResult r = run_binary({"pull", hub.endpoint() + "/redirect/good.gguf"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "good:latest\n");
  EXPECT_NE(r.err.find("matches the source"), std::string::npos) << r.err;
  EXPECT_EQ(stored("good", "latest"), shared_bytes(kQ8));

  hub.add_file("files/bad.gguf", m40::test::shared_model(kQ2)).linked_etag = kQ8Sha;
  r = run_binary({"pull", hub.endpoint() + "/files/bad.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is corrupt"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(home.path() / "models/bad"));
}

TEST_F(Pull, ADownloadThatIsNotGgufIsRefused) {
  hub.add("files/page.gguf", "<html>Sign in to continue</html>\n");
  const BinaryResult r = run_binary({"pull", hub.endpoint() + "/files/page.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is not a valid GGUF file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing was stored"), std::string::npos) << r.err;
  expect_nothing_stored();
}

TEST_F(Pull, ALocalFileIsCopiedIntoTheStore) {
  const BinaryResult r = run_binary({"pull", m40::test::shared_model(kQ8).string(), "--name", "tinystories:q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(stored("tinystories", "q8_0"), shared_bytes(kQ8));
  const BinaryResult again = run_binary({"pull", m40::test::shared_model(kQ8).string(), "--name", "tinystories:q8_0"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("is up to date"), std::string::npos) << again.err;
  EXPECT_TRUE(hub.requests().empty());
}

TEST_F(Pull, RmRemovesAModelAndSaysWhenThereIsNone) {
  ASSERT_EQ(run_binary({"pull", "hf.co/test/tinystories:Q2_K"}).exit_code, 0);
  BinaryResult r = run_binary({"rm", "hf.co/test/tinystories:Q2_K"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "deleted 'hf.co/test/tinystories:Q2_K'\n");
  expect_nothing_stored();
  r = run_binary({"rm", "hf.co/test/tinystories:Q2_K"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: model 'hf.co/test/tinystories:Q2_K' not found\n");
}

// A pull that never finished leaves only its partial file and the record of
// it, no manifest: `rm` removes those too (it used to say there was no such
// model, and the bytes stayed until a pull of the same name).
TEST_F(Pull, RmRemovesAnUnfinishedDownload) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8)).stall_at_half = true;
  const fs::path dir = model_dir("hf.co/test/tinystories", "Q8_0");
  interrupt_pull_at({"pull", "hf.co/test/tinystories:Q8_0"}, dir / "model.gguf.partial", 374864);
  ASSERT_TRUE(fs::exists(dir / "model.gguf.partial.json"));
  ASSERT_FALSE(fs::exists(dir / "manifest.json"));

  const BinaryResult r = run_binary({"rm", "hf.co/test/tinystories:Q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "deleted 'hf.co/test/tinystories:Q8_0' (an unfinished download)\n");
  expect_nothing_stored();
  hub.release_stalls();
}

// While a pull of the name is writing, `rm` leaves its files alone and says
// why; the pull then finishes with its own file.
TEST_F(Pull, RmIsRefusedWhileAPullOfTheNameIsRunning) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8)).stall_at_half = true;
  const fs::path partial = model_dir("hf.co/test/tinystories", "Q8_0") / "model.gguf.partial";
  BackgroundPull pull({"pull", "hf.co/test/tinystories:Q8_0"});
  ASSERT_TRUE(wait_for_size(partial, 374864)) << "the pull never got halfway";

  const BinaryResult rm = run_binary({"rm", "hf.co/test/tinystories:Q8_0"});
  EXPECT_EQ(rm.exit_code, 1);
  EXPECT_EQ(rm.err, "error: cannot remove 'hf.co/test/tinystories:Q8_0': a pull of it is running (it is writing " +
                        partial.string() + "); wait for it to finish, or stop it, then remove it\n");
  EXPECT_TRUE(fs::exists(partial.string() + ".json"));
  std::error_code ec;
  EXPECT_EQ(fs::file_size(partial, ec), 374864u) << ec.message();

  hub.release_stalls();
  const BinaryResult r = pull.wait();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q8_0"), shared_bytes(kQ8));
  const BinaryResult again = run_binary({"rm", "hf.co/test/tinystories:Q8_0"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "deleted 'hf.co/test/tinystories:Q8_0'\n");
  expect_nothing_stored();
}

TEST_F(Pull, ADiskThatRefusesWritesLeavesNothingBehind) {
  // A file size limit stands in for a full disk: the spawned binary inherits
  // it, and with SIGXFSZ ignored its write fails (EFBIG) halfway through.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit limited = old;
  limited.rlim_cur = 300000;
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: cannot write "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("File too large; nothing was stored"), std::string::npos) << r.err;
  expect_nothing_stored();
}

// The manifest cannot be written (here: its temporary name is taken by a
// folder; a full disk fails the same way): the downloaded file goes too.
TEST_F(Pull, AManifestThatCannotBeWrittenLeavesNothingBehind) {
  fs::create_directories(model_dir("hf.co/test/tinystories", "Q8_0") / "manifest.json.tmp");
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(last_line(r.err).rfind("error: cannot write ", 0), 0u) << r.err;
  EXPECT_NE(last_line(r.err).find("manifest.json.tmp"), std::string::npos) << r.err;
  EXPECT_NE(last_line(r.err).find("; nothing was stored"), std::string::npos) << r.err;
  expect_nothing_stored();
}

// A pull killed outright (SIGKILL, a power cut) leaves only its partial
// file: nothing is listed, and the next pull resumes after the bytes kept.
TEST_F(Pull, AKilledPullLeavesNoModelAndTheNextPullResumes) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8)).stall_at_half = true;
  const fs::path partial = model_dir("hf.co/test/tinystories", "Q8_0") / "model.gguf.partial";
  BackgroundPull pull({"pull", "hf.co/test/tinystories:Q8_0"});
  ASSERT_TRUE(wait_for_size(partial, 374864)) << "the pull never got halfway";
  pull.signal(SIGKILL);
  EXPECT_EQ(pull.wait().exit_code, 128 + SIGKILL);

  EXPECT_FALSE(fs::exists(model_dir("hf.co/test/tinystories", "Q8_0") / "model.gguf"));
  EXPECT_FALSE(fs::exists(model_dir("hf.co/test/tinystories", "Q8_0") / "manifest.json"));
  const BinaryResult list = run_binary({"list"});
  EXPECT_EQ(count_lines(list.out), 1) << list.out;
  EXPECT_EQ(run_binary({"show", "hf.co/test/tinystories:Q8_0"}).exit_code, 1);

  hub.release_stalls();
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed a partial download at 374864 bytes"), std::string::npos) << r.err;
  const auto requests = hub.requests_for(std::string("/test/tinystories/resolve/main/") + kQ8);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range, "bytes=374864-");
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q8_0"), shared_bytes(kQ8));
  EXPECT_FALSE(fs::exists(partial));
}

// A second pull of a model that is being pulled says so and leaves the
// first pull's (still empty) partial file and folder alone.
TEST_F(Pull, ASecondPullOfTheSameModelLeavesTheFirstOneAlone) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8)).stall_at_start = true;
  const fs::path partial = model_dir("hf.co/test/tinystories", "Q8_0") / "model.gguf.partial";
  const std::string file_path = std::string("/test/tinystories/resolve/main/") + kQ8;
  BackgroundPull first({"pull", "hf.co/test/tinystories:Q8_0"});
  for (int i = 0; i < 6000 && hub.requests_for(file_path).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(hub.requests_for(file_path).size(), 1u) << "the first pull never asked for the file";
  ASSERT_TRUE(wait_for_size(partial, 0));

  const BinaryResult second = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("another pull is already writing " + partial.string()), std::string::npos) << second.err;
  EXPECT_TRUE(fs::exists(partial));

  hub.release_stalls();
  const BinaryResult r = first.wait();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q8_0"), shared_bytes(kQ8));
}

// A local-file pull of a name that a download is writing: both take the
// partial file's lock, so the copy is refused and does not truncate the
// download's bytes, and the download then finishes with its own file.
TEST_F(Pull, ALocalFilePullLeavesADownloadOfTheSameNameAlone) {
  hub.add_file("files/q8.gguf", m40::test::shared_model(kQ8)).stall_at_half = true;
  const fs::path partial = model_dir("tiny", "latest") / "model.gguf.partial";
  BackgroundPull download({"pull", hub.endpoint() + "/files/q8.gguf", "--name", "tiny"});
  ASSERT_TRUE(wait_for_size(partial, 374864)) << "the download never got halfway";

  const BinaryResult copy = run_binary({"pull", m40::test::shared_model(kQ2).string(), "--name", "tiny"});
  EXPECT_EQ(copy.exit_code, 1);
  EXPECT_NE(copy.err.find("another pull is already writing " + partial.string()), std::string::npos) << copy.err;
  std::error_code ec;
  EXPECT_EQ(fs::file_size(partial, ec), 374864u) << ec.message();
  if (!ec) {
    EXPECT_TRUE(m40::test::read_text_file(partial) == shared_bytes(kQ8).substr(0, 374864)) << "the download's bytes changed";
  }
  EXPECT_FALSE(fs::exists(model_dir("tiny", "latest") / "model.gguf"));

  hub.release_stalls();
  const BinaryResult r = download.wait();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(stored("tiny", "latest"), shared_bytes(kQ8));
}

// Ctrl-C (SIGINT) or SIGTERM during a download: one line saying what was
// kept and what to do, exit status 130, no model, and a resume next time
// (even while the server sends nothing, the pull notices the signal).
TEST_F(Pull, AnInterruptedPullSaysWhatWasKeptAndResumes) {
  hub.add_file(std::string("test/tinystories/") + kQ8, m40::test::shared_model(kQ8)).stall_at_half = true;
  const fs::path partial = model_dir("hf.co/test/tinystories", "Q8_0") / "model.gguf.partial";
  const std::string file_path = std::string("/test/tinystories/resolve/main/") + kQ8;
  for (const int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGTERM");
    const size_t requests_before = hub.requests_for(file_path).size();
    BackgroundPull pull({"pull", "hf.co/test/tinystories:Q8_0"});
    // The first pull stalls at half the file; the second resumes there and
    // stalls at once.
    for (int i = 0; i < 6000 && hub.requests_for(file_path).size() == requests_before; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(wait_for_size(partial, 374864)) << "the pull never got halfway";
    pull.signal(sig);
    const BinaryResult r = pull.wait();
    EXPECT_EQ(r.exit_code, 130) << r.err;
    EXPECT_EQ(last_line(r.err),
              "error: interrupted; 374864 bytes kept in " + partial.string() + ", pull again to resume")
        << r.err;
    EXPECT_EQ(fs::file_size(partial), 374864u);
    EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);
  }
  hub.release_stalls();
  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed a partial download at 374864 bytes"), std::string::npos) << r.err;
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q8_0"), shared_bytes(kQ8));
}

// A store the user cannot write to: one line naming the folder and what to
// do, nothing half-made. Root ignores permission bits, so as root the pull
// runs as the unprivileged user 65534.
TEST_F(Pull, AStoreWithoutWritePermissionIsOneLine) {
  const int as_user = ::geteuid() == 0 ? 65534 : -1;
  fs::create_directories(home.path() / "models");
  ASSERT_EQ(::chmod((home.path() / "models").c_str(), 0555), 0);
  if (as_user >= 0) {
    // The unprivileged user must be able to run the binary at all.
    BackgroundPull probe({"--version"}, as_user);
    const BinaryResult v = probe.wait();
    if (v.exit_code != 0) {
      ::chmod((home.path() / "models").c_str(), 0755);
      GTEST_SKIP() << "running as root and cannot run m40-llm as uid 65534 (exit " << v.exit_code
                   << "), so permission bits cannot be tested here";
    }
  }
  BackgroundPull pull({"pull", "hf.co/test/tinystories:Q8_0"}, as_user);
  const BinaryResult r = pull.wait();
  ::chmod((home.path() / "models").c_str(), 0755);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: cannot create a folder in " + (home.path() / "models").string() +
                       ": Permission denied; make the store writable or set M40_LLM_HOME to a folder you can write\n");
  EXPECT_EQ(hub.requests_for(std::string("/test/tinystories/resolve/main/") + kQ8).size(), 0u);
  expect_nothing_stored();
}

TEST_F(Pull, ABadReferenceIsExplained) {
  // Three parts that end in no .gguf: no file, repository or library name.
  const BinaryResult r = run_binary({"pull", "a/b/c"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "error: cannot tell where to pull 'a/b/c' from: give a URL, hf.co/ORG/REPO[:QUANT], "
            "ORG/REPO/FILE.gguf, an Ollama library name (NAME[:TAG], NAMESPACE/NAME[:TAG]) or a GGUF file\n");
}

}  // namespace

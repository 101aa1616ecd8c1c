// `m40-llm pull`, `list` and `rm` as users run them, against a fake Hugging
// Face server on 127.0.0.1: quantization choice, resume after a dropped
// connection, checksums, the no-op re-pull, and one-line errors that leave
// nothing behind.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "binary_runner.h"
#include "fake_hub.h"
#include "store_test_home.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using m40::test::BinaryResult;
using m40::test::run_binary;

const char* kQ8 = "TinyStories-656K-Q8_0.gguf";
const char* kQ2 = "TinyStories-656K-Q2_K.gguf";
const char* kQ8Sha = "c773a9eb8883751131f30e0c1965c56b1102a4972fdac6a6f71fe156ba6d8cb7";

std::string shared_bytes(const char* model) { return m40::test::read_text_file(m40::test::shared_model(model)); }

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

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
  fs::create_directories(model_dir("hf.co/test/tinystories", "Q8_0"));
  std::ofstream(model_dir("hf.co/test/tinystories", "Q8_0") / "model.gguf.partial", std::ios::binary)
      << bytes.substr(0, 100000);
  EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);  // a partial file is not a model

  const BinaryResult r = run_binary({"pull", "hf.co/test/tinystories:Q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed a partial download at 100000 bytes"), std::string::npos) << r.err;
  const auto requests = hub.requests_for(std::string("/test/tinystories/resolve/main/") + kQ8);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].range, "bytes=100000-");
  EXPECT_EQ(stored("hf.co/test/tinystories", "Q8_0"), bytes);
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

TEST_F(Pull, ABadReferenceIsExplained) {
  const BinaryResult r = run_binary({"pull", "tinystories"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "error: cannot tell where to pull 'tinystories' from: give a URL, hf.co/ORG/REPO[:QUANT], "
            "ORG/REPO/FILE.gguf or a GGUF file\n");
}

}  // namespace

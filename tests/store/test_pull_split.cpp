// `m40-llm pull` of a model that a Hugging Face repository holds split into
// parts by llama.cpp's gguf-split (M-Q8_0-00001-of-00003.gguf ...): every
// part is fetched, verified and stored side by side under the names the GGUF
// loader looks for, the stored model loads as the unsplit file does, `list`
// shows it once with its whole size, `rm` removes every part; a part the
// server lacks is named, and an interrupted pull resumes where it stopped
// without fetching the finished parts again.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "background_pull.h"
#include "binary_runner.h"
#include "fake_hub.h"
#include "gguf/file.h"
#include "gguf/split_name.h"
#include "split_gguf.h"
#include "store/pull.h"
#include "store/store.h"
#include "store_test_home.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using m40::test::BinaryResult;
using m40::test::interrupt_pull_at;
using m40::test::run_binary;
using m40::gguf::split_file_name;

const char* kQ8 = "TinyStories-656K-Q8_0.gguf";
const char* kQ2 = "TinyStories-656K-Q2_K.gguf";
constexpr int kParts = 3;
// Where the parts lie in the repository, as many repositories keep them: a
// folder per quantization.
const std::string kPrefix = "Q8_0/TinyStories-656K-Q8_0";
const std::string kRef = "hf.co/test/split:Q8_0";

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

class PullSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("M40_LLM_HF_ENDPOINT", hub.endpoint().c_str(), 1);
    ::unsetenv("HF_TOKEN");
    const fs::path scratch = home.path() / "split-source";
    fs::create_directories(scratch);
    parts = m40::test::write_split(m40::test::shared_model(kQ8), scratch / "part", kParts);
    fs::remove_all(scratch);
    hub.add("test/split/README.md", "# split\n");
    hub.add_file(std::string("test/split/") + kQ2, m40::test::shared_model(kQ2));
    for (int i = 0; i < kParts; ++i) hub.add(repo_path(i), parts[i]);
  }
  void TearDown() override { ::unsetenv("M40_LLM_HF_ENDPOINT"); }

  static std::string repo_path(int index) { return "test/split/" + split_file_name(kPrefix, index + 1, kParts); }
  static std::string url_path(int index) { return "/test/split/resolve/main/" + split_file_name(kPrefix, index + 1, kParts); }
  fs::path model_dir() const { return home.path() / "models/hf.co/test/split/Q8_0"; }
  fs::path stored_part(int index) const { return model_dir() / split_file_name("model", index + 1, kParts); }
  uint64_t total_size() const {
    uint64_t n = 0;
    for (const auto& p : parts) n += p.size();
    return n;
  }
  void expect_nothing_stored() const {
    EXPECT_FALSE(fs::exists(home.path() / "models") && !fs::is_empty(home.path() / "models"))
        << "left in the store: " << fs::recursive_directory_iterator(home.path() / "models")->path();
    EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);  // the header only
  }

  m40::test::TempStoreHome home;
  m40::test::FakeHub hub;
  std::vector<std::string> parts;  // the bytes of each part, in order
};

TEST_F(PullSplit, EveryPartIsFetchedVerifiedAndStoredSideBySide) {
  const BinaryResult r = run_binary({"pull", kRef});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, kRef + "\n");
  for (int i = 0; i < kParts; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(hub.requests_for(url_path(i)).size(), 1u);
    EXPECT_TRUE(m40::test::read_text_file(stored_part(i)) == parts[i]) << "part " << i + 1 << " differs";
    EXPECT_FALSE(fs::exists(stored_part(i).string() + ".partial"));
    EXPECT_FALSE(fs::exists(stored_part(i).string() + ".partial.json"));
    // The progress names the part it is fetching.
    const std::string part = "part " + std::to_string(i + 1) + " of 3";
    EXPECT_NE(r.err.find("pulling " + kRef + " " + part + " from " + hub.endpoint() + url_path(i)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(kRef + " " + part + "  100%"), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("verified the sha256 of each of the 3 parts"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(model_dir() / "model.gguf"));
  // Nothing but the parts and the manifest (no names left from the check).
  int files = 0;
  for (const auto& entry : fs::directory_iterator(model_dir())) files += entry.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, kParts + 1);

  const auto manifest = nlohmann::json::parse(m40::test::read_text_file(model_dir() / "manifest.json"));
  EXPECT_EQ(manifest["size"], total_size());
  EXPECT_EQ(manifest["quant"], "Q8_0");
  EXPECT_EQ(manifest["source"], hub.endpoint() + url_path(0));
  ASSERT_EQ(manifest["parts"].size(), 3u);
  std::vector<std::string> shas;
  for (int i = 0; i < kParts; ++i) {
    EXPECT_EQ(manifest["parts"][i]["file"], split_file_name("model", i + 1, kParts));
    EXPECT_EQ(manifest["parts"][i]["size"], parts[i].size());
    EXPECT_EQ(manifest["parts"][i]["sha256"], m40::test::FakeHub::sha256_of(parts[i]));
    shas.push_back(m40::test::FakeHub::sha256_of(parts[i]));
  }
  EXPECT_EQ(manifest["sha256"], m40::store::split_sha256(shas));
}

// A caller that follows the pull (the server's /api/pull status lines)
// hears of the bytes of all parts against their total, never going back.
TEST_F(PullSplit, ProgressCountsTheBytesOfAllParts) {
  m40::store::PullOptions options;
  options.ref = kRef;
  std::FILE* log = std::tmpfile();
  options.log = log;
  std::vector<std::pair<uint64_t, std::optional<uint64_t>>> reports;
  options.on_progress = [&](uint64_t done, std::optional<uint64_t> total) { reports.emplace_back(done, total); };
  const auto result = m40::store::pull_model(m40::store::Store(home.path()), options);
  std::fclose(log);
  EXPECT_EQ(result.manifest.size, total_size());
  ASSERT_FALSE(reports.empty());
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].second, std::optional<uint64_t>(total_size())) << i;
    if (i > 0) {
      EXPECT_GE(reports[i].first, reports[i - 1].first) << i;
    }
  }
  EXPECT_EQ(reports.back().first, total_size());
}

// The stored parts load as one model: the unsplit file's metadata and tensors.
TEST_F(PullSplit, TheStoredModelLoadsAsTheUnsplitFile) {
  ASSERT_EQ(run_binary({"pull", kRef}).exit_code, 0);
  const auto found = m40::store::Store(home.path()).find(m40::store::parse_model_name(kRef));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->gguf_path, stored_part(0));
  EXPECT_EQ(found->files(), (std::vector<fs::path>{stored_part(0), stored_part(1), stored_part(2)}));

  const auto split = m40::gguf::File::open(found->gguf_path.string());
  const auto whole = m40::gguf::File::open(m40::test::shared_model(kQ8).string());
  EXPECT_EQ(split.file_count(), 3u);
  for (const auto& [key, value] : whole.metadata().entries()) {
    const auto* got = split.metadata().find(key);
    ASSERT_NE(got, nullptr) << key;
    EXPECT_TRUE(*got == value) << key;
  }
  ASSERT_EQ(split.tensors().size(), whole.tensors().size());
  for (const auto& t : whole.tensors()) {
    const auto& s = split.tensor(t.name);
    EXPECT_EQ(s.type, t.type) << t.name;
    EXPECT_EQ(s.dims, t.dims) << t.name;
    const auto a = split.tensor_data(s);
    const auto b = whole.tensor_data(t);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << t.name;
  }
  // And the commands that load by name find it.
  const BinaryResult show = run_binary({"show", kRef});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_NE(show.out.find("Q8_0"), std::string::npos) << show.out;
}

TEST_F(PullSplit, ListShowsOneModelWithTheSizeOfAllParts) {
  ASSERT_EQ(run_binary({"pull", kRef}).exit_code, 0);
  const BinaryResult list = run_binary({"list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(count_lines(list.out), 2) << list.out;  // the header and one model
  EXPECT_NE(list.out.find(kRef), std::string::npos) << list.out;
  EXPECT_NE(list.out.find(m40::store::human_size(total_size())), std::string::npos) << list.out;
  // Not the first part's size alone.
  ASSERT_NE(m40::store::human_size(total_size()), m40::store::human_size(parts[0].size()));

  // A part gone from the store: the model is not listed (it cannot load).
  fs::remove(stored_part(2));
  EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);
}

TEST_F(PullSplit, RmRemovesEveryPart) {
  ASSERT_EQ(run_binary({"pull", kRef}).exit_code, 0);
  const BinaryResult r = run_binary({"rm", kRef});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "deleted '" + kRef + "'\n");
  for (int i = 0; i < kParts; ++i) EXPECT_FALSE(fs::exists(stored_part(i))) << i;
  expect_nothing_stored();
}

TEST_F(PullSplit, PullingItAgainIsANoOp) {
  ASSERT_EQ(run_binary({"pull", kRef}).exit_code, 0);
  const BinaryResult again = run_binary({"pull", kRef});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find(kRef + " is up to date"), std::string::npos) << again.err;
  for (int i = 0; i < kParts; ++i) EXPECT_EQ(hub.requests_for(url_path(i)).size(), 1u) << i;
}

// The current choice rule: one file wins over the parts of a split one.
TEST_F(PullSplit, ASingleFileOfTheQuantizationIsPreferred) {
  hub.add_file("test/split/zz/TinyStories-656K-Q8_0.gguf", m40::test::shared_model(kQ8));
  const BinaryResult r = run_binary({"pull", kRef});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(hub.requests_for("/test/split/resolve/main/zz/TinyStories-656K-Q8_0.gguf").size(), 1u);
  for (int i = 0; i < kParts; ++i) EXPECT_TRUE(hub.requests_for(url_path(i)).empty()) << i;
  EXPECT_EQ(m40::test::read_text_file(model_dir() / "model.gguf"), m40::test::read_text_file(m40::test::shared_model(kQ8)));
  EXPECT_FALSE(fs::exists(stored_part(0)));
}

// One part's path, the first or a later one, pulls the whole model.
TEST_F(PullSplit, APartsPathPullsEveryPart) {
  const BinaryResult r = run_binary({"pull", repo_path(1)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, kRef + "\n");
  for (int i = 0; i < kParts; ++i) EXPECT_TRUE(m40::test::read_text_file(stored_part(i)) == parts[i]) << i;
}

// A split model stored where a single file was: the old file goes, and the
// other way round.
TEST_F(PullSplit, ReplacingASingleFileModelLeavesOnlyTheNewFiles) {
  ASSERT_EQ(run_binary({"pull", std::string("test/split/") + kQ2, "--name", "m"}).exit_code, 0);
  const fs::path dir = home.path() / "models/m/latest";
  ASSERT_TRUE(fs::exists(dir / "model.gguf"));
  ASSERT_EQ(run_binary({"pull", kRef, "--name", "m"}).exit_code, 0);
  EXPECT_FALSE(fs::exists(dir / "model.gguf"));
  for (int i = 0; i < kParts; ++i) EXPECT_TRUE(fs::exists(dir / split_file_name("model", i + 1, kParts))) << i;
  const BinaryResult list = run_binary({"list"});
  EXPECT_EQ(count_lines(list.out), 2) << list.out;
  EXPECT_NE(list.out.find(m40::store::human_size(total_size())), std::string::npos) << list.out;

  ASSERT_EQ(run_binary({"pull", std::string("test/split/") + kQ2, "--name", "m"}).exit_code, 0);
  EXPECT_TRUE(fs::exists(dir / "model.gguf"));
  for (int i = 0; i < kParts; ++i) EXPECT_FALSE(fs::exists(dir / split_file_name("model", i + 1, kParts))) << i;
}

// A part the listing lacks is named before anything is downloaded.
TEST_F(PullSplit, APartMissingFromTheRepositoryIsNamed) {
  hub.remove(repo_path(1));
  const BinaryResult r = run_binary({"pull", kRef});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: the model TinyStories-656K-Q8_0-00001-of-00003.gguf in hf.co/test/split is split into 3 files, "
                   "but part 2 of 3 (" + split_file_name(kPrefix, 2, kParts) + ") is not there\n");
  EXPECT_TRUE(hub.requests_for(url_path(0)).empty());
  expect_nothing_stored();
}

// A part listed but not served (gone between the listing and its download):
// the error names the part; the parts fetched before it are kept.
TEST_F(PullSplit, APartTheServerDoesNotHaveIsNamed) {
  hub.add(repo_path(2), parts[2]).not_served = true;
  const BinaryResult r = run_binary({"pull", kRef});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: " + kRef + " part 3 of 3 cannot be fetched: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(HTTP 404)"), std::string::npos) << r.err;
  EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);
  EXPECT_FALSE(fs::exists(model_dir() / "manifest.json"));
  EXPECT_FALSE(fs::exists(stored_part(2).string() + ".partial"));  // nothing arrived of it
  EXPECT_TRUE(fs::exists(stored_part(0).string() + ".partial"));
  // `rm` removes what was kept.
  const BinaryResult rm = run_binary({"rm", kRef});
  ASSERT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_EQ(rm.out, "deleted '" + kRef + "' (an unfinished download)\n");
  expect_nothing_stored();
}

// Ctrl-C in the middle of part 2: parts 1 and 2's bytes stay, nothing is
// listed; the next pull fetches neither part 1 again nor part 2's first half.
TEST_F(PullSplit, AnInterruptedPartResumesAndFinishedPartsAreKept) {
  hub.add(repo_path(1), parts[1]).stall_at_half = true;
  const uint64_t half = parts[1].size() / 2;
  const fs::path partial = stored_part(1).string() + ".partial";
  interrupt_pull_at({"pull", kRef}, partial, half);
  EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);
  EXPECT_FALSE(fs::exists(model_dir() / "manifest.json"));
  EXPECT_EQ(fs::file_size(stored_part(0).string() + ".partial"), parts[0].size());
  EXPECT_FALSE(fs::exists(stored_part(2).string() + ".partial"));
  hub.release_stalls();

  const BinaryResult r = run_binary({"pull", kRef});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("part 1 of 3 was downloaded before (" + std::to_string(parts[0].size()) + " bytes)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("resumed a partial download at " + std::to_string(half) + " bytes"), std::string::npos) << r.err;
  EXPECT_EQ(hub.requests_for(url_path(0)).size(), 1u);
  const auto second = hub.requests_for(url_path(1));
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[1].range, "bytes=" + std::to_string(half) + "-");
  for (int i = 0; i < kParts; ++i) EXPECT_TRUE(m40::test::read_text_file(stored_part(i)) == parts[i]) << i;
  EXPECT_EQ(count_lines(run_binary({"list"}).out), 2);
}

// While a split model's pull runs, `rm` and a second pull leave all its
// files alone: the pull holds every part's partial file from its start.
TEST_F(PullSplit, RmAndASecondPullKeepOffARunningPull) {
  hub.add(repo_path(1), parts[1]).stall_at_half = true;
  const fs::path partial = stored_part(1).string() + ".partial";
  m40::test::BackgroundPull pull({"pull", kRef});
  ASSERT_TRUE(m40::test::wait_for_size(partial, parts[1].size() / 2)) << "the pull never got halfway";

  const BinaryResult rm = run_binary({"rm", kRef});
  EXPECT_EQ(rm.exit_code, 1);
  EXPECT_NE(rm.err.find("error: cannot remove '" + kRef + "': a pull of it is running (it is writing " + model_dir().string()),
            std::string::npos)
      << rm.err;
  const BinaryResult second = run_binary({"pull", kRef});
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("another pull is already writing " + stored_part(0).string() + ".partial"), std::string::npos)
      << second.err;
  EXPECT_EQ(fs::file_size(partial), parts[1].size() / 2);
  EXPECT_EQ(fs::file_size(stored_part(0).string() + ".partial"), parts[0].size());

  hub.release_stalls();
  const BinaryResult r = pull.wait();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int i = 0; i < kParts; ++i) EXPECT_TRUE(m40::test::read_text_file(stored_part(i)) == parts[i]) << i;
}

// A corrupt part is deleted and named; the others stay for the next pull.
TEST_F(PullSplit, ACorruptPartIsNamedAndDeleted) {
  hub.add(repo_path(2), parts[2]).corrupt = true;
  const BinaryResult r = run_binary({"pull", kRef});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: download of " + hub.endpoint() + url_path(2) + " (part 3 of 3) is corrupt: sha256"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(stored_part(2).string() + ".partial"));
  EXPECT_EQ(count_lines(run_binary({"list"}).out), 1);
}

// Parts that do not make one model (here part 3 is another copy of part 2)
// are refused after the check the loader would make; nothing stays.
TEST_F(PullSplit, PartsThatAreNotOneModelAreRefused) {
  hub.add(repo_path(2), parts[1]);
  const BinaryResult r = run_binary({"pull", kRef});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: the 3 parts of " + kRef + " from " + hub.endpoint() + url_path(0) +
                       " are not one valid GGUF model ("),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("nothing was stored"), std::string::npos) << r.err;
  expect_nothing_stored();
}

}  // namespace

// The store on disk: install, find, list, remove, and the resolver other
// commands use to turn a name or a path into a GGUF file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "store/model_ref.h"
#include "store/pull.h"
#include "store/sha256.h"
#include "store/store.h"
#include "store_test_home.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using m40::store::ModelName;
using m40::store::Store;

const char* kQ8Sha = "c773a9eb8883751131f30e0c1965c56b1102a4972fdac6a6f71fe156ba6d8cb7";

// Pulls a shared model into the store through the library (a local copy).
m40::store::Manifest pull_local(const Store& store, const std::string& model, const std::string& name) {
  m40::store::PullOptions options;
  options.ref = m40::test::shared_model(model).string();
  options.name = name;
  std::FILE* sink = std::fopen("/dev/null", "w");
  options.log = sink;
  auto result = m40::store::pull_model(store, options);
  std::fclose(sink);
  return result.manifest;
}

TEST(Sha256, KnownDigests) {
  m40::store::Sha256 h;
  EXPECT_EQ(h.hex_digest(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  h.update("abc", 3);
  EXPECT_EQ(h.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(m40::store::sha256_file(m40::test::shared_model("TinyStories-656K-Q8_0.gguf")), kQ8Sha);
}

TEST(Store, HomeComesFromTheEnvironment) {
  m40::test::TempStoreHome home;
  EXPECT_EQ(Store::default_home(), home.path());
  ::unsetenv("M40_LLM_HOME");
  EXPECT_EQ(Store::default_home(), fs::path(std::getenv("HOME")) / ".m40-llm");
}

TEST(Store, ALocalPullIsStoredWithItsManifest) {
  m40::test::TempStoreHome home;
  const Store store(home.path());
  const auto m = pull_local(store, "TinyStories-656K-Q8_0.gguf", "tinystories:q8_0");
  EXPECT_EQ(m.gguf_path, home.path() / "models/tinystories/q8_0/model.gguf");
  EXPECT_EQ(m.sha256, kQ8Sha);
  EXPECT_EQ(m.size, 749728u);
  EXPECT_EQ(m.quant, "Q8_0");
  EXPECT_EQ(m.architecture, "llama");
  EXPECT_TRUE(fs::exists(home.path() / "models/tinystories/q8_0/manifest.json"));
  EXPECT_FALSE(fs::exists(store.partial_path({"tinystories", "q8_0"})));

  const auto found = store.find({"tinystories", "q8_0"});
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->sha256, kQ8Sha);
  EXPECT_EQ(found->source, m40::test::shared_model("TinyStories-656K-Q8_0.gguf").lexically_normal().string());
  EXPECT_FALSE(found->pulled_at.empty());
}

TEST(Store, ListIsSortedAndSkipsPartialDownloads) {
  m40::test::TempStoreHome home;
  const Store store(home.path());
  pull_local(store, "TinyStories-656K-Q8_0.gguf", "zeta");
  pull_local(store, "TinyStories-656K-Q2_K.gguf", "hf.co/Org/Repo:Q2_K");
  // A download in progress: only a partial file, no manifest.
  fs::create_directories(store.model_dir({"pending", "latest"}));
  std::ofstream(store.partial_path({"pending", "latest"})) << "GGUF";

  const auto models = store.list();
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].model_name().str(), "hf.co/Org/Repo:Q2_K");
  EXPECT_EQ(models[0].quant, "Q2_K");
  EXPECT_EQ(models[1].model_name().str(), "zeta:latest");
}

TEST(Store, RemoveDeletesTheModelAndEmptyFolders) {
  m40::test::TempStoreHome home;
  const Store store(home.path());
  pull_local(store, "TinyStories-656K-Q8_0.gguf", "hf.co/Org/Repo:Q8_0");
  store.remove({"hf.co/Org/Repo", "Q8_0"});
  EXPECT_FALSE(store.find({"hf.co/Org/Repo", "Q8_0"}).has_value());
  EXPECT_FALSE(fs::exists(home.path() / "models/hf.co"));
  EXPECT_TRUE(store.list().empty());
  try {
    store.remove({"hf.co/Org/Repo", "Q8_0"});
    FAIL();
  } catch (const m40::Error& e) {
    EXPECT_STREQ(e.what(), "model 'hf.co/Org/Repo:Q8_0' not found");
  }
}

// An Ollama library model's text layers are kept in its manifest and read
// back as they were.
TEST(Store, OllamaTextLayersRoundTripThroughTheManifest) {
  m40::test::TempStoreHome home;
  const Store store(home.path());
  pull_local(store, "TinyStories-656K-Q8_0.gguf", "tiny");
  auto manifest = *store.find({"tiny", "latest"});
  m40::store::OllamaExtras extras;
  extras.template_text = "{{ .Prompt }}";
  extras.params = R"({"stop":["<|im_end|>"]})";
  extras.system = "You are terse.";
  extras.licenses = {"MIT", "Use policy"};
  manifest.ollama = extras;
  const fs::path copy = store.model_dir({"tiny", "q"}) / "copy.gguf";
  fs::create_directories(copy.parent_path());
  fs::copy_file(manifest.gguf_path, copy);
  store.install({"tiny", "q"}, copy, manifest);
  const auto found = store.find({"tiny", "q"});
  ASSERT_TRUE(found.has_value());
  ASSERT_TRUE(found->ollama.has_value());
  EXPECT_EQ(*found->ollama, extras);
  EXPECT_FALSE(store.find({"tiny", "latest"})->ollama.has_value());
}

TEST(Store, AnInvalidGgufNeverBecomesAModel) {
  m40::test::TempStoreHome home;
  const Store store(home.path());
  const fs::path text = home.path() / "notes.gguf";
  std::ofstream(text) << "this is not a model\n";
  m40::store::PullOptions options;
  options.ref = text.string();
  options.log = std::fopen("/dev/null", "w");
  EXPECT_THROW(m40::store::pull_model(store, options), m40::Error);
  std::fclose(options.log);
  EXPECT_TRUE(store.list().empty());
  EXPECT_FALSE(fs::exists(store.models_dir() / "notes"));
}

TEST(ResolveModel, PathsNamesAndMissingModels) {
  m40::test::TempStoreHome home;
  const Store store(home.path());
  const auto file = m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string();
  EXPECT_EQ(m40::store::resolve_model(file), file);

  pull_local(store, "TinyStories-656K-Q8_0.gguf", "tinystories");
  EXPECT_EQ(m40::store::resolve_model("tinystories"), (home.path() / "models/tinystories/latest/model.gguf").string());
  EXPECT_EQ(m40::store::resolve_model("tinystories:latest"), m40::store::resolve_model("tinystories"));

  try {
    m40::store::resolve_model("tinystories:q2_k");
    FAIL();
  } catch (const m40::Error& e) {
    EXPECT_STREQ(e.what(), "model 'tinystories:q2_k' not found: pull it with m40-llm pull tinystories:q2_k");
  }
  EXPECT_THROW(m40::store::resolve_model("/no/such/model.gguf"), m40::Error);
}

// A folder in the current directory named like a stored model does not hide
// it; a folder that is no model's name is still called a folder.
TEST(ResolveModel, AFolderNamedLikeAModelDoesNotHideIt) {
  m40::test::TempStoreHome home;
  const Store store(home.path());
  pull_local(store, "TinyStories-656K-Q8_0.gguf", "tinystories");
  const fs::path cwd = home.path() / "cwd";
  fs::create_directories(cwd / "tinystories");
  fs::create_directories(cwd / "notes");
  const fs::path old_cwd = fs::current_path();
  fs::current_path(cwd);
  std::string resolved, notes_error;
  try {
    resolved = m40::store::resolve_model("tinystories");
  } catch (const m40::Error& e) {
    resolved = e.what();
  }
  try {
    m40::store::resolve_model("notes");
  } catch (const m40::Error& e) {
    notes_error = e.what();
  }
  fs::current_path(old_cwd);
  EXPECT_EQ(resolved, (home.path() / "models/tinystories/latest/model.gguf").string());
  EXPECT_EQ(notes_error, "'notes' is a directory, not a GGUF model file");
}

TEST(Store, HumanSizesAndTimes) {
  using m40::store::human_size;
  using m40::store::relative_time;
  EXPECT_EQ(human_size(512), "512 B");
  EXPECT_EQ(human_size(749728), "750 KB");
  EXPECT_EQ(human_size(4'700'000'000ULL), "4.7 GB");
  // 2026-11-21T06:50:00Z is 1795243800 seconds after the epoch.
  const int64_t t = 1795243800;
  EXPECT_EQ(relative_time("2026-11-21T06:50:00Z", t), "less than a second ago");
  EXPECT_EQ(relative_time("2026-11-21T06:50:00Z", t + 1), "1 second ago");
  EXPECT_EQ(relative_time("2026-11-21T06:50:00Z", t + 5), "5 seconds ago");
  EXPECT_EQ(relative_time("2026-11-21T06:50:00Z", t + 120), "2 minutes ago");
  EXPECT_EQ(relative_time("2026-11-21T06:50:00Z", t + 3600), "1 hour ago");
  EXPECT_EQ(relative_time("2026-11-21T06:50:00Z", t + 3 * 86400), "3 days ago");
  EXPECT_EQ(relative_time("garbage", t), "unknown");
}

}  // namespace

// The Ollama library: names ([NAMESPACE/]MODEL[:TAG]) and registry manifests
// read on their own, then `m40-llm pull NAME` as users run it against a fake
// registry on 127.0.0.1 (manifest, blobs behind a redirect, 404s, digests,
// resume), with `list`, `show`, `run` and `rm` on what it stored; and the
// pull command `run` names for a model that is not in the store.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "background_pull.h"
#include "binary_runner.h"
#include "common/error.h"
#include "fake_hub.h"
#include "store/ollama_registry.h"
#include "store/pull.h"
#include "store_test_home.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using m40::test::BinaryResult;
using m40::test::OllamaLayerBytes;
using m40::test::run_binary;

const char* kQ8 = "TinyStories-656K-Q8_0.gguf";
const char* kQ2 = "TinyStories-656K-Q2_K.gguf";
const char* kQ8Sha = "c773a9eb8883751131f30e0c1965c56b1102a4972fdac6a6f71fe156ba6d8cb7";
const char* kModelLayer = "application/vnd.ollama.image.model";
const char* kTemplateLayer = "application/vnd.ollama.image.template";
const char* kParamsLayer = "application/vnd.ollama.image.params";
const char* kLicenseLayer = "application/vnd.ollama.image.license";
const char* kProjectorLayer = "application/vnd.ollama.image.projector";
// An Ollama template is a Go template: nothing the Jinja engine may read.
const char* kGoTemplate = "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}<|im_start|>user\n{{ .Prompt }}";
const char* kParams = R"({"stop":["<|im_end|>"],"temperature":0.6})";

std::string shared_bytes(const char* model) { return m40::test::read_text_file(m40::test::shared_model(model)); }

TEST(OllamaName, ShortFormsAndStoreNames) {
  using m40::store::parse_ollama_name;
  const auto plain = parse_ollama_name("qwen3:8b");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->repository(), "library/qwen3");
  EXPECT_EQ(plain->tag, "8b");
  EXPECT_EQ(plain->store_name().str(), "qwen3:8b");

  const auto library = parse_ollama_name("library/qwen3");
  ASSERT_TRUE(library.has_value());
  EXPECT_EQ(library->repository(), "library/qwen3");
  EXPECT_EQ(library->store_name().str(), "qwen3:latest");  // as Ollama lists it

  const auto user = parse_ollama_name("someuser/model:tag");
  ASSERT_TRUE(user.has_value());
  EXPECT_EQ(user->repository(), "someuser/model");
  EXPECT_EQ(user->store_name().str(), "someuser/model:tag");

  EXPECT_FALSE(parse_ollama_name("a/b/c").has_value());
  EXPECT_FALSE(parse_ollama_name("two words").has_value());
  EXPECT_FALSE(parse_ollama_name("qwen3:").has_value());
}

TEST(OllamaName, PullReferencesThatAreLibraryNames) {
  using m40::store::parse_pull_ref;
  using m40::store::SourceKind;
  for (const char* ref : {"qwen3:8b", "library/qwen3:8b", "someuser/model:tag", "tinystories", "qwen2.5"}) {
    SCOPED_TRACE(ref);
    EXPECT_EQ(parse_pull_ref(ref).kind, SourceKind::OllamaLibrary);
  }
  EXPECT_EQ(parse_pull_ref("library/qwen3:8b").default_name.str(), "qwen3:8b");
  // The other forms keep their meaning.
  EXPECT_EQ(parse_pull_ref("hf.co/Org/Repo:Q8_0").kind, SourceKind::HuggingFaceRepo);
  EXPECT_EQ(parse_pull_ref("Org/Repo/model.Q8_0.gguf").kind, SourceKind::HuggingFaceFile);
  EXPECT_THROW(parse_pull_ref("missing.gguf"), m40::Error);
  EXPECT_THROW(parse_pull_ref("./qwen3"), m40::Error);
}

TEST(OllamaName, TheRegistryComesFromTheEnvironment) {
  ::unsetenv("M40_LLM_OLLAMA_REGISTRY");
  EXPECT_EQ(m40::store::ollama_registry(), "https://registry.ollama.ai");
  ::setenv("M40_LLM_OLLAMA_REGISTRY", "http://127.0.0.1:9/", 1);
  EXPECT_EQ(m40::store::ollama_registry(), "http://127.0.0.1:9");
  ::unsetenv("M40_LLM_OLLAMA_REGISTRY");
}

std::string layer_json(const std::string& media_type, const std::string& sha, uint64_t size) {
  return R"({"mediaType":")" + media_type + R"(","digest":"sha256:)" + sha + R"(","size":)" + std::to_string(size) + "}";
}

TEST(OllamaManifest, TheModelLayerTextLayersAndTheRest) {
  const std::string a(64, 'a'), b(64, 'b'), c(64, 'c'), d(64, 'd');
  const auto m = m40::store::parse_ollama_manifest(
      R"({"schemaVersion":2,"layers":[)" + layer_json(kModelLayer, a, 749728) + "," + layer_json(kTemplateLayer, b, 90) +
          "," + layer_json(kProjectorLayer, c, 1000) + "," + layer_json(kLicenseLayer, d, 12) + "]}",
      "x:latest");
  EXPECT_EQ(m.model.sha256, a);
  EXPECT_EQ(m.model.size, 749728u);
  ASSERT_EQ(m.texts.size(), 2u);
  EXPECT_EQ(m.texts[0].media_type, kTemplateLayer);
  EXPECT_EQ(m.texts[1].sha256, d);
  EXPECT_EQ(m.ignored, std::vector<std::string>{kProjectorLayer});
}

TEST(OllamaManifest, WhatCannotBePulledIsRefused) {
  const auto refusal = [](const std::string& json) -> std::string {
    try {
      m40::store::parse_ollama_manifest(json, "x:latest");
    } catch (const m40::Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const std::string a(64, 'a');
  EXPECT_EQ(refusal(R"({"layers":[)" + layer_json(kTemplateLayer, a, 5) + "]}"),
            "the Ollama manifest of x:latest has no model layer (application/vnd.ollama.image.model), so there is no "
            "GGUF file to pull");
  EXPECT_EQ(refusal(R"({"layers":[)" + layer_json(kModelLayer, a, 5) + "," +
                    layer_json("application/vnd.ollama.image.adapter", a, 5) + "]}"),
            "x:latest is a model with a LoRA adapter layer, which m40-llm cannot apply");
  EXPECT_EQ(refusal(R"({"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"md5:00","size":5}]})"),
            "the Ollama manifest of x:latest has a layer digest that is not sha256: 'md5:00'");
  EXPECT_EQ(refusal("{not json").rfind("the Ollama manifest of x:latest is not valid JSON", 0), 0u);
  EXPECT_EQ(refusal(R"({"errors":[]})"), "the Ollama manifest of x:latest lists no layers");
}

class OllamaPull : public ::testing::Test {
 protected:
  void SetUp() override {
    // Everything goes to the fake: no test may reach the real registry.
    ::setenv("M40_LLM_OLLAMA_REGISTRY", hub.endpoint().c_str(), 1);
    ::setenv("M40_LLM_HF_ENDPOINT", hub.endpoint().c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("M40_LLM_OLLAMA_REGISTRY");
    ::unsetenv("M40_LLM_HF_ENDPOINT");
  }

  // The tiny Q8_0 model as library/tinystories:TAG, with a template,
  // params and a license as the real library's models have.
  void add_tinystories(const std::string& repository, const std::string& tag) {
    hub.add_ollama_model(repository, tag,
                         {{kModelLayer, shared_bytes(kQ8)},
                          {kTemplateLayer, kGoTemplate},
                          {kParamsLayer, kParams},
                          {kLicenseLayer, "MIT License\n"}});
  }
  std::string blob_path(const std::string& repository, const std::string& sha) const {
    return "/v2/" + repository + "/blobs/sha256:" + sha;
  }
  fs::path model_dir(const std::string& name, const std::string& tag) const { return home.path() / "models" / name / tag; }
  std::string stored(const std::string& name, const std::string& tag) const {
    return m40::test::read_text_file(model_dir(name, tag) / "model.gguf");
  }
  nlohmann::json manifest(const std::string& name, const std::string& tag) const {
    return nlohmann::json::parse(m40::test::read_text_file(model_dir(name, tag) / "manifest.json"));
  }
  void expect_nothing_stored() const {
    EXPECT_FALSE(fs::exists(home.path() / "models") && !fs::is_empty(home.path() / "models"))
        << "left in the store: " << fs::recursive_directory_iterator(home.path() / "models")->path();
  }

  m40::test::TempStoreHome home;
  m40::test::FakeHub hub;
};

TEST_F(OllamaPull, ALibraryNameIsResolvedVerifiedAndStoredWithItsTextLayers) {
  add_tinystories("library/tinystories", "q8");
  const BinaryResult r = run_binary({"pull", "tinystories:q8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "tinystories:q8\n");
  EXPECT_NE(r.err.find("verified sha256 c773a9eb8883 (matches the source)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kept its Ollama template, params, license in manifest.json"), std::string::npos) << r.err;
  EXPECT_EQ(stored("tinystories", "q8"), shared_bytes(kQ8));

  // The manifest as Ollama asks for it; the blob through the registry's
  // redirect to its "CDN".
  const auto manifest_requests = hub.requests_for("/v2/library/tinystories/manifests/q8");
  ASSERT_EQ(manifest_requests.size(), 1u);
  EXPECT_EQ(manifest_requests[0].accept, "application/vnd.docker.distribution.manifest.v2+json");
  EXPECT_EQ(hub.requests_for(blob_path("library/tinystories", kQ8Sha)).size(), 1u);
  EXPECT_EQ(hub.requests_for(std::string("/files/blobs/") + kQ8Sha).size(), 1u);

  const auto m = manifest("tinystories", "q8");
  EXPECT_EQ(m["name"], "tinystories");
  EXPECT_EQ(m["tag"], "q8");
  EXPECT_EQ(m["sha256"], kQ8Sha);
  EXPECT_EQ(m["quant"], "Q8_0");
  EXPECT_EQ(m["source"], hub.endpoint() + blob_path("library/tinystories", kQ8Sha));
  EXPECT_EQ(m["ollama"]["template"], kGoTemplate);
  EXPECT_EQ(m["ollama"]["params"], nlohmann::json::parse(kParams));
  EXPECT_EQ(m["ollama"]["license"], nlohmann::json::array({"MIT License\n"}));
  EXPECT_FALSE(fs::exists(model_dir("tinystories", "q8") / "model.gguf.partial"));
  EXPECT_FALSE(fs::exists(model_dir("tinystories", "q8") / "model.gguf.partial.json"));
}

// What a pulled library name is good for: list, show, run (with the GGUF's
// chat template, not Ollama's Go template), then rm.
TEST_F(OllamaPull, APulledNameWorksWithListShowRunAndRm) {
  add_tinystories("library/tinystories", "q8");
  ASSERT_EQ(run_binary({"pull", "tinystories:q8"}).exit_code, 0);

  const BinaryResult list = run_binary({"list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.out.find("tinystories:q8 "), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("c773a9eb8883"), std::string::npos) << list.out;

  const BinaryResult show = run_binary({"show", "tinystories:q8", "--json"});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_EQ(nlohmann::json::parse(show.out)["model"]["architecture"], "llama") << show.out;

  const BinaryResult run = run_binary({"run", "tinystories:q8", "Once upon a time", "--cpu", "--temperature", "0", "-n", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_FALSE(run.out.empty());
  const BinaryResult tpl = run_binary({"chat-template", "tinystories:q8", "--print-template"});
  ASSERT_EQ(tpl.exit_code, 0) << tpl.err;
  EXPECT_EQ(tpl.out.find(".Prompt"), std::string::npos) << tpl.out;

  const BinaryResult rm = run_binary({"rm", "tinystories:q8"});
  ASSERT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_EQ(rm.out, "deleted 'tinystories:q8'\n");
  expect_nothing_stored();
}

TEST_F(OllamaPull, TheDefaultTagIsLatestAndNamespacesAreKept) {
  add_tinystories("library/tinystories", "latest");
  BinaryResult r = run_binary({"pull", "tinystories"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "tinystories:latest\n");
  EXPECT_EQ(hub.requests_for("/v2/library/tinystories/manifests/latest").size(), 1u);

  // library/NAME is the same model, under the same (short) name.
  r = run_binary({"pull", "library/tinystories"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "tinystories:latest\n");
  EXPECT_NE(r.err.find("tinystories:latest is up to date"), std::string::npos) << r.err;
  EXPECT_EQ(hub.requests_for(std::string("/files/blobs/") + kQ8Sha).size(), 1u);

  hub.add_ollama_model("someuser/tiny", "q2", {{kModelLayer, shared_bytes(kQ2)}});
  r = run_binary({"pull", "someuser/tiny:q2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "someuser/tiny:q2\n");
  EXPECT_EQ(stored("someuser/tiny", "q2"), shared_bytes(kQ2));
  EXPECT_FALSE(manifest("someuser/tiny", "q2")["ollama"].contains("template"));
}

TEST_F(OllamaPull, AModelBlobThatDoesNotMatchItsDigestIsRefused) {
  add_tinystories("library/tinystories", "q8");
  hub.blob(kQ8Sha).corrupt = true;  // one byte changed: the size is right, the sha256 is not
  BinaryResult r = run_binary({"pull", "tinystories:q8"});
  EXPECT_EQ(r.exit_code, 1);
  const std::string url = hub.endpoint() + blob_path("library/tinystories", kQ8Sha);
  EXPECT_NE(r.err.find("error: download of " + url + " is corrupt: sha256 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::string("does not match the expected ") + kQ8Sha), std::string::npos) << r.err;
  expect_nothing_stored();

  // The blob is another (valid GGUF) file, of another size.
  hub.add(std::string("files/blobs/") + kQ8Sha, shared_bytes(kQ2));
  r = run_binary({"pull", "tinystories:q8"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: download of " + url + " is corrupt: 553120 bytes instead of 749728"), std::string::npos)
      << r.err;
  expect_nothing_stored();
  EXPECT_EQ(run_binary({"list"}).out.find("tinystories"), std::string::npos);
}

// A text layer is checked too, and before the model's download starts.
TEST_F(OllamaPull, ATextLayerThatDoesNotMatchItsDigestIsRefusedBeforeTheDownload) {
  add_tinystories("library/tinystories", "q8");
  hub.add("files/blobs/" + m40::test::FakeHub::sha256_of(kGoTemplate), "{{ .Prompt }} altered");
  const BinaryResult r = run_binary({"pull", "tinystories:q8"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is corrupt: sha256"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing was stored"), std::string::npos) << r.err;
  EXPECT_TRUE(hub.requests_for(std::string("/files/blobs/") + kQ8Sha).empty());
  expect_nothing_stored();
}

TEST_F(OllamaPull, AnUnknownNameOrTagIsOneLine) {
  add_tinystories("library/tinystories", "q8");
  BinaryResult r = run_binary({"pull", "nosuch:7b"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: model 'nosuch:7b' not found in the Ollama library at " + hub.endpoint() + " (HTTP 404)\n");

  r = run_binary({"pull", "tinystories:q4"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: model 'tinystories:q4' not found in the Ollama library at " + hub.endpoint() + " (HTTP 404)\n");

  // ORG/REPO that is no user's model in the library is, more likely, a
  // Hugging Face repository.
  r = run_binary({"pull", "bartowski/Llama-3.2-1B-Instruct-GGUF"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: model 'bartowski/Llama-3.2-1B-Instruct-GGUF:latest' not found in the Ollama library at " +
                       hub.endpoint() +
                       " (HTTP 404); a Hugging Face repository is pulled as "
                       "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF\n");
  expect_nothing_stored();
}

TEST_F(OllamaPull, AManifestWithoutAModelLayerIsRefused) {
  const std::string tpl_sha = hub.add("files/blobs/template", kGoTemplate).sha256;
  hub.set_ollama_manifest("library/notamodel", "latest",
                          R"({"schemaVersion":2,"layers":[)" + layer_json(kTemplateLayer, tpl_sha, 10) + "]}");
  const BinaryResult r = run_binary({"pull", "notamodel"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "error: the Ollama manifest of notamodel:latest has no model layer (application/vnd.ollama.image.model), "
            "so there is no GGUF file to pull\n");
  expect_nothing_stored();
}

// A model blob that the registry serves but is no GGUF file is refused by
// the same check as any other download.
TEST_F(OllamaPull, AModelLayerThatIsNotGgufIsRefused) {
  hub.add_ollama_model("library/page", "latest", {{kModelLayer, "<html>not a model</html>\n"}});
  const BinaryResult r = run_binary({"pull", "page"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is not a valid GGUF file"), std::string::npos) << r.err;
  expect_nothing_stored();
}

TEST_F(OllamaPull, ADroppedBlobDownloadResumesThroughTheRedirect) {
  add_tinystories("library/tinystories", "q8");
  hub.blob(kQ8Sha).drop_first = true;
  const BinaryResult r = run_binary({"pull", "tinystories:q8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("connection lost at 374864 bytes"), std::string::npos) << r.err;
  const auto requests = hub.requests_for(std::string("/files/blobs/") + kQ8Sha);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range, "bytes=374864-");
  EXPECT_EQ(stored("tinystories", "q8"), shared_bytes(kQ8));
}

// Ctrl-C halfway, then a pull again: the download resumes after the bytes
// kept (Range, with If-Range the CDN's ETag), and the file is whole.
TEST_F(OllamaPull, AnInterruptedPullResumesWhereItStopped) {
  add_tinystories("library/tinystories", "q8");
  auto& blob = hub.blob(kQ8Sha);
  blob.stall_at_half = true;
  const std::string etag = blob.etag;
  const fs::path partial = model_dir("tinystories", "q8") / "model.gguf.partial";
  m40::test::interrupt_pull_at({"pull", "tinystories:q8"}, partial, 374864);
  EXPECT_FALSE(fs::exists(model_dir("tinystories", "q8") / "manifest.json"));
  EXPECT_EQ(run_binary({"list"}).out.find("tinystories"), std::string::npos);
  hub.release_stalls();

  const BinaryResult r = run_binary({"pull", "tinystories:q8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed a partial download at 374864 bytes"), std::string::npos) << r.err;
  const auto requests = hub.requests_for(std::string("/files/blobs/") + kQ8Sha);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range, "bytes=374864-");
  EXPECT_EQ(requests[1].if_range, etag);
  EXPECT_EQ(stored("tinystories", "q8"), shared_bytes(kQ8));
  EXPECT_EQ(manifest("tinystories", "q8")["ollama"]["template"], kGoTemplate);
}

// `run` of a name that is neither a file nor in the store names the pull
// command after which the same `run` works.
TEST_F(OllamaPull, RunOfAMissingModelNamesThePullThatWorks) {
  const auto run_error = [](const std::string& model) { return run_binary({"run", model, "hi", "--cpu"}).err; };
  EXPECT_EQ(run_error("qwen3:8b"), "error: model 'qwen3:8b' not found: pull it with m40-llm pull qwen3:8b\n");
  EXPECT_EQ(run_error("hf.co/org/repo:Q8_0"),
            "error: model 'hf.co/org/repo:Q8_0' not found: pull it with m40-llm pull hf.co/org/repo:Q8_0\n");
  // Pulled under another name than the one typed: that name.
  EXPECT_EQ(run_error("library/qwen3:8b"),
            "error: model 'library/qwen3:8b' not found: m40-llm pull library/qwen3:8b stores it as qwen3:8b, then use "
            "qwen3:8b\n");
  EXPECT_EQ(run_error("org/repo/model.Q8_0.gguf"),
            "error: model 'org/repo/model.Q8_0.gguf' not found: m40-llm pull org/repo/model.Q8_0.gguf stores it as "
            "hf.co/org/repo:Q8_0, then use hf.co/org/repo:Q8_0\n");
  EXPECT_EQ(run_error("https://example.com/files/Tiny.gguf"),
            "error: model 'https://example.com/files/Tiny.gguf' not found: m40-llm pull "
            "https://example.com/files/Tiny.gguf stores it as tiny:latest, then use tiny:latest\n");
  // ORG/REPO: the Ollama library's, or a Hugging Face repository.
  EXPECT_EQ(run_error("bartowski/Llama-GGUF:Q4_K_M"),
            "error: model 'bartowski/Llama-GGUF:Q4_K_M' not found: pull it with m40-llm pull bartowski/Llama-GGUF:Q4_K_M "
            "(from the Ollama library), or for the Hugging Face repository m40-llm pull hf.co/bartowski/Llama-GGUF:Q4_K_M "
            "and use hf.co/bartowski/Llama-GGUF:Q4_K_M\n");
  // No pull makes these work.
  EXPECT_EQ(run_error("missing.gguf"), "error: model file 'missing.gguf' does not exist\n");
  EXPECT_EQ(run_error("a/b/c"), "error: model 'a/b/c' not found: pull one under that name with m40-llm pull SOURCE --name a/b/c\n");
  EXPECT_EQ(run_error("two words"),
            "error: no file or stored model 'two words': invalid model name 'two words': the character ' ' in a name part "
            "(use letters, digits, '.', '_', '-')\n");
  EXPECT_TRUE(hub.requests().empty());

  // And the command named does work.
  add_tinystories("library/tinystories", "q8");
  ASSERT_EQ(run_binary({"pull", "library/tinystories:q8"}).exit_code, 0);
  const BinaryResult run = run_binary({"run", "tinystories:q8", "Once", "--cpu", "--temperature", "0", "-n", "2"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

}  // namespace

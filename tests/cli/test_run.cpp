// `m40-llm run` and `bench` through the binary, against llama.cpp's reference.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "binary_runner.h"
#include "engine/reference_case.h"

namespace {

namespace fs = std::filesystem;
using m40::test::run_binary;

fs::path reference(const std::string& stem) { return m40::test::shared_dir() / "reference" / stem; }

class RunCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(m40::test::shared_model("TinyStories-656K-Q8_0.gguf"))) GTEST_SKIP() << "shared models missing";
  }
};

}  // namespace

// The prompt is tokenized as llama.cpp does and the logits of its last
// position match llama.cpp's F32-cache reference to 1e-3.
TEST_F(RunCommand, LogitsOutMatchesTheReference) {
  const fs::path out = fs::path(::testing::TempDir()) / "m40_run_logits.bin";
  auto r = run_binary({"run", m40::test::shared_model("synthetic/tiny-llama-rand-F32.gguf").string(), "Once upon a time",
                       "--cpu", "--kv-type", "f32", "-n", "1", "--temperature", "0", "--logits-out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ours = m40::test::read_floats(out);
  const auto ref = m40::test::read_floats(reference("tiny-llama-rand-F32/variants/kvf32-fa-off/once-upon-a-time.logits.bin"));
  ASSERT_EQ(ours.size(), ref.size());
  float worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ours[i] - ref[i]));
  EXPECT_LE(worst, 1e-3f);
  fs::remove(out);
}

// Greedy output is llama.cpp's continuation, up to the first step whose
// margin is within the F32 model's logit tolerance (2e-2).
TEST_F(RunCommand, GreedyTextIsTheReferenceContinuation) {
  auto greedy = nlohmann::json::parse(
      m40::test::read_text_file(reference("tiny-llama-rand-F32/the-quick-brown-fox.greedy.json")));
  std::string expected;
  for (const auto& step : greedy["steps"]) {
    if (step["margin_to_2nd"].get<float>() < 2e-2f) break;
    expected += step["piece"].get<std::string>();
  }
  ASSERT_GT(expected.size(), 10u);
  auto r = run_binary({"run", m40::test::shared_model("synthetic/tiny-llama-rand-F32.gguf").string(),
                       "The quick brown fox", "--cpu", "--temperature", "0", "-n", "32", "--verbose"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, expected.size()), expected);
  EXPECT_NE(r.err.find("eval rate:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prompt eval count:    9 token(s)"), std::string::npos) << r.err;
}

TEST_F(RunCommand, SeededSamplingRepeatsAndStopStringsCut) {
  const std::string model = m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string();
  auto a = run_binary({"run", model, "Once upon a time", "--cpu", "--seed", "42", "-n", "24"});
  auto b = run_binary({"run", model, "Once upon a time", "--cpu", "--seed", "42", "-n", "24"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  auto full = run_binary({"run", model, "Once upon a time", "--cpu", "--temperature", "0", "-n", "24"});
  auto cut = run_binary({"run", model, "Once upon a time", "--cpu", "--temperature", "0", "-n", "24", "--stop", "Lily"});
  ASSERT_NE(full.out.find("Lily"), std::string::npos);
  EXPECT_EQ(cut.out, full.out.substr(0, full.out.find("Lily")) + "\n");
}

// --format: the answer is decoded under the schema's grammar, so even a
// random-weight model writes a document the schema accepts; a format that
// is neither "json" nor a schema is refused before anything runs.
TEST_F(RunCommand, FormatMakesTheAnswerAValidDocument) {
  const auto model = m40::test::shared_model("arch/tiny-qwen2-F32.gguf");
  if (!fs::exists(model)) GTEST_SKIP() << model;
  const std::string schema =
      R"({"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}, "age": {"type": "integer", "minimum": 0, "maximum": 20}},)"
      R"( "required": ["pet", "age"], "additionalProperties": false})";
  for (const char* seed : {"1", "2", "3"}) {
    auto r = run_binary({"run", model.string(), "Describe a pet", "--cpu", "--seed", seed, "-n", "200", "--format", schema});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json doc;
    ASSERT_NO_THROW(doc = nlohmann::json::parse(r.out)) << r.out;
    ASSERT_EQ(doc.size(), 2u) << r.out;
    EXPECT_TRUE(doc["pet"] == "cat" || doc["pet"] == "dog") << r.out;
    ASSERT_TRUE(doc["age"].is_number_integer()) << r.out;
    EXPECT_GE(doc["age"].get<int>(), 0);
    EXPECT_LE(doc["age"].get<int>(), 20);
  }
  auto bad = run_binary({"run", model.string(), "x", "--cpu", "--format", "{not json"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--format"), std::string::npos) << bad.err;
}

TEST_F(RunCommand, ErrorsAreOneLineWithExitStatusOne) {
  const std::string model = m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string();
  auto too_long = run_binary({"run", model, "Once upon a time there was a dog", "--cpu", "--ctx", "4"});
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.err.find("context holds 4"), std::string::npos) << too_long.err;
  auto vocab_only = run_binary({"run", m40::test::shared_model("vocab/ggml-vocab-gpt-2.gguf").string(), "hi", "--cpu"});
  EXPECT_EQ(vocab_only.exit_code, 1);
  EXPECT_NE(vocab_only.err.find("unsupported architecture gpt2"), std::string::npos) << vocab_only.err;
  auto missing = run_binary({"run", "/nonexistent.gguf", "hi"});
  EXPECT_NE(missing.exit_code, 0);
}

TEST_F(RunCommand, BenchPrintsALlamaBenchTable) {
  auto r = run_binary({"bench", m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string(), "--cpu", "-p", "16",
                       "-n", "4", "-r", "2", "-t", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| model "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pp16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tg4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| CPU "), std::string::npos) << r.out;
}

// -b decodes several sequences per step: one row per sequence count.
TEST_F(RunCommand, BenchMeasuresBatchedGeneration) {
  auto r = run_binary({"bench", m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string(), "--cpu", "-p", "0",
                       "-n", "4", "-b", "1", "3", "-r", "1", "-t", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("|             tg4 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("|           tg4@3 |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("pp"), std::string::npos) << r.out;
  auto zero = run_binary({"bench", m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string(), "--cpu", "-b", "0"});
  EXPECT_NE(zero.exit_code, 0);
}

// -d fills the KV cache first (llama-bench's depth); --kv-type picks the
// cache's element type, and an unknown one is refused by name.
TEST_F(RunCommand, BenchMeasuresAtADepthWithAKvType) {
  const std::string model = m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string();
  auto r = run_binary({"bench", model, "--cpu", "-p", "8", "-n", "4", "-d", "0", "100", "-r", "1", "-t", "2", "--kv-type", "q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"|             pp8 |", "|             tg4 |", "|      pp8 @ d100 |", "|      tg4 @ d100 |"}) {
    EXPECT_NE(r.out.find(name), std::string::npos) << name << "\n" << r.out;
  }
  auto bad = run_binary({"bench", model, "--cpu", "--kv-type", "q4"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--kv-type"), std::string::npos) << bad.err;
}

// A model pulled into the store is run, shown and benchmarked by its name.
TEST_F(RunCommand, StoreNamesWorkWherePathsDo) {
  const fs::path home = fs::path(::testing::TempDir()) / ("m40_run_home_" + std::to_string(::getpid()));
  fs::remove_all(home);
  ::setenv("M40_LLM_HOME", home.c_str(), 1);
  auto pull = run_binary({"pull", m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string(), "--name", "tiny:q8"});
  ASSERT_EQ(pull.exit_code, 0) << pull.err;
  auto by_name = run_binary({"run", "tiny:q8", "Once upon a time", "--cpu", "--temperature", "0", "-n", "8"});
  auto by_path = run_binary({"run", m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string(), "Once upon a time",
                             "--cpu", "--temperature", "0", "-n", "8"});
  ASSERT_EQ(by_name.exit_code, 0) << by_name.err;
  EXPECT_EQ(by_name.out, by_path.out);
  auto show = run_binary({"show", "tiny:q8", "--json"});
  EXPECT_EQ(show.exit_code, 0) << show.err;
  auto missing = run_binary({"run", "nosuch:model", "hi"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("pull it with m40-llm pull nosuch:model"), std::string::npos) << missing.err;
  ::unsetenv("M40_LLM_HOME");
  fs::remove_all(home);
}

// `m40-llm tokenize` and `m40-llm detokenize`, run as a user runs them: the
// built binary, its stdout, stderr and exit status. The expected ids come
// from llama.cpp (shared/models/vocab/*.out, shared/reference/*.tokens.json),
// not from our library.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "binary_runner.h"
#include "test_paths.h"
#include "vocab_test_files.h"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

using RunResult = m40::test::BinaryResult;

RunResult run_m40(const std::vector<std::string>& args, const std::string& stdin_path = "") {
  return m40::test::run_binary(args, stdin_path);
}

std::string vocab(const std::string& name) { return m40::tokenizer::test::vocab_path(name).string(); }

std::string ids_line(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s + "\n";
}

class TokenizeCommand : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(vocab("llama-spm")) || !fs::exists(vocab("gpt-2"))) GTEST_SKIP() << "vocabularies missing";
  }
};

TEST_F(TokenizeCommand, PrintsIdsWithBosAsTheModelAsks) {
  RunResult r = run_m40({"tokenize", vocab("llama-spm"), "Hello world"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 15043 3186\n");
  EXPECT_EQ(r.err, "");
  r = run_m40({"tokenize", vocab("llama-spm"), "Hello world", "--no-bos"});
  EXPECT_EQ(r.out, "15043 3186\n");
  r = run_m40({"tokenize", vocab("gpt-2"), "Hello world"});  // GPT-2 adds no BOS
  EXPECT_EQ(r.out, "15496 995\n");
}

TEST_F(TokenizeCommand, EveryLlamaCppCaseThroughTheBinary) {
  for (const char* name : {"llama-spm", "gpt-2"}) {
    for (const auto& c : m40::tokenizer::test::read_vocab_cases(name)) {
      if (c.text.empty()) continue;  // an empty argument: covered below
      const RunResult r = run_m40({"tokenize", vocab(name), c.text, "--no-bos"});
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, ids_line(c.expected)) << name << ": '" << m40::tokenizer::test::printable(c.text) << "'";
    }
  }
}

TEST_F(TokenizeCommand, Pieces) {
  const RunResult r = run_m40({"tokenize", vocab("llama-spm"), "Hi\n🦙", "--pieces"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "     1 -> '<s>'\n"
            "  6324 -> ' Hi'\n"
            "    13 -> '\\n'\n"
            "   243 -> '\\xf0'\n"
            "   162 -> '\\x9f'\n"
            "   169 -> '\\xa6'\n"
            "   156 -> '\\x99'\n");
}

TEST_F(TokenizeCommand, SpecialTokensOnlyWithSpecial) {
  RunResult r = run_m40({"tokenize", vocab("gpt-2"), "a<|endoftext|>b", "--special"});
  EXPECT_EQ(r.out, "64 50256 65\n");
  r = run_m40({"tokenize", vocab("gpt-2"), "a<|endoftext|>b"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.find("50256"), std::string::npos) << r.out;
}

TEST_F(TokenizeCommand, Json) {
  const RunResult r = run_m40({"tokenize", vocab("llama-spm"), "Hello 🦙", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  EXPECT_EQ(j.at("ids").get<std::vector<int>>(), (std::vector<int>{1, 15043, 29871, 243, 162, 169, 156}));
  EXPECT_EQ(j.at("n_tokens").get<int>(), 7);
  EXPECT_EQ(j.at("tokenizer").get<std::string>(), "llama");
  EXPECT_TRUE(j.at("add_special").get<bool>());
  EXPECT_FALSE(j.at("parse_special").get<bool>());
  EXPECT_EQ(j.at("tokens")[1].at("piece").get<std::string>(), " Hello");
  EXPECT_EQ(j.at("tokens")[3].at("piece_hex").get<std::string>(), "f0");
}

TEST_F(TokenizeCommand, TextFromAFileOrStandardInput) {
  const fs::path file = fs::path(testing::TempDir()) / "m40_tokenize_input.txt";
  {
    std::ofstream(file, std::ios::binary) << "Hello world";
  }
  RunResult r = run_m40({"tokenize", vocab("llama-spm"), "--file", file.string()});
  EXPECT_EQ(r.out, "1 15043 3186\n") << r.err;
  r = run_m40({"tokenize", vocab("llama-spm"), "--file", "-"}, file.string());
  EXPECT_EQ(r.out, "1 15043 3186\n") << r.err;
  r = run_m40({"tokenize", vocab("llama-spm"), "text", "--file", file.string()});
  EXPECT_EQ(r.exit_code, 1);
  fs::remove(file);
}

TEST_F(TokenizeCommand, EmptyTextAndInvalidUtf8) {
  RunResult r = run_m40({"tokenize", vocab("llama-spm"), ""});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1\n");
  r = run_m40({"tokenize", vocab("gpt-2"), "", "--json"});
  EXPECT_EQ(Json::parse(r.out).at("n_tokens").get<int>(), 0);
  r = run_m40({"tokenize", vocab("gpt-2"), "bad \xFF byte"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, run_m40({"tokenize", vocab("gpt-2"), "bad \xEF\xBF\xBD byte"}).out);
}

TEST_F(TokenizeCommand, Detokenize) {
  RunResult r = run_m40({"detokenize", vocab("llama-spm"), "1", "15043", "3186", "29871", "243", "162", "169", "156"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, " Hello world 🦙\n");  // llama.cpp keeps the space after BOS
  r = run_m40({"detokenize", vocab("llama-spm"), "15043", "3186"});
  EXPECT_EQ(r.out, "Hello world\n");
  r = run_m40({"detokenize", vocab("llama-spm"), "1", "15043", "--special"});
  EXPECT_EQ(r.out, "<s> Hello\n");
  r = run_m40({"detokenize", vocab("gpt-2"), "15496", "995", "--json"});
  EXPECT_EQ(Json::parse(r.out).at("text").get<std::string>(), "Hello world");
}

TEST_F(TokenizeCommand, BadInputIsOneLineOnStderrAndStatusOne) {
  RunResult r = run_m40({"detokenize", vocab("llama-spm"), "1", "32000"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("error: token id 32000 is out of range"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run_m40({"detokenize", vocab("llama-spm"), "-7"});
  EXPECT_EQ(r.exit_code, 1);
  r = run_m40({"tokenize", "/no/such/model.gguf", "Hello"});
  EXPECT_NE(r.exit_code, 0);
}

TEST_F(TokenizeCommand, WordPiece) {
  if (!fs::exists(vocab("bert-bge"))) GTEST_SKIP();
  const RunResult r = run_m40({"tokenize", vocab("bert-bge"), "Hello world"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "101 7592 2088 102\n");  // [CLS] hello world [SEP]
}

TEST_F(TokenizeCommand, ReferencePrompt) {
  const fs::path model = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!fs::exists(model)) GTEST_SKIP();
  // shared/reference/TinyStories-656K-Q8_0/once-upon-a-time.tokens.json
  const RunResult r = run_m40({"tokenize", model.string(), "Once upon a time", "--special"});
  EXPECT_EQ(r.out, "1 80 147 201 282 57\n") << r.err;
}

}  // namespace

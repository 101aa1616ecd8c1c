// Every case of llama.cpp's tokenizer tests (shared/models/vocab/*.inp/.out,
// ids from the Hugging Face tokenizers) must come out exactly, for every
// vocabulary whose .gguf is present; and the ids must turn back into the
// input text.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "tokenizer/vocab.h"
#include "vocab_test_files.h"

namespace m40::tokenizer {
namespace {

using test::join_ids;
using test::printable;
using test::read_vocab_cases;
using test::vocab_path;

class TokenizerVocabFiles : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(vocab_path(GetParam()))) GTEST_SKIP() << vocab_path(GetParam()) << " is not present";
    cases_ = read_vocab_cases(GetParam());
    ASSERT_FALSE(cases_.empty()) << "no test cases for " << GetParam();
    vocab_ = std::make_unique<Vocab>(Vocab::from_file(vocab_path(GetParam()).string()));
  }
  std::vector<test::VocabCase> cases_;
  std::unique_ptr<Vocab> vocab_;
};

TEST_P(TokenizerVocabFiles, EveryCaseTokenizesLikeLlamaCpp) {
  size_t passed = 0;
  for (const auto& c : cases_) {
    const std::vector<TokenId> ids = vocab_->encode(c.text, {.add_special = false, .parse_special = false});
    if (ids == c.expected) {
      ++passed;
    } else {
      ADD_FAILURE() << GetParam() << ": '" << printable(c.text) << "'\n  expected" << join_ids(c.expected)
                    << "\n  got     " << join_ids(ids);
    }
  }
  std::printf("[ vocab    ] %s: %zu/%zu cases exact\n", GetParam(), passed, cases_.size());
  RecordProperty("cases_passed", std::to_string(passed) + "/" + std::to_string(cases_.size()));
}

TEST_P(TokenizerVocabFiles, StreamingDetokenizerGivesTheTextBack) {
  if (vocab_->kind() == VocabKind::kWpm) GTEST_SKIP() << "WordPiece normalizes: lowercase, no accents, no space runs";
  for (const auto& c : cases_) {
    StreamingDetokenizer stream(*vocab_);
    std::string text;
    for (TokenId id : c.expected) stream.push(id, text);
    stream.flush(text);
    EXPECT_EQ(printable(text), printable(c.text)) << GetParam();
  }
}

TEST_P(TokenizerVocabFiles, DecodeGivesTheTextBackWhereTheVocabularyDoesNotCleanSpaces) {
  if (vocab_->clean_spaces()) GTEST_SKIP() << GetParam() << " tidies spaces around punctuation when decoding";
  for (const auto& c : cases_) {
    EXPECT_EQ(printable(vocab_->decode(c.expected)), printable(c.text)) << GetParam();
  }
}

// One Vocab, many threads at once (as llama.cpp's test-tokenizer-0 does).
TEST_P(TokenizerVocabFiles, ConcurrentEncodingGivesTheSameIds) {
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 5; ++round) {
        for (const auto& c : cases_) {
          if (vocab_->encode(c.text, {.add_special = false}) != c.expected) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(TokenizerVocabFiles, BosIsAddedAsTheVocabularySays) {
  const std::vector<TokenId> ids = vocab_->encode("Hello world");
  const std::vector<TokenId> bare = vocab_->encode("Hello world", {.add_special = false});
  std::vector<TokenId> expected = bare;
  if (vocab_->add_bos()) expected.insert(expected.begin(), vocab_->special().bos);
  if (vocab_->add_eos()) expected.push_back(vocab_->special().eos);
  if (vocab_->add_sep()) expected.push_back(vocab_->special().sep);
  EXPECT_EQ(ids, expected);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, TokenizerVocabFiles,
                         testing::Values("llama-spm", "phi-3", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2", "mpt",
                                         "refact", "starcoder", "bert-bge", "qwen2", "llama-bpe", "command-r"),
                         [](const testing::TestParamInfo<const char*>& param_info) {
                           std::string name = param_info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST(TokenizerVocabFiles, WordPieceAddsClsAndSepAndDecodes) {
  const auto path = vocab_path("bert-bge");
  if (!std::filesystem::exists(path)) GTEST_SKIP();
  const Vocab v = Vocab::from_file(path.string());
  EXPECT_EQ(v.kind(), VocabKind::kWpm);
  EXPECT_EQ(v.special().bos, 101);  // [CLS]
  EXPECT_EQ(v.special().sep, 102);
  EXPECT_EQ(v.special().unk, 100);
  const std::vector<TokenId> ids = v.encode("Hello World!");
  EXPECT_EQ(ids, (std::vector<TokenId>{101, 7592, 2088, 999, 102}));  // [CLS] hello world ! [SEP]
  EXPECT_EQ(v.decode(ids), " hello world!");
  EXPECT_EQ(v.decode(ids, {.render_special = true}), "[CLS] hello world![SEP]");
  EXPECT_EQ(v.encode("Führer Äpfel", {.add_special = false}),
            v.encode("fuhrer apfel", {.add_special = false}));  // accents stripped, lowercased
}

// WordPiece lowercases with Python's str.lower() on every script with case
// (common/unicode.h, the table the Jinja engine's lower filter uses too):
// Georgian Mtavruli (Unicode 11) and Armenian capitals become the lowercase
// letters the vocabulary has.
TEST(TokenizerVocabFiles, WordPieceLowercasesEveryCasedScript) {
  const auto path = vocab_path("bert-bge");
  if (!std::filesystem::exists(path)) GTEST_SKIP();
  const Vocab v = Vocab::from_file(path.string());
  const std::vector<TokenId> lower = v.encode("\u10d0 \u0561 \u03c3", {.add_special = false});  // ა ա σ
  ASSERT_EQ(lower.size(), 3u);
  for (TokenId id : lower) EXPECT_NE(id, v.special().unk);
  EXPECT_EQ(v.encode("\u1c90 \u0531 \u03a3", {.add_special = false}), lower);  // Ა Ա Σ
}

TEST(TokenizerVocabFiles, MetadataOfTheLlamaVocabulary) {
  const auto path = vocab_path("llama-spm");
  if (!std::filesystem::exists(path)) GTEST_SKIP();
  const Vocab v = Vocab::from_file(path.string());
  EXPECT_EQ(v.kind(), VocabKind::kSpm);
  EXPECT_EQ(v.size(), 32000u);
  EXPECT_EQ(v.special().bos, 1);
  EXPECT_EQ(v.special().eos, 2);
  EXPECT_EQ(v.special().unk, 0);
  EXPECT_EQ(v.special().newline, 13);  // <0x0A>
  EXPECT_TRUE(v.add_bos());
  EXPECT_FALSE(v.add_eos());
  EXPECT_TRUE(v.add_space_prefix());
  EXPECT_EQ(v.type(1), TokenType::kControl);
  EXPECT_EQ(v.type(13), TokenType::kByte);
  EXPECT_TRUE(v.is_end_of_generation(2));
  EXPECT_EQ(v.find("▁Hello"), std::optional<TokenId>(15043));
}

TEST(TokenizerVocabFiles, MetadataOfTheGpt2Vocabulary) {
  const auto path = vocab_path("gpt-2");
  if (!std::filesystem::exists(path)) GTEST_SKIP();
  const Vocab v = Vocab::from_file(path.string());
  EXPECT_EQ(v.kind(), VocabKind::kBpe);
  EXPECT_EQ(v.pre_name(), "gpt-2");
  EXPECT_EQ(v.size(), 50257u);
  EXPECT_EQ(v.merge_count(), 50000u);
  EXPECT_EQ(v.special().bos, 50256);
  EXPECT_EQ(v.special().eos, 50256);
  EXPECT_EQ(v.special().eot, 50256);  // <|endoftext|>
  EXPECT_EQ(v.special().newline, 198);  // "Ċ"
  EXPECT_FALSE(v.add_bos());
  EXPECT_TRUE(v.clean_spaces());
  EXPECT_TRUE(v.warnings().empty());
}

}  // namespace
}  // namespace m40::tokenizer

namespace m40::tokenizer {
namespace {

// The fill-in-the-middle markers, found by their names where the file has
// no fim_*_token_id keys (ids as `tokenize --special` reads the names).
TEST(TokenizerVocabFiles, FillInTheMiddleTokensAreFoundByName) {
  struct Case {
    const char* vocab;
    TokenId pre, suf, mid;
  };
  for (const Case& c : {Case{"starcoder", 1, 3, 2}, Case{"deepseek-coder", 32016, 32015, 32017}}) {
    const auto path = vocab_path(c.vocab);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path;
    const Vocab v = Vocab::from_file(path.string());
    EXPECT_TRUE(v.special().has_fim()) << c.vocab;
    EXPECT_EQ(v.special().fim_pre, c.pre) << c.vocab;
    EXPECT_EQ(v.special().fim_suf, c.suf) << c.vocab;
    EXPECT_EQ(v.special().fim_mid, c.mid) << c.vocab;
    EXPECT_TRUE(v.is_control(c.pre)) << c.vocab;
  }
  for (const char* none : {"llama-spm", "gpt-2"}) {
    const auto path = vocab_path(none);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path;
    EXPECT_FALSE(Vocab::from_file(path.string()).special().has_fim()) << none;
  }
}

}  // namespace
}  // namespace m40::tokenizer

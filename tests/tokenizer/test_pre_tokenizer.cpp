// The BPE pre-tokenizer: the flavour table, the regex translation for PCRE2,
// and splits whose expected words follow from llama.cpp's regexes.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "gguf/file.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"
#include "vocab_test_files.h"

namespace m40::tokenizer {
namespace {

std::vector<std::string> split(std::string_view flavour_name, std::string_view text) {
  const PreTokenizerFlavour* flavour = find_pre_tokenizer_flavour(flavour_name);
  EXPECT_NE(flavour, nullptr) << flavour_name;
  if (flavour == nullptr) return {};
  PreTokenizer pre(*flavour);
  std::vector<Span> spans;
  pre.split(text, spans);
  std::vector<std::string> words;
  for (const Span& s : spans) words.emplace_back(text.substr(s.begin, s.size()));
  return words;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, EveryFlavourCompiles) {
  for (const auto& flavour : pre_tokenizer_flavours()) {
    EXPECT_NO_THROW(PreTokenizer{flavour}) << flavour.name;
    EXPECT_FALSE(flavour.gguf_names.empty()) << flavour.name;
  }
}

TEST(PreTokenizer, EachGgufNameSelectsOneFlavour) {
  std::set<std::string_view> seen;
  for (const auto& flavour : pre_tokenizer_flavours()) {
    for (std::string_view name : flavour.gguf_names) EXPECT_TRUE(seen.insert(name).second) << name << " is listed twice";
  }
  EXPECT_EQ(find_pre_tokenizer_flavour("llama-bpe")->name, "llama3");
  EXPECT_EQ(find_pre_tokenizer_flavour("deepseek-r1-qwen")->name, "qwen2");
  EXPECT_EQ(find_pre_tokenizer_flavour("phi-2")->name, "gpt-2");
  EXPECT_EQ(find_pre_tokenizer_flavour("no-such-flavour"), nullptr);
}

TEST(PreTokenizer, WordsCoverTheTextInOrder) {
  const std::string text = "  Hello, y'all! 3.14159 ½ 我想在apple工作 🦙\n\n\t end  ";
  for (const auto& flavour : pre_tokenizer_flavours()) {
    PreTokenizer pre(flavour);
    std::vector<Span> spans;
    pre.split(text, spans);
    uint32_t at = 0;
    for (const Span& s : spans) {
      EXPECT_EQ(s.begin, at) << flavour.name;
      EXPECT_GT(s.end, s.begin) << flavour.name;
      at = s.end;
    }
    EXPECT_EQ(at, text.size()) << flavour.name;
  }
}

TEST(PreTokenizer, Gpt2SplitsWordsNumbersPunctuationAndSpaces) {
  EXPECT_EQ(split("gpt-2", "Hello world's  end!!"), (Words{"Hello", " world", "'s", " ", " end", "!!"}));
  EXPECT_EQ(split("gpt-2", "I'll 2024"), (Words{"I", "'ll", " 2024"}));
  EXPECT_EQ(split("gpt-2", "a\n\nb"), (Words{"a", "\n", "\n", "b"}));  // \s+(?!\S) leaves the last space to the word
  EXPECT_EQ(split("gpt-2", "end   "), (Words{"end", "   "}));
}

TEST(PreTokenizer, Llama3KeepsDigitsInThrees) {
  EXPECT_EQ(split("llama3", "1234567 HELLO's"), (Words{"123", "456", "7", " HELLO", "'s"}));
  EXPECT_EQ(split("llama3", "x\r\n\r\ny"), (Words{"x", "\r\n\r\n", "y"}));
}

TEST(PreTokenizer, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+0085 (NEXT LINE) is White_Space for llama.cpp and the HF tokenizers,
  // though not for PCRE2's own \s: two of them split as spaces, not as one
  // run of "other" characters.
  EXPECT_EQ(split("gpt-2", "\xC2\x85\xC2\x85" "b"), (Words{"\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(split("gpt-2", "a\xE3\x80\x80\xE3\x80\x80" "b"), (Words{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
}

TEST(PreTokenizer, DeepseekLlmTrailingSpaces) {
  // `\s+$` takes the spaces at the very end only.
  EXPECT_EQ(split("deepseek-llm", "Hi  \x01  "), (Words{"Hi", "  \x01", "  "}));
}

TEST(PreTokenizer, TranslatesWhiteSpaceEscapes) {
  EXPECT_EQ(to_pcre2_pattern("a"), "a");
  EXPECT_NE(to_pcre2_pattern("\\s").find("\\x{85}"), std::string::npos);
  EXPECT_EQ(to_pcre2_pattern("\\S").substr(0, 2), "[^");
  EXPECT_EQ(to_pcre2_pattern("[\\s]").front(), '[');
  EXPECT_EQ(to_pcre2_pattern("\\p{L}\\\\s"), "\\p{L}\\\\s");  // an escaped backslash, then a plain s
  EXPECT_THROW(to_pcre2_pattern("[^\\S]"), TokenizerError);
}

gguf::Metadata metadata_of(const std::string& vocab) {
  const gguf::File file = gguf::File::open(test::vocab_path(vocab).string());
  return file.metadata();
}

TEST(PreTokenizer, UnknownFlavourIsAClearError) {
  if (!std::filesystem::exists(test::vocab_path("gpt-2"))) GTEST_SKIP();
  gguf::Metadata md = metadata_of("gpt-2");
  md.set("tokenizer.ggml.pre", "no-such-flavour");
  try {
    Vocab::from_metadata(md);
    FAIL() << "an unknown pre-tokenizer was accepted";
  } catch (const TokenizerError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no-such-flavour"), std::string::npos) << what;
    EXPECT_NE(what.find("llama-bpe"), std::string::npos) << what;  // lists the known ones
  }
}

TEST(PreTokenizer, MissingFlavourFallsBackToDefaultWithAWarning) {
  if (!std::filesystem::exists(test::vocab_path("gpt-2"))) GTEST_SKIP();
  gguf::Metadata md = metadata_of("gpt-2");
  md.erase("tokenizer.ggml.pre");
  const Vocab v = Vocab::from_metadata(md);
  EXPECT_EQ(v.pre_name(), "default");
  ASSERT_EQ(v.warnings().size(), 1u);
  EXPECT_NE(v.warnings()[0].find("tokenizer.ggml.pre"), std::string::npos);
}

TEST(PreTokenizer, UnsupportedTokenizerModelsAreClearErrors) {
  if (!std::filesystem::exists(test::vocab_path("gpt-2"))) GTEST_SKIP();
  for (const char* model : {"t5", "rwkv", "something-else"}) {
    gguf::Metadata md = metadata_of("gpt-2");
    md.set("tokenizer.ggml.model", model);
    EXPECT_THROW(Vocab::from_metadata(md), TokenizerError) << model;
  }
  gguf::Metadata md = metadata_of("gpt-2");
  md.erase("tokenizer.ggml.model");
  EXPECT_THROW(Vocab::from_metadata(md), TokenizerError);
}

}  // namespace
}  // namespace m40::tokenizer

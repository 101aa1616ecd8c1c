// Input a tokenizer meets in the wild: invalid UTF-8, empty strings,
// megabyte-long strings built to make naive implementations quadratic
// (one huge word, long runs of spaces, digits, CJK), and special-token text.
#include <gtest/gtest.h>

#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"
#include "tokenizer/vocab_impl.h"
#include "vocab_test_files.h"

namespace m40::tokenizer {
namespace {

const char* const kVocabs[] = {"llama-spm", "phi-3",  "deepseek-coder", "deepseek-llm", "falcon",
                               "gpt-2",     "mpt",    "refact",         "starcoder",    "bert-bge"};

std::vector<std::unique_ptr<Vocab>> present_vocabs(std::vector<std::string>* names = nullptr) {
  std::vector<std::unique_ptr<Vocab>> vocabs;
  for (const char* name : kVocabs) {
    if (!std::filesystem::exists(test::vocab_path(name))) continue;
    vocabs.push_back(std::make_unique<Vocab>(Vocab::from_file(test::vocab_path(name).string())));
    if (names != nullptr) names->push_back(name);
  }
  return vocabs;
}

std::string repeat(std::string_view unit, size_t bytes) {
  std::string s;
  s.reserve(bytes + unit.size());
  while (s.size() < bytes) s += unit;
  return s;
}

// CPU seconds this thread has run: a bound on it catches quadratic work
// (hours on these inputs, against about a second linear) whatever else
// the machine runs.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

TEST(TokenizerBadInput, InvalidUtf8IsReadAsReplacementCharacters) {
  std::vector<std::string> names;
  const auto vocabs = present_vocabs(&names);
  if (vocabs.empty()) GTEST_SKIP();
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string bad, as_read;
  };
  const Case cases[] = {
      {"abc\xFF" "def", "abc" + fffd + "def"},
      {"\x80\x80 lone continuation bytes", fffd + fffd + " lone continuation bytes"},
      {"truncated \xE2\x82", "truncated " + fffd + fffd},
      {"cut \xE2\x82" "A here", "cut " + fffd + fffd + "A here"},
      {"overlong \xC0\xAF", "overlong " + fffd + fffd},
      {"surrogate \xED\xA0\x80!", "surrogate " + fffd + fffd + fffd + "!"},
      {"too big \xF4\x90\x80\x80", "too big " + fffd + fffd + fffd + fffd},
      {std::string("nul \0 inside", 12), std::string("nul \0 inside", 12)},
  };
  for (size_t v = 0; v < vocabs.size(); ++v) {
    for (const Case& c : cases) {
      std::vector<TokenId> bad, good;
      ASSERT_NO_THROW(bad = vocabs[v]->encode(c.bad)) << names[v];
      good = vocabs[v]->encode(c.as_read);
      EXPECT_EQ(bad, good) << names[v] << ": '" << test::printable(c.bad) << "'";
    }
  }
}

TEST(TokenizerBadInput, EmptyText) {
  std::vector<std::string> names;
  const auto vocabs = present_vocabs(&names);
  if (vocabs.empty()) GTEST_SKIP();
  for (size_t v = 0; v < vocabs.size(); ++v) {
    const Vocab& vocab = *vocabs[v];
    EXPECT_TRUE(vocab.encode("", {.add_special = false}).empty()) << names[v];
    std::vector<TokenId> with_special;
    if (vocab.add_bos()) with_special.push_back(vocab.special().bos);
    if (vocab.add_eos()) with_special.push_back(vocab.special().eos);
    if (vocab.add_sep()) with_special.push_back(vocab.special().sep);
    EXPECT_EQ(vocab.encode(""), with_special) << names[v];
    EXPECT_EQ(vocab.decode({}), "");
    StreamingDetokenizer d(vocab);
    EXPECT_EQ(d.flush(), "");
  }
}

TEST(TokenizerBadInput, SpecialTokenTextIsTextUnlessAskedFor) {
  if (!std::filesystem::exists(test::vocab_path("llama-spm")) || !std::filesystem::exists(test::vocab_path("gpt-2"))) {
    GTEST_SKIP();
  }
  const Vocab spm = Vocab::from_file(test::vocab_path("llama-spm").string());
  EXPECT_EQ(spm.encode("<s>Hi</s>", {.add_special = false, .parse_special = true}),
            (std::vector<TokenId>{1, 6324, 2}));  // <s> ▁Hi </s>: the space prefix follows a special token
  const auto as_text = spm.encode("<s>Hi</s>", {.add_special = false, .parse_special = false});
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 1), 0);
  EXPECT_EQ(spm.decode(as_text), "<s>Hi</s>");

  const Vocab bpe = Vocab::from_file(test::vocab_path("gpt-2").string());
  EXPECT_EQ(bpe.encode("a<|endoftext|>b", {.parse_special = true}), (std::vector<TokenId>{64, 50256, 65}));
  EXPECT_GT(bpe.encode("a<|endoftext|>b", {.parse_special = false}).size(), 3u);
  // Overlapping and repeated special text.
  EXPECT_EQ(bpe.encode("<|endoftext|><|endoftext|>", {.parse_special = true}), (std::vector<TokenId>{50256, 50256}));
  EXPECT_EQ(bpe.encode("<|endoftext|endoftext|>", {.parse_special = true}),
            bpe.encode("<|endoftext|endoftext|>", {.parse_special = false}));
}

TEST(TokenizerBadInput, UserDefinedTokensAreAlwaysMatchedWhole) {
  if (!std::filesystem::exists(test::vocab_path("mpt"))) GTEST_SKIP();
  // The neox vocabulary has runs of spaces as user-defined tokens.
  const Vocab mpt = Vocab::from_file(test::vocab_path("mpt").string());
  const TokenId three_spaces = *mpt.find("   ");
  const auto ids = mpt.encode("a   b", {.parse_special = false});
  EXPECT_NE(std::find(ids.begin(), ids.end(), three_spaces), ids.end());
}

// Megabyte inputs of every shape that could make a tokenizer quadratic must
// finish in seconds (a quadratic one takes hours), for every vocabulary, and
// give the text back.
TEST(TokenizerBadInput, MegabyteStringsStayFast) {
  std::vector<std::string> names;
  const auto vocabs = present_vocabs(&names);
  if (vocabs.empty()) GTEST_SKIP();
  std::mt19937 rng(1);
  std::string random_bytes(1 << 20, '\0');
  for (char& c : random_bytes) c = static_cast<char>(rng());
  const std::pair<const char*, std::string> inputs[] = {
      {"one 1 MiB word", repeat("a", 1 << 20)},
      {"1 MiB of spaces", repeat(" ", 1 << 20)},
      {"spaces then a control character", repeat(" ", 1 << 20) + "\x01"},
      {"1 MiB of newlines", repeat("\n", 1 << 20)},
      {"1 MiB of digits", repeat("1234567890", 1 << 20)},
      {"1 MiB of one CJK character", repeat("我", 1 << 20)},
      {"1 MiB of an emoji", repeat("🦙", 1 << 20)},
      {"1 MiB of punctuation", repeat("!?.,", 1 << 20)},
      {"1 MiB of special token text", repeat("<s><|endoftext|>", 1 << 20)},
      {"1 MiB of random bytes", random_bytes},
  };
  for (size_t v = 0; v < vocabs.size(); ++v) {
    for (const auto& [what, text] : inputs) {
      const double t0 = thread_cpu_seconds();
      std::vector<TokenId> ids;
      ASSERT_NO_THROW(ids = vocabs[v]->encode(text, {.add_special = false, .parse_special = true})) << names[v] << ": " << what;
      const double encode_s = thread_cpu_seconds() - t0;
      EXPECT_LT(encode_s, 10.0) << names[v] << ": " << what;
      // (WordPiece drops whitespace and control characters entirely.)
      if (vocabs[v]->kind() != VocabKind::kWpm) {
        EXPECT_FALSE(ids.empty()) << names[v] << ": " << what;
      }
      if (std::getenv("M40_TOKENIZER_TIMES") != nullptr) std::printf("%-14s %-34s %6.3f s\n", names[v].c_str(), what, encode_s);
      if (text == random_bytes) continue;  // not text: replaced characters do not come back
      if (vocabs[v]->kind() == VocabKind::kWpm) continue;  // WordPiece normalizes the text
      // SPM puts its space prefix after each special token.
      if (vocabs[v]->kind() == VocabKind::kSpm && text.find("<s>") != std::string::npos) continue;
      std::string back;
      StreamingDetokenizer d(*vocabs[v], {.render_special = true, .sequence_start = true});
      for (TokenId id : ids) d.push(id, back);
      d.flush(back);
      EXPECT_TRUE(back == text) << names[v] << ": " << what << " does not come back";
    }
  }
}

// Every flavour of the table, not only the ones with test vocabularies.
TEST(TokenizerBadInput, EveryPreTokenizerFlavourIsLinearOnMegabyteStrings) {
  const std::string inputs[] = {
      repeat("a", 1 << 20),       repeat("A", 1 << 20),           repeat("aB", 1 << 20), repeat(" ", 1 << 20) + "\x01",
      repeat("\r\n", 1 << 20),    repeat("1", 1 << 20),           repeat("我", 1 << 20), repeat("é", 1 << 20),
      repeat(" \t", 1 << 20) + "x", repeat("'s", 1 << 20),
  };
  for (const auto& flavour : pre_tokenizer_flavours()) {
    PreTokenizer pre(flavour);
    for (const std::string& text : inputs) {
      const double t0 = thread_cpu_seconds();
      std::vector<Span> words;
      ASSERT_NO_THROW(pre.split(text, words)) << flavour.name;
      EXPECT_LT(thread_cpu_seconds() - t0, 5.0) << flavour.name << " on '" << test::printable(text.substr(0, 8)) << "...'";
      ASSERT_FALSE(words.empty());
      EXPECT_EQ(words.back().end, text.size());
    }
  }
}

// The merge loop has two implementations (array rescan for short words, a
// priority queue for long ones); they must agree everywhere.
TEST(TokenizerBadInput, ShortAndLongWordMergesAgree) {
  std::vector<std::string> names;
  const auto vocabs = present_vocabs(&names);
  if (vocabs.empty()) GTEST_SKIP();
  std::vector<std::string> texts;
  for (const auto& c : test::read_vocab_cases("llama-spm")) texts.push_back(c.text);
  std::mt19937 rng(5);
  const std::string alphabet[] = {"a", "b", "e", "r", "t", " ", "th", "ing", "é", "я", "我", "🦙", "\n", "1", "'s"};
  for (int i = 0; i < 200; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 60);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % std::size(alphabet)];
    texts.push_back(s);
  }
  const size_t saved = linear_merge_limit();
  for (size_t v = 0; v < vocabs.size(); ++v) {
    for (const std::string& t : texts) {
      linear_merge_limit() = saved;
      const auto a = vocabs[v]->encode(t);
      linear_merge_limit() = 0;  // always the priority queue
      const auto b = vocabs[v]->encode(t);
      linear_merge_limit() = 1000;  // always the array
      const auto c = vocabs[v]->encode(t);
      EXPECT_EQ(a, b) << names[v] << ": '" << test::printable(t) << "'";
      EXPECT_EQ(a, c) << names[v] << ": '" << test::printable(t) << "'";
    }
  }
  linear_merge_limit() = saved;
}

}  // namespace
}  // namespace m40::tokenizer

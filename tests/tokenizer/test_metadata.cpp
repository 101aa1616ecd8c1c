// Vocabularies built in the test from metadata: hand-checkable SPM and BPE
// merges, llama.cpp's defaults, and malformed metadata refused with a clear
// message instead of a crash.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf/metadata.h"
#include "tokenizer/vocab.h"

namespace m40::tokenizer {
namespace {

using gguf::Array;
using gguf::Metadata;
using gguf::Value;
using gguf::ValueType;

Array strings(const std::vector<std::string>& items) {
  Array a{ValueType::STRING, {}};
  for (const auto& s : items) a.items.emplace_back(s);
  return a;
}
Array floats(const std::vector<float>& items) {
  Array a{ValueType::FLOAT32, {}};
  for (float f : items) a.items.emplace_back(f);
  return a;
}
Array ints(const std::vector<int32_t>& items) {
  Array a{ValueType::INT32, {}};
  for (int32_t i : items) a.items.emplace_back(i);
  return a;
}

// <unk> <s> </s> ▁ a b c ab bc ▁a ▁ab abc
Metadata tiny_spm() {
  Metadata md;
  md.set("tokenizer.ggml.model", "llama");
  md.set("tokenizer.ggml.tokens", strings({"<unk>", "<s>", "</s>", "▁", "a", "b", "c", "ab", "bc", "▁a", "▁ab", "abc"}));
  md.set("tokenizer.ggml.scores", floats({0, 0, 0, -1, -2, -2, -2, -3, -1, -4, -5, -6}));
  md.set("tokenizer.ggml.token_type", ints({2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  return md;
}

TEST(TokenizerMetadata, SpmMergesTheBestScoringPairFirst) {
  const Vocab v = Vocab::from_metadata(tiny_spm());
  EXPECT_EQ(v.kind(), VocabKind::kSpm);
  EXPECT_EQ(v.special().bos, 1);  // llama.cpp's defaults: BOS 1, EOS 2, UNK 0
  EXPECT_EQ(v.special().eos, 2);
  EXPECT_EQ(v.special().unk, 0);
  // "▁abc": bc (-1) beats ab (-3) and ▁a (-4): ▁a + bc ... "▁abc" is no token.
  EXPECT_EQ(v.encode("abc", {.add_special = false}), (std::vector<TokenId>{9, 8}));
  // "▁ab": ▁a (-4) before ab (-3)? ab scores higher: ▁ + ab, then ▁ab.
  EXPECT_EQ(v.encode("ab", {.add_special = false}), (std::vector<TokenId>{10}));
  // No byte tokens: a character outside the vocabulary is one UNK.
  EXPECT_EQ(v.encode("a\xC3\xA9", {.add_special = false}), (std::vector<TokenId>{9, 0}));
  EXPECT_EQ(v.encode("a"), (std::vector<TokenId>{1, 9}));
}

TEST(TokenizerMetadata, SpmEqualScoresMergeLeftmostFirst) {
  Metadata md = tiny_spm();
  md.set("tokenizer.ggml.tokens", strings({"<unk>", "<s>", "</s>", "▁", "a", "b", "c", "ab", "bc", "▁a", "▁ab", "xyz"}));
  md.set("tokenizer.ggml.scores", floats({0, 0, 0, -1, -2, -2, -2, -3, -3, -9, -9, -9}));
  // "abc" without the space prefix: ab and bc tie; ab is left: ab + c.
  md.set("tokenizer.ggml.add_space_prefix", false);
  const Vocab no_prefix = Vocab::from_metadata(md);
  EXPECT_EQ(no_prefix.encode("abc", {.add_special = false}), (std::vector<TokenId>{7, 6}));
  EXPECT_FALSE(no_prefix.add_space_prefix());
}

// Byte-level BPE over "a", "b", "c", "Ġ" (space) with merges a+b, ab+c, Ġ+a.
Metadata tiny_bpe() {
  Metadata md;
  md.set("tokenizer.ggml.model", "gpt2");
  md.set("tokenizer.ggml.pre", "gpt-2");
  md.set("tokenizer.ggml.tokens", strings({"a", "b", "c", "Ġ", "ab", "abc", "Ġa", "<|endoftext|>"}));
  md.set("tokenizer.ggml.token_type", ints({1, 1, 1, 1, 1, 1, 1, 3}));
  md.set("tokenizer.ggml.merges", strings({"a b", "ab c", "Ġ a", "malformed"}));
  return md;
}

TEST(TokenizerMetadata, BpeMergesByRank) {
  const Vocab v = Vocab::from_metadata(tiny_bpe());
  EXPECT_EQ(v.kind(), VocabKind::kBpe);
  EXPECT_EQ(v.merge_count(), 4u);
  // "abc": a+b (rank 0), then ab+c. " ab": a+b ranks before Ġ+a, and Ġ+ab is no merge.
  EXPECT_EQ(v.encode("abc ab"), (std::vector<TokenId>{5, 3, 4}));
  EXPECT_EQ(v.special().bos, kNoToken);  // the default 11 is outside this vocabulary
  EXPECT_EQ(v.special().eot, 7);         // found by name
  EXPECT_TRUE(v.is_end_of_generation(7));
  EXPECT_EQ(v.encode("a<|endoftext|>", {.parse_special = true}), (std::vector<TokenId>{0, 7}));
  EXPECT_EQ(v.decode(std::vector<TokenId>{5, 3, 4}), "abc ab");
}

void expect_error(const Metadata& md, const std::string& fragment) {
  try {
    Vocab::from_metadata(md);
    ADD_FAILURE() << "loaded; expected an error mentioning '" << fragment << "'";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(TokenizerMetadata, MalformedVocabulariesAreRefused) {
  Metadata md = tiny_spm();
  md.erase("tokenizer.ggml.tokens");
  expect_error(md, "tokenizer.ggml.tokens");

  md = tiny_spm();
  md.set("tokenizer.ggml.tokens", Value("not an array"));
  expect_error(md, "tokenizer.ggml.tokens");

  md = tiny_spm();
  md.set("tokenizer.ggml.tokens", ints({1, 2, 3}));
  expect_error(md, "tokenizer.ggml.tokens");

  md = tiny_spm();
  md.set("tokenizer.ggml.tokens", strings({"a", "b", "a"}));
  md.erase("tokenizer.ggml.scores");
  md.erase("tokenizer.ggml.token_type");
  expect_error(md, "duplicate token");

  md = tiny_spm();
  md.set("tokenizer.ggml.scores", floats({0, 0}));
  expect_error(md, "tokenizer.ggml.scores");

  md = tiny_spm();
  md.set("tokenizer.ggml.token_type", strings({"x"}));
  expect_error(md, "tokenizer.ggml.token_type");

  md = tiny_spm();
  md.set("tokenizer.ggml.model", Value(int32_t{3}));
  expect_error(md, "tokenizer.ggml.model");

  md = tiny_bpe();
  md.erase("tokenizer.ggml.merges");
  expect_error(md, "tokenizer.ggml.merges");

  md = tiny_bpe();
  md.set("tokenizer.ggml.add_bos_token", true);  // and no BOS in range
  expect_error(md, "BOS");

  md = tiny_spm();
  md.set("tokenizer.ggml.model", "t5");
  expect_error(md, "not supported yet");
}

TEST(TokenizerMetadata, OutOfRangeSpecialIdsAreIgnoredWithAWarning) {
  Metadata md = tiny_spm();
  md.set("tokenizer.ggml.eos_token_id", Value(uint32_t{999}));
  md.set("tokenizer.ggml.padding_token_id", Value(uint32_t{3}));
  const Vocab v = Vocab::from_metadata(md);
  EXPECT_EQ(v.special().eos, 2);  // the default stays
  EXPECT_EQ(v.special().pad, 3);
  ASSERT_EQ(v.warnings().size(), 1u);
  EXPECT_NE(v.warnings()[0].find("eos_token_id"), std::string::npos);
}

TEST(TokenizerMetadata, EmptyTokensGetPlaceholders) {
  Metadata md = tiny_spm();
  md.set("tokenizer.ggml.tokens", strings({"<unk>", "<s>", "</s>", "", "a", "b", "c", "ab", "bc", "▁a", "▁ab", "abc"}));
  const Vocab v = Vocab::from_metadata(md);
  EXPECT_EQ(v.text(3), "[EMPTY_3]");
}

}  // namespace
}  // namespace m40::tokenizer

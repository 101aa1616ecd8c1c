// Token ids -> text: pieces, llama.cpp's batch decode, and the streaming
// detokenizer, which must never emit a broken UTF-8 sequence.
#include <gtest/gtest.h>

#include <filesystem>

#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"
#include "vocab_test_files.h"

namespace m40::tokenizer {
namespace {

class TokenizerDecode : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::exists(test::vocab_path("llama-spm"))) {
      spm_ = new Vocab(Vocab::from_file(test::vocab_path("llama-spm").string()));
    }
    if (std::filesystem::exists(test::vocab_path("gpt-2"))) {
      bpe_ = new Vocab(Vocab::from_file(test::vocab_path("gpt-2").string()));
    }
  }
  static void TearDownTestSuite() {
    delete spm_;
    delete bpe_;
    spm_ = bpe_ = nullptr;
  }
  void SetUp() override {
    if (spm_ == nullptr || bpe_ == nullptr) GTEST_SKIP() << "llama-spm and gpt-2 vocabularies needed";
  }
  static const Vocab& spm() { return *spm_; }
  static const Vocab& bpe() { return *bpe_; }

  // Pushes ids one by one; every chunk must be whole UTF-8.
  static std::string stream(const Vocab& v, const std::vector<TokenId>& ids, StreamingDetokenizer::Options o = {}) {
    StreamingDetokenizer d(v, o);
    std::string all;
    for (TokenId id : ids) {
      const std::string chunk = d.push(id);
      EXPECT_TRUE(utf8::is_valid(chunk)) << "broken UTF-8 emitted after token " << id;
      all += chunk;
    }
    const std::string tail = d.flush();
    EXPECT_TRUE(utf8::is_valid(tail));
    return all + tail;
  }

 private:
  static inline Vocab* spm_ = nullptr;
  static inline Vocab* bpe_ = nullptr;
};

TEST_F(TokenizerDecode, PiecesOfSpmTokens) {
  EXPECT_EQ(spm().piece(15043), " Hello");  // ▁Hello
  EXPECT_EQ(spm().piece(13), "\n");         // <0x0A>
  EXPECT_EQ(spm().piece(243), "\xF0");      // <0xF0>: a byte, not a character
  EXPECT_EQ(spm().piece(1), "");            // <s>: control
  EXPECT_EQ(spm().piece(1, true), "<s>");
  EXPECT_EQ(spm().piece(0, true), "<unk>");
}

TEST_F(TokenizerDecode, PiecesOfByteLevelTokens) {
  EXPECT_EQ(bpe().piece(198), "\n");                // Ċ
  EXPECT_EQ(bpe().piece(*bpe().find("Ġworld")), " world");
  EXPECT_EQ(bpe().piece(*bpe().find("Ã©")), "\xC3\xA9");  // é
  EXPECT_EQ(bpe().piece(50256), "");
  EXPECT_EQ(bpe().piece(50256, true), "<|endoftext|>");
}

TEST_F(TokenizerDecode, SpmLeadingSpaceAsLlamaCpp) {
  // Without BOS the space the tokenizer put before the first word goes; after
  // a BOS llama_detokenize keeps it (and so does the reference full_text).
  EXPECT_EQ(spm().decode(std::vector<TokenId>{15043, 3186}), "Hello world");
  EXPECT_EQ(spm().decode(std::vector<TokenId>{1, 15043, 3186}), " Hello world");
  EXPECT_EQ(spm().decode(std::vector<TokenId>{1, 15043, 3186}, {.remove_special = true}), " Hello world");
  EXPECT_EQ(spm().decode(std::vector<TokenId>{1, 15043}, {.render_special = true}), "<s> Hello");
  EXPECT_EQ(spm().decode(std::vector<TokenId>{}), "");
}

TEST_F(TokenizerDecode, BpeCleansSpacesAroundPunctuation) {
  const std::string text = "Hello , world ! It 's ' quoted ' , isn 't it ?";
  const auto ids = bpe().encode(text);
  EXPECT_EQ(bpe().decode(ids), "Hello, world! It's'quoted ', isn 't it?");
  EXPECT_EQ(stream(bpe(), ids), text);  // streaming text is the pieces as they are
}

TEST_F(TokenizerDecode, StreamingHoldsBackACharacterSplitAcrossTokens) {
  // 🦙 is not in the Llama vocabulary: ▁ and four byte tokens.
  const auto ids = spm().encode("🦙", {.add_special = false});
  ASSERT_EQ(ids, (std::vector<TokenId>{29871, 243, 162, 169, 156}));
  StreamingDetokenizer d(spm());
  EXPECT_EQ(d.push(ids[0]), "");  // the leading space of the sequence
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  EXPECT_EQ(d.push(ids[2]), "");
  EXPECT_EQ(d.push(ids[3]), "");
  EXPECT_EQ(d.push(ids[4]), "🦙");
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_EQ(d.flush(), "");
}

TEST_F(TokenizerDecode, StreamingByteLevelBpe) {
  for (const std::string text : {"🦙 llamas", "Äpfel, Führer, 我想在apple工作, ✅", "\xE0\xB8\x81\xE0\xB8\xB2"}) {
    EXPECT_EQ(stream(bpe(), bpe().encode(text)), text);
  }
}

TEST_F(TokenizerDecode, StreamingLeadingSpace) {
  const std::vector<TokenId> hello{1, 15043, 3186};  // <s> ▁Hello ▁world
  EXPECT_EQ(stream(spm(), hello), "Hello world");     // dropped after BOS too
  EXPECT_EQ(stream(spm(), {15043, 3186}), "Hello world");
  EXPECT_EQ(stream(spm(), {15043, 3186}, {.sequence_start = false}), " Hello world");  // a continuation
  EXPECT_EQ(stream(spm(), hello, {.render_special = true}), "<s>Hello world");
  EXPECT_EQ(stream(bpe(), bpe().encode(" Hello")), " Hello");  // byte-level BPE adds no space
}

TEST_F(TokenizerDecode, StreamingReplacesBytesThatCanNeverFormACharacter) {
  const TokenId xff = *spm().find("<0xFF>");
  const TokenId xe2 = *spm().find("<0xE2>");
  const TokenId x82 = *spm().find("<0x82>");
  const TokenId a = *spm().find("A");
  StreamingDetokenizer d(spm(), {.sequence_start = false});
  EXPECT_EQ(d.push(xff), "\xEF\xBF\xBD");  // at once: 0xFF starts nothing
  EXPECT_EQ(d.push(xe2), "");
  EXPECT_EQ(d.push(x82), "");
  EXPECT_EQ(d.push(a), "\xEF\xBF\xBD\xEF\xBF\xBD" "A");  // E2 82 41 is no character
  EXPECT_EQ(d.push(xe2), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");  // an unfinished character at the end
  d.reset();
  EXPECT_EQ(d.push(*spm().find("<0xED>")), "");
  EXPECT_EQ(d.push(*spm().find("<0xA0>")), "\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: never valid
}

TEST_F(TokenizerDecode, OutOfRangeIdsAreClearErrors) {
  const TokenId n = static_cast<TokenId>(spm().size());
  for (TokenId bad : {-1, n, n + 1000, INT32_MAX}) {
    EXPECT_THROW(spm().piece(bad), TokenizerError) << bad;
    EXPECT_THROW(spm().decode(std::vector<TokenId>{15043, bad}), TokenizerError) << bad;
    EXPECT_THROW(spm().text(bad), TokenizerError) << bad;
  }
  try {
    spm().piece(n);
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("32000"), std::string::npos) << e.what();
  }
  StreamingDetokenizer d(spm(), {.sequence_start = false});
  EXPECT_EQ(d.push(243), "");
  EXPECT_THROW(d.push(n), TokenizerError);
  EXPECT_EQ(d.pending_bytes(), 1u);  // unchanged by the bad id
  EXPECT_FALSE(spm().is_end_of_generation(-5));
}

}  // namespace
}  // namespace m40::tokenizer

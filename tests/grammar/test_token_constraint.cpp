// Token masks on small synthetic vocabularies: every mask equals the
// brute-force answer (each token's bytes fed to the reference matcher),
// characters split across tokens, end-of-generation, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "grammar/token_constraint.h"
#include "grammar_test_util.h"

namespace m40::grammar {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Every string of 1 to 3 symbols from `alphabet`, then `extra`, then one
// control token (empty piece) and one end-of-generation token.
std::shared_ptr<const TokenVocabulary> combinations(const std::vector<std::string>& alphabet,
                                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> pieces;
  for (const auto& a : alphabet) {
    pieces.push_back(a);
    for (const auto& b : alphabet) {
      pieces.push_back(a + b);
      for (const auto& c : alphabet) pieces.push_back(a + b + c);
    }
  }
  pieces.insert(pieces.end(), extra.begin(), extra.end());
  pieces.push_back("");  // a control token
  pieces.push_back("");  // end of generation
  const auto eog = static_cast<int32_t>(pieces.size() - 1);
  return std::make_shared<TokenVocabulary>(std::move(pieces), std::vector<int32_t>{eog});
}

int32_t token_of(const TokenVocabulary& vocab, const std::string& piece) {
  for (size_t t = 0; t < vocab.size(); ++t) {
    if (vocab.piece(static_cast<int32_t>(t)) == piece) return static_cast<int32_t>(t);
  }
  throw std::logic_error("no token " + piece);
}

std::vector<bool> mask_of(TokenConstraint& c, size_t n) {
  std::vector<float> logits(n, 1.0f);
  c.mask(logits);
  std::vector<bool> allowed(n);
  for (size_t t = 0; t < n; ++t) {
    EXPECT_TRUE(logits[t] == 1.0f || logits[t] == kNegInf) << "a mask only writes -inf";
    allowed[t] = logits[t] == 1.0f;
  }
  return allowed;
}

// Random walks through the grammar; at every step the mask must equal the
// brute-force reference and allows() must agree with it.
void check_against_reference(const std::string& gbnf, const std::shared_ptr<const TokenVocabulary>& vocab,
                             int walks, int steps, uint32_t seed) {
  auto g = parse_gbnf(gbnf);
  std::mt19937 rng(seed);
  for (int w = 0; w < walks; ++w) {
    TokenConstraint c(g, vocab);
    test::ReferenceMatcher ref(*g);
    std::string text;
    for (int s = 0; s < steps; ++s) {
      const std::vector<bool> got = mask_of(c, vocab->size());
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < vocab->size(); ++t) {
        const auto id = static_cast<int32_t>(t);
        const bool want = vocab->is_end_of_generation(id) ? ref.can_end()
                                                          : !vocab->piece(id).empty() && ref.accepts(vocab->piece(id));
        ASSERT_EQ(got[t], want) << "token " << t << " '" << vocab->piece(id) << "' after '" << text << "' in\n" << gbnf;
        ASSERT_EQ(c.allows(id), want);
        if (want) allowed.push_back(id);
      }
      ASSERT_EQ(c.can_end(), ref.can_end());
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      c.accept(pick);
      if (vocab->is_end_of_generation(pick)) {
        EXPECT_TRUE(c.finished());
        break;
      }
      ref.advance(vocab->piece(pick));
      text += vocab->piece(pick);
    }
  }
}

TEST(TokenConstraint, MasksEqualBruteForceForArithmetic) {
  check_against_reference(R"g(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num ::= [0-9]+)g",
                          combinations({"1", "2", "+", "-", "(", ")", "x"}), 30, 25, 1);
}

TEST(TokenConstraint, MasksEqualBruteForceForJsonLikeNesting) {
  check_against_reference(json_object_gbnf(), combinations({"{", "}", "[", "]", "\"", ":", ",", " ", "a", "1", "\\", "n"}), 25, 30, 2);
}

TEST(TokenConstraint, MasksEqualBruteForceForCharactersSplitAcrossTokens) {
  // Bytes of é (C3 A9) and 世 (E4 B8 96) as separate tokens, whole, and mixed.
  check_against_reference(R"(root ::= ([a-z] | [é世])+ "!"?)",
                          combinations({"\xC3", "\xA9", "\xE4", "\xB8", "\x96", "a", "!"}, {"é", "世", "é!", "\xA9!"}), 30, 20,
                          3);
}

TEST(TokenConstraint, MasksEqualBruteForceWhenRulesEndInsideTokens) {
  // Rules called (not inlined: recursive or long) end in the middle of tokens.
  check_against_reference(R"(root ::= item ("," item)*
item ::= word | "[" root "]"
word ::= [a-c]+ ws
ws ::= [ ]*)",
                          combinations({"a", "b", ",", "[", "]", " "}), 30, 25, 4);
}

// Long bounded repetitions run as counted loops: one set of states for
// every count. The reference runs the same grammars with every copy written
// out.
TEST(TokenConstraint, MasksEqualBruteForceInCountedLoops) {
  const auto vocab = combinations({"a", "b", "\"", ",", "\\", "n", "\xC3", "\xA9"},
                                  {"é", "abababab", std::string(20, 'a'), std::string(40, 'b')});
  const char* grammars[] = {
      // A JSON-like string of at most 40 characters.
      R"g(root ::= "\"" ([ab,n] | "\\" [n\\] | [é]){0,40} "\"")g",
      // At least 3 and at most 45.
      R"g(root ::= "\"" [abn]{3,45} "\"")g",
      // Two loops in one rule, and a loop inside a repetition.
      R"g(root ::= [a]{0,36} "," [b]{0,35} ("\"" [ab]{0,39} "\"")* ","?)g",
      // A loop that cannot have the frame's counter and is too long to copy:
      // a rule of its own.
      R"g(root ::= ("\"" [ab]{0,5000} "\"" ",")* "n")g",
      // A loop in a called, recursive rule.
      R"g(root ::= item
item ::= "n" | "\"" [ab]{1,40} "\"" ("," item)?)g",
  };
  uint32_t seed = 5;
  for (const char* g : grammars) {
    ASSERT_FALSE(parse_gbnf(g)->automaton().loops.empty()) << "no counted loop to test in " << g;
    check_against_reference(g, vocab, 30, 40, seed++);
  }
}

TEST(TokenConstraint, CountedLoopBoundsAreExact) {
  const auto vocab = combinations({"x", "y"}, {std::string(17, 'x'), std::string(40, 'x'), std::string(41, 'x')});
  auto g = parse_gbnf(R"(root ::= "x"{0,40} "y")");
  ASSERT_EQ(g->automaton().loops.size(), 1u);
  for (int prefix = 0; prefix <= 41; ++prefix) {
    TokenConstraint c(g, vocab);
    bool ok = true;
    for (int i = 0; i < prefix && ok; ++i) {
      ok = c.allows(0);
      if (ok) c.accept(0);  // "x"
    }
    EXPECT_EQ(ok, prefix <= 40) << prefix;
    if (!ok) continue;
    const int32_t x17 = token_of(*vocab, std::string(17, 'x'));
    const int32_t x40 = token_of(*vocab, std::string(40, 'x'));
    const int32_t x41 = token_of(*vocab, std::string(41, 'x'));
    const std::vector<bool> allowed = mask_of(c, vocab->size());
    EXPECT_EQ(allowed[x17], prefix + 17 <= 40) << prefix;
    EXPECT_EQ(allowed[x40], prefix == 0) << prefix;
    EXPECT_FALSE(allowed[x41]) << prefix;
    EXPECT_EQ(allowed[token_of(*vocab, "xy")], prefix < 40) << prefix;
    EXPECT_TRUE(allowed[token_of(*vocab, "y")]) << prefix;
  }
}

TEST(TokenConstraint, PartialCharacterTokens) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"\xC3", "\xA9", "!", "é", ""}, std::vector<int32_t>{4});
  TokenConstraint c(parse_gbnf(R"(root ::= "é" "!")"), vocab);
  EXPECT_TRUE(c.allows(0));
  EXPECT_FALSE(c.allows(1));  // a continuation byte cannot start
  EXPECT_TRUE(c.allows(3));
  c.accept(0);
  EXPECT_TRUE(c.allows(1));
  EXPECT_FALSE(c.allows(3));  // é again would not fit after its own first byte
  c.accept(1);
  EXPECT_FALSE(c.can_end());
  EXPECT_FALSE(c.allows(4));
  c.accept(2);
  EXPECT_TRUE(c.can_end());
  EXPECT_TRUE(c.finished());
  EXPECT_TRUE(c.allows(4));
}

TEST(TokenConstraint, EndOfGenerationOnlyWhenComplete) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"a", "b", ""}, std::vector<int32_t>{2});
  TokenConstraint c(parse_gbnf(R"(root ::= "a"+ "b"?)"), vocab);
  EXPECT_FALSE(c.allows(2));
  EXPECT_THROW(c.accept(2), GrammarError);
  c.accept(0);
  EXPECT_TRUE(c.allows(2));
  EXPECT_TRUE(c.can_end());
  EXPECT_FALSE(c.finished());
  c.accept(2);
  EXPECT_TRUE(c.finished());
  const std::vector<bool> after = mask_of(c, 3);
  EXPECT_EQ(after, (std::vector<bool>{false, false, true}));  // only end of generation is left
}

TEST(TokenConstraint, RefusedTokenThrowsNamingIt) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"a", "b\n", ""}, std::vector<int32_t>{2});
  TokenConstraint c(parse_gbnf(R"(root ::= "a")"), vocab);
  try {
    c.accept(1);
    FAIL() << "accepted a token the grammar refuses";
  } catch (const GrammarError& e) {
    EXPECT_STREQ(e.what(), "token 1 (\"b\\n\") is not allowed by the grammar here");
  }
  EXPECT_THROW(c.accept(7), GrammarError);  // outside the vocabulary
  c.accept(0);                              // the failed accepts changed nothing
  EXPECT_TRUE(c.finished());
}

TEST(TokenConstraint, ControlTokensAreNeverAllowed) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"a", "", ""}, std::vector<int32_t>{2});
  TokenConstraint c(parse_gbnf(R"(root ::= "a"*)"), vocab);
  EXPECT_EQ(mask_of(c, 3), (std::vector<bool>{true, false, true}));
  EXPECT_FALSE(c.allows(1));
  EXPECT_THROW(c.accept(1), GrammarError);
}

TEST(TokenConstraint, LogitsPastTheVocabularyAreMasked) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"a", "b", ""}, std::vector<int32_t>{2});
  TokenConstraint c(parse_gbnf(R"(root ::= "a")"), vocab);
  std::vector<float> logits(70, 0.5f);  // a model with padded output rows
  c.mask(logits);
  EXPECT_EQ(logits[0], 0.5f);
  EXPECT_EQ(logits[1], kNegInf);
  for (size_t t = 3; t < logits.size(); ++t) EXPECT_EQ(logits[t], kNegInf) << t;
  std::vector<float> short_logits(2);
  EXPECT_THROW(c.mask(short_logits), GrammarError);
}

TEST(TokenConstraint, SameGrammarTextSharesTablesButNotState) {
  auto vocab = combinations({"a", "b"});
  auto g1 = parse_gbnf(R"(root ::= "a" "b"*)");
  auto g2 = parse_gbnf(R"(root ::= "a" "b"*)");
  TokenConstraint c1(g1, vocab), c2(g2, vocab);
  c1.accept(0);  // "a"
  EXPECT_FALSE(c1.allows(0));  // no second "a"
  EXPECT_TRUE(c2.allows(0));   // c2 is still at the start
  EXPECT_TRUE(c1.can_end());
  EXPECT_FALSE(c2.can_end());
}

TEST(TokenConstraint, LongGenerationsStayCorrect) {
  // Nesting 30000 deep creates more distinct stacks than the sequence keeps
  // before rebuilding its store around the current one.
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"(", ")", "x", "(x", ""}, std::vector<int32_t>{4});
  TokenConstraint c(parse_gbnf(R"g(root ::= "(" root ")" | "x")g"), vocab);
  const int depth = 30000;
  for (int i = 0; i < depth; ++i) c.accept(0);
  EXPECT_TRUE(c.allows(2));
  EXPECT_FALSE(c.allows(1));
  c.accept(3);  // "(x"
  for (int i = 0; i < depth; ++i) {
    ASSERT_TRUE(c.allows(1)) << i;
    ASSERT_FALSE(c.allows(4)) << i;
    c.accept(1);
  }
  EXPECT_FALSE(c.can_end());  // one more ")" for the "(" of "(x"
  c.accept(1);
  EXPECT_TRUE(c.finished());
}

TEST(TokenConstraint, SequencesOnManyThreadsShareOneGrammar) {
  // The grammar, the vocabulary and the per-state tables they build on first
  // use are shared; every thread must see the masks one thread alone sees.
  const auto vocab = combinations({"{", "}", "\"", ":", ",", " ", "a", "1", "[", "]"});
  const std::string gbnf = json_object_gbnf();
  const std::string doc = R"({"a": [1, {"aa": "1"}], "1": "a a"})";
  auto run = [&](std::shared_ptr<const Grammar> g) {
    std::vector<std::vector<uint64_t>> masks;
    TokenConstraint c(std::move(g), vocab);
    for (char ch : doc) {
      const auto bits = c.allowed_bits();
      masks.emplace_back(bits.begin(), bits.end());
      c.accept(token_of(*vocab, std::string(1, ch)));
    }
    return masks;
  };
  const auto expected = run(parse_gbnf(gbnf));
  auto shared = parse_gbnf(gbnf + "# a new text: new tables, built by the threads below\n");
  std::vector<std::vector<std::vector<uint64_t>>> results(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) threads.emplace_back([&, i] { results[i] = run(shared); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, expected);
}

TEST(TokenConstraint, AllowedBitsAreWhatMaskApplies) {
  auto vocab = combinations({"a", "b", "c"});
  TokenConstraint c(parse_gbnf(R"(root ::= "ab" [bc]*)"), vocab);
  const std::vector<bool> allowed = mask_of(c, vocab->size());
  const auto bits = c.allowed_bits();
  for (size_t t = 0; t < vocab->size(); ++t) EXPECT_EQ(((bits[t / 64] >> (t % 64)) & 1) != 0, allowed[t]) << t;
}

}  // namespace
}  // namespace m40::grammar

// The matcher: text fed in pieces (as tokens come), characters split across
// pieces, when the text may end, and agreement with the plain reference
// matcher on random text.
#include <gtest/gtest.h>

#include <random>

#include "grammar_test_util.h"

namespace m40::grammar {
namespace {

TEST(GrammarMatcher, RejectedInputLeavesTheStateUnchanged) {
  GrammarMatcher m(parse_gbnf(R"(root ::= "ab" "c"+)"));
  EXPECT_TRUE(m.accept("a"));
  EXPECT_FALSE(m.accept("bx"));  // 'b' fits, 'x' does not: nothing is consumed
  EXPECT_TRUE(m.accept("b"));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept("cc"));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, CanEndAndFinished) {
  GrammarMatcher m(parse_gbnf(R"(root ::= "a" "b"? )"));
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.finished());
  ASSERT_TRUE(m.accept("a"));
  EXPECT_TRUE(m.can_end());     // "a" is complete ...
  EXPECT_FALSE(m.finished());   // ... but "b" may follow
  ASSERT_TRUE(m.accept("b"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.finished());    // nothing more can follow
  EXPECT_FALSE(m.allows("b"));
}

TEST(GrammarMatcher, CharacterSplitAcrossPieces) {
  GrammarMatcher m(parse_gbnf(R"(root ::= "é" [一-龥] "!")"));
  ASSERT_TRUE(m.accept("\xC3"));  // first byte of é
  EXPECT_TRUE(m.inside_character());
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept("\xA9\xE4"));  // rest of é, first byte of 世
  EXPECT_TRUE(m.inside_character());
  EXPECT_FALSE(m.accept("\xB8\x41"));  // a continuation then 'A': not a character
  ASSERT_TRUE(m.accept("\xB8"));
  ASSERT_TRUE(m.accept("\x96"));
  EXPECT_FALSE(m.inside_character());
  ASSERT_TRUE(m.accept("!"));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, PartialCharacterMustBeOneTheGrammarAllows) {
  GrammarMatcher m(parse_gbnf(R"(root ::= [à-ÿ])"));  // U+00E0..U+00FF: lead byte C3, second A0..BF
  EXPECT_TRUE(m.allows("\xC3"));
  EXPECT_FALSE(m.allows("\xC2"));      // a lead byte of characters outside the class
  EXPECT_FALSE(m.allows("\xC3\x80"));  // À (U+00C0) is outside
  EXPECT_TRUE(m.allows("\xC3\xA0"));
}

TEST(GrammarMatcher, InvalidUtf8IsNeverAccepted) {
  auto any = parse_gbnf("root ::= .*");
  EXPECT_TRUE(GrammarMatcher::matches(any, "ok é 世 🦙"));
  EXPECT_FALSE(GrammarMatcher::matches(any, "\x80"));              // stray continuation byte
  EXPECT_FALSE(GrammarMatcher::matches(any, "\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(GrammarMatcher::matches(any, "\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(GrammarMatcher::matches(any, "\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(GrammarMatcher::matches(any, "\xC3"));              // unfinished
}

TEST(GrammarMatcher, AcceptCodepoint) {
  GrammarMatcher m(parse_gbnf(R"(root ::= [a-z] "🦙")"));
  EXPECT_FALSE(m.accept_codepoint(U'A'));
  EXPECT_TRUE(m.accept_codepoint(U'q'));
  EXPECT_TRUE(m.accept_codepoint(U'🦙'));
  EXPECT_TRUE(m.finished());
}

TEST(GrammarMatcher, LongRepetitionsCountExactly) {
  // Long bounded repetitions run as counted loops; the bounds stay exact.
  auto up_to_40 = parse_gbnf(R"(root ::= "x"{0,40})");
  auto from_35_to_80 = parse_gbnf(R"(root ::= "<" [a-z]{35,80} ">")");
  auto nested = parse_gbnf(R"g(root ::= ("ab"{0,40} ","){2,3})g");
  for (size_t n = 0; n <= 90; ++n) {
    EXPECT_EQ(GrammarMatcher::matches(up_to_40, std::string(n, 'x')), n <= 40) << n;
    EXPECT_EQ(GrammarMatcher::matches(from_35_to_80, std::string("<").append(n, 'q').append(">")), n >= 35 && n <= 80) << n;
  }
  std::string ab40;
  for (int i = 0; i < 40; ++i) ab40 += "ab";
  EXPECT_TRUE(GrammarMatcher::matches(nested, ",,"));
  EXPECT_TRUE(GrammarMatcher::matches(nested, ab40 + "," + ab40 + ",ab,"));
  EXPECT_FALSE(GrammarMatcher::matches(nested, ab40 + "ab,,"));
  EXPECT_FALSE(GrammarMatcher::matches(nested, ",,,,"));
  EXPECT_FALSE(GrammarMatcher::matches(nested, "aba,,"));
}

TEST(GrammarMatcher, DeepRecursion) {
  auto g = parse_gbnf(R"g(root ::= "(" root ")" | "x")g");
  const std::string deep = std::string(2000, '(') + "x" + std::string(2000, ')');
  EXPECT_TRUE(GrammarMatcher::matches(g, deep));
  EXPECT_FALSE(GrammarMatcher::matches(g, deep + ")"));
  EXPECT_FALSE(GrammarMatcher::matches(g, deep.substr(1)));
}

TEST(GrammarMatcher, AmbiguityKeepsEveryReading) {
  GrammarMatcher m(parse_gbnf(R"(root ::= "a" x | "a" y
x ::= "b" "c"
y ::= "b" "d")"));
  ASSERT_TRUE(m.accept("ab"));
  EXPECT_TRUE(m.allows("c"));
  EXPECT_TRUE(m.allows("d"));
  EXPECT_FALSE(m.allows("e"));
}

TEST(GrammarMatcher, NullableRulesAndRepeatedNullables) {
  auto g = parse_gbnf(R"(root ::= (ws item)* ws
ws ::= [ ]*
item ::= "i")");
  EXPECT_TRUE(GrammarMatcher::matches(g, ""));
  EXPECT_TRUE(GrammarMatcher::matches(g, "  i i  i "));
  EXPECT_FALSE(GrammarMatcher::matches(g, "  i j"));
}

TEST(GrammarMatcher, ResetStartsOver) {
  GrammarMatcher m(parse_gbnf(R"(root ::= "ab")"));
  ASSERT_TRUE(m.accept("ab"));
  m.reset();
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept("ab"));
}

// The interned, memoized matcher against the plain one, on random text built
// from the grammar's own characters (so that many prefixes are alive).
TEST(GrammarMatcher, AgreesWithTheReferenceOnRandomText) {
  const char* grammars[] = {
      R"g(root ::= expr
         expr ::= term (("+" | "*") term)*
         term ::= [0-9]{1,3} | "(" expr ")" | "-" term)g",
      R"(root ::= ("a" | "ab" | "abc")* "c"? [é世]{0,2})",
      R"(root ::= x{2,5} | y*
         x ::= "ab" | "a"
         y ::= "b" | "ba")",
  };
  const std::string alphabet[] = {"0", "7", "+", "*", "(", ")", "-", "a", "b", "c", "é", "世", "\xC3", "\xA9", "x"};
  std::mt19937 rng(7);
  for (const char* text : grammars) {
    auto g = parse_gbnf(text);
    for (int trial = 0; trial < 300; ++trial) {
      GrammarMatcher m(g);
      test::ReferenceMatcher ref(*g);
      std::string so_far;
      for (int step = 0; step < 12; ++step) {
        const std::string& piece = alphabet[rng() % std::size(alphabet)];
        const bool want = ref.accepts(piece);
        ASSERT_EQ(m.allows(piece), want) << text << " after '" << so_far << "' + '" << piece << "'";
        if (!want) continue;
        ASSERT_TRUE(m.accept(piece));
        ref.advance(piece);
        so_far += piece;
        ASSERT_EQ(m.can_end(), ref.can_end()) << text << " after '" << so_far << "'";
      }
    }
  }
}

}  // namespace
}  // namespace m40::grammar

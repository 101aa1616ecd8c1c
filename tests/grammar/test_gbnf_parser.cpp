// GBNF as llama.cpp writes it: every syntax element, and the errors a user
// gets for a broken grammar (with the line and column to look at).
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace m40::grammar {
namespace {

using test::matches;

std::string error_of(std::string_view gbnf, std::string_view root = "root") {
  try {
    parse_gbnf(gbnf, root);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GbnfSyntax, StringLiteralsMatchExactly) {
  EXPECT_TRUE(matches(R"(root ::= "hello")", "hello"));
  EXPECT_FALSE(matches(R"(root ::= "hello")", "hell"));
  EXPECT_FALSE(matches(R"(root ::= "hello")", "hello!"));
  EXPECT_TRUE(matches(R"(root ::= "")", ""));
  EXPECT_TRUE(matches(R"(root ::= "héllo 世界 🦙")", "héllo 世界 🦙"));
}

TEST(GbnfSyntax, EscapesInLiterals) {
  EXPECT_TRUE(matches(R"(root ::= "a\nb\tc\rd")", "a\nb\tc\rd"));
  EXPECT_TRUE(matches(R"(root ::= "\\ \"")", "\\ \""));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\U0001F999")", "Aé🦙"));
  EXPECT_TRUE(matches(R"(root ::= "\[\]")", "[]"));
}

TEST(GbnfSyntax, CharacterClasses) {
  const char* g = R"(root ::= [a-cx] [^0-9] [-+] [a-])";
  EXPECT_TRUE(matches(g, "a!+-"));
  EXPECT_TRUE(matches(g, "x?-a"));
  EXPECT_FALSE(matches(g, "d!+-"));   // d not in [a-cx]
  EXPECT_FALSE(matches(g, "a5+-"));   // 5 excluded by [^0-9]
  EXPECT_TRUE(matches(g, "cé+a"));    // [^0-9] takes any other character, multi-byte too
  EXPECT_TRUE(matches(R"(root ::= [^"\\]+)", "no quotes here"));
  EXPECT_FALSE(matches(R"(root ::= [^"\\]+)", "a\"b"));
  EXPECT_TRUE(matches(R"(root ::= [\x00-\x1F])", "\x01"));
  EXPECT_TRUE(matches(R"(root ::= [\u4e00-\u9fff]+)", "世界"));
  EXPECT_FALSE(matches(R"(root ::= [\u4e00-\u9fff]+)", "せかい"));
}

TEST(GbnfSyntax, DotIsAnyCharacter) {
  EXPECT_TRUE(matches("root ::= . . .", "a\n🦙"));
  EXPECT_FALSE(matches("root ::= .", "ab"));
  EXPECT_FALSE(matches("root ::= .", ""));
}

TEST(GbnfSyntax, AlternationAndGrouping) {
  const char* g = R"(root ::= ("cat" | "dog") "s"? | "bird")";
  EXPECT_TRUE(matches(g, "cat"));
  EXPECT_TRUE(matches(g, "dogs"));
  EXPECT_TRUE(matches(g, "bird"));
  EXPECT_FALSE(matches(g, "birds"));
  EXPECT_FALSE(matches(g, "cats dog"));
}

TEST(GbnfSyntax, RepetitionOperators) {
  EXPECT_TRUE(matches(R"(root ::= "a"*)", ""));
  EXPECT_TRUE(matches(R"(root ::= "a"*)", "aaaa"));
  EXPECT_FALSE(matches(R"(root ::= "a"+)", ""));
  EXPECT_TRUE(matches(R"(root ::= "a"+)", "aaa"));
  EXPECT_TRUE(matches(R"(root ::= "a"? "b")", "b"));
  EXPECT_FALSE(matches(R"(root ::= "a"? "b")", "aab"));
  EXPECT_TRUE(matches(R"(root ::= ("ab")+)", "ababab"));
  EXPECT_FALSE(matches(R"(root ::= ("ab")+)", "aba"));
}

TEST(GbnfSyntax, CountedRepetitionBoundsAreExact) {
  for (int n = 0; n <= 6; ++n) {
    const std::string text(static_cast<size_t>(n), 'x');
    EXPECT_EQ(matches(R"(root ::= "x"{3})", text), n == 3) << n;
    EXPECT_EQ(matches(R"(root ::= "x"{2,})", text), n >= 2) << n;
    EXPECT_EQ(matches(R"(root ::= "x"{2,4})", text), n >= 2 && n <= 4) << n;
    EXPECT_EQ(matches(R"(root ::= "x"{0,2})", text), n <= 2) << n;
    EXPECT_EQ(matches(R"(root ::= "x"{,1})", text), n <= 1) << n;
    EXPECT_EQ(matches(R"(root ::= "x"{ 1 , 3 })", text), n >= 1 && n <= 3) << n;
  }
  EXPECT_TRUE(matches(R"(root ::= ([0-9] "-"){2})", "1-2-"));
}

TEST(GbnfSyntax, RuleReferencesAndNames) {
  const char* g = R"(
    root      ::= greeting ", " name-2
    greeting  ::= "hello" | "hi"
    name-2    ::= [A-Z] [a-z]*
  )";
  EXPECT_TRUE(matches(g, "hi, Bob"));
  EXPECT_FALSE(matches(g, "hi, bob"));
}

TEST(GbnfSyntax, RecursiveRules) {
  const char* g = R"g(
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= [0-9]+ | "(" expr ")"
  )g";
  EXPECT_TRUE(matches(g, "1+(2-(3+4))-5"));
  EXPECT_FALSE(matches(g, "1+(2-3"));
  EXPECT_FALSE(matches(g, "1+"));
}

TEST(GbnfSyntax, CommentsAndLineBreaks) {
  const char* g = R"g(# a comment line
root ::=
  "a" (   # the body may start on the line after ::=; inside ( ) lines continue
    "b" | # a comment inside
    "c"
  ) "d"?
  | "z"   # a line starting with | continues the rule too
other ::= "o"
)g";
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "acd"));
  EXPECT_TRUE(matches(g, "z"));
  EXPECT_FALSE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "o"));
  // Outside parentheses a line break ends the rule.
  EXPECT_THROW(parse_gbnf("root ::= \"a\"\n  \"b\""), GrammarError);
}

TEST(GbnfSyntax, EmptyAlternative) {
  EXPECT_TRUE(matches(R"(root ::= "a" opt
opt ::= "b" | )", "a"));
  EXPECT_TRUE(matches(R"(root ::= "a" opt
opt ::= "b" | )", "ab"));
}

TEST(GbnfSyntax, RootCanBeChosen) {
  auto g = parse_gbnf(R"(root ::= "r"
answer ::= "yes" | "no")", "answer");
  EXPECT_TRUE(GrammarMatcher::matches(g, "yes"));
  EXPECT_FALSE(GrammarMatcher::matches(g, "r"));
  EXPECT_EQ(g->root(), "answer");
  EXPECT_EQ(g->rule_names(), (std::vector<std::string>{"root", "answer"}));
}

TEST(GbnfErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("root ::= \"a\"\nfoo \"b\""),
            "GBNF line 2, column 5: expected '::=' after the rule name 'foo', found '\"'");
  EXPECT_EQ(error_of("root ::= \"abc"), "GBNF line 1, column 10: unterminated string literal (missing '\"')");
  EXPECT_EQ(error_of("root ::= [a-z"), "GBNF line 1, column 10: unterminated character class (missing ']')");
  EXPECT_EQ(error_of("root ::=\n  (\"a\" | \"b\""), "GBNF line 2, column 13: expected ')' to close the '(' at line 2, column 3, found the end of the text");
  EXPECT_EQ(error_of("root ::= * \"a\""), "GBNF line 1, column 10: '*' must follow an element to repeat");
  EXPECT_EQ(error_of("root ::= \"a\"{3,2}"), "GBNF line 1, column 13: repetition {3,2} has max < min");
  EXPECT_EQ(error_of("root ::= \"a\"{x}"), "GBNF line 1, column 14: expected a number in '{...}', found 'x'");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "GBNF line 1, column 11: unknown escape '\\q' (known: \\n \\t \\r \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)");
  EXPECT_EQ(error_of("root ::= \"\\x4\""), "GBNF line 1, column 11: expected 2 hex digits in the escape");
  EXPECT_EQ(error_of("root ::= [z-a]"), "GBNF line 1, column 11: character range with its end before its start");
  EXPECT_EQ(error_of("root ::= \"a\" )"), "GBNF line 1, column 14: expected the end of the line after rule 'root', found ')'");
  EXPECT_EQ(error_of("root ::= <[42]>"), "GBNF line 1, column 10: token references (<...>) are not supported; write the text as a \"literal\"");
  EXPECT_EQ(error_of(""), "GBNF line 1, column 1: the grammar has no rules (expected `name ::= ...`)");
  EXPECT_EQ(error_of("root ::= \"\xC3\""), "GBNF line 1, column 11: invalid UTF-8 in the grammar text");
}

TEST(GbnfErrors, UndefinedRuleNamesTheReference) {
  EXPECT_EQ(error_of("root ::= a\na ::= \"x\" b"),
            "GBNF line 2, column 11: undefined rule 'b'; define it with `b ::= ...`");
}

TEST(GbnfErrors, MissingRoot) {
  EXPECT_EQ(error_of("start ::= \"x\""), "the grammar has no rule 'root' to start from; define `root ::= ...`");
  EXPECT_EQ(error_of("root ::= \"x\"", "main"), "the grammar has no rule 'main' to start from; define `main ::= ...`");
}

TEST(GbnfErrors, RuleDefinedTwice) {
  EXPECT_EQ(error_of("root ::= \"x\"\nroot ::= \"y\""), "GBNF line 2, column 1: rule 'root' is defined twice (first at line 1)");
}

TEST(GbnfErrors, LeftRecursionIsRefused) {
  // Direct.
  EXPECT_EQ(error_of("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]"),
            "GBNF line 2, column 1: rule 'expr' is left-recursive (expr -> expr without consuming any text); "
            "move the recursion after some text or use * / +");
  // Through another rule.
  EXPECT_NE(error_of("root ::= a\na ::= b \"x\"\nb ::= a | \"y\"").find("is left-recursive (a -> b -> a"), std::string::npos);
  // Through a rule that can be empty.
  EXPECT_NE(error_of("root ::= opt root \"x\" | \"y\"\nopt ::= \"o\"?").find("'root' is left-recursive"), std::string::npos);
  // Recursion after some text is fine.
  EXPECT_NO_THROW(parse_gbnf("root ::= \"(\" root \")\" | \"x\""));
}

TEST(GbnfErrors, GrammarThatMatchesNothing) {
  EXPECT_NE(error_of(R"(root ::= [^\x00-\U0010FFFF])").find("the grammar matches nothing"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"(\" root \")\"").find("the grammar matches nothing"), std::string::npos);
}

TEST(GbnfErrors, HugeRepetitionIsRefused) {
  EXPECT_NE(error_of(R"(root ::= ("abcdefghij"{1000}){1000})").find("too large to compile"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= "a"{1000001})").find("repetition count above"), std::string::npos);
}

TEST(GbnfErrors, ErrorsAreGrammarErrorsAndM40Errors) {
  EXPECT_THROW(parse_gbnf("root ::= ("), GrammarError);
  EXPECT_THROW(parse_gbnf("root ::= ("), m40::Error);
}

}  // namespace
}  // namespace m40::grammar

// The Jinja features chat templates rely on, one behaviour per test; the
// expected strings are what Jinja2 renders in transformers' environment.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <thread>
#include <vector>

#include "chat/chat_template.h"

namespace {

using Json = nlohmann::ordered_json;
using m40::chat::ChatTemplate;
using m40::chat::RenderOptions;

std::string render(const std::string& source, const Json& variables = Json::object(),
                   const Json& messages = Json::array()) {
  RenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.extra_variables = variables;
  o.now = m40::chat::DateTime{2024, 7, 26, 0, 0, 0};
  return ChatTemplate(source).render(messages, o);
}

// ------------------------------------------------------------ whitespace

TEST(ChatJinjaWhitespace, TrimBlocksDropsTheNewlineAfterATag) {
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
}

TEST(ChatJinjaWhitespace, LstripBlocksDropsIndentBeforeATagButNotBeforeAVariable) {
  EXPECT_EQ(render("  {% if true %}\n  {{ 'v' }}\n  {% endif %}\n"), "  v\n");
}

TEST(ChatJinjaWhitespace, PlusDisablesLstrip) {
  EXPECT_EQ(render("a\n    {%+ if true %}b{% endif %}\n"), "a\n    b");
}

TEST(ChatJinjaWhitespace, MinusStripsAllWhitespaceIncludingNewlines) {
  EXPECT_EQ(render("a  \n {%- if true -%} \n b \n {%- endif -%}\n  c"), "abc");
  EXPECT_EQ(render("x {{- ' y ' -}} z"), "x y z");
}

TEST(ChatJinjaWhitespace, OneTrailingNewlineOfTheSourceIsDropped) {
  EXPECT_EQ(render("text\n"), "text");
  EXPECT_EQ(render("text\n\n"), "text\n");
  EXPECT_EQ(render("text\r\n"), "text");
}

TEST(ChatJinjaWhitespace, CarriageReturnsBecomeNewlines) {
  EXPECT_EQ(render("{% if true %}\r\n x\r\n{% endif %}\r\ny"), " x\ny");
}

TEST(ChatJinjaWhitespace, CommentsVanishWithTheirLine) {
  EXPECT_EQ(render("  {# comment #}\nline\n  {#- c -#}  tail"), "linetail");
}

TEST(ChatJinjaWhitespace, RawBlocksAreLiteral) {
  EXPECT_EQ(render("{% raw %}{{ not a var }}{% endraw %}"), "{{ not a var }}");
}

TEST(ChatJinjaWhitespace, StringLiteralsMaySpanLines) {
  EXPECT_EQ(render("{{ 'a\nb' }}"), "a\nb");
}

// ------------------------------------------------------------ scoping

TEST(ChatJinjaScoping, SetInsideAForBodyIsLocalToTheIteration) {
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1,2,3] %}{{ x }}{% set x = i %}{% endfor %}{{ x }}"), "0000");
}

TEST(ChatJinjaScoping, NamespaceAttributesSurviveTheLoop) {
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
}

TEST(ChatJinjaScoping, SetInsideIfAtTopLevelIsNotScoped) {
  EXPECT_EQ(render("{% if true %}{% set y = 1 %}{% endif %}[{{ y }}]"), "[1]");
}

TEST(ChatJinjaScoping, MacrosSeeTopLevelVariablesAtCallTime) {
  EXPECT_EQ(render("{% set x = 5 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 6 %}{{ m() }}"), "6");
}

TEST(ChatJinjaScoping, TopLevelSetShadowsARenderVariable) {
  EXPECT_EQ(render("{% set messages = messages[1:] %}{{ messages | length }}", Json::object(),
                   Json::parse(R"([{"role":"system","content":"s"},{"role":"user","content":"u"}])")),
            "1");
}

// ------------------------------------------------------------ loops

TEST(ChatJinjaLoops, LoopVariables) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }} {% endfor %}"),
            "103TrueFalse3 212FalseFalse3 321FalseTrue3 ");
}

TEST(ChatJinjaLoops, ElseRunsWhenNothingIterated) {
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 3] if x is even %}{{ x }}{% else %}none{% endfor %}"), "none");
}

TEST(ChatJinjaLoops, FilterCountsOnlyKeptItems) {
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}"),
            "2:1/2 4:2/2 ");
}

TEST(ChatJinjaLoops, BreakAndContinue) {
  EXPECT_EQ(render("{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "13");
}

TEST(ChatJinjaLoops, DictItemsUnpackInInsertionOrder) {
  EXPECT_EQ(render("{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "b=1;a=2;");
  EXPECT_EQ(render("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}", Json::parse(R"({"d": {"z": 1, "y": 2}})")),
            "z1y2");
}

TEST(ChatJinjaLoops, RecursiveLoops) {
  EXPECT_EQ(render("{% for item in [{'c': [{'c': []}, {'c': [{'c': []}]}]}] recursive %}[{{ loop.depth }}"
                   "{{ loop(item.c) }}]{% endfor %}"),
            "[1[2][2[3]]]");
}

TEST(ChatJinjaLoops, IteratingNoneIsAnError) {
  EXPECT_THROW(render("{% for t in tools %}{% endfor %}"), m40::chat::TemplateRenderError);
}

// ------------------------------------------------------------ undefined

TEST(ChatJinjaUndefined, PrintsEmptyIteratesEmptyAndIsFalsy) {
  EXPECT_EQ(render("[{{ nothing }}]{% for x in nothing %}x{% endfor %}{{ nothing is defined }}{{ 'a' in nothing }}"
                   "{{ nothing | length }}{% if not nothing %}F{% endif %}"),
            "[]FalseFalse0F");
}

TEST(ChatJinjaUndefined, MissingKeysAreUndefinedButUsingThemFails) {
  EXPECT_EQ(render("{{ d.missing is defined }}{{ d['missing'] }}", Json::parse(R"({"d": {}})")), "False");
  try {
    render("{{ nothing.attr }}");
    FAIL();
  } catch (const m40::chat::TemplateRenderError& e) {
    EXPECT_EQ(e.message(), "'nothing' is undefined");
  }
  EXPECT_THROW(render("{{ nothing + 1 }}"), m40::chat::TemplateRenderError);
}

TEST(ChatJinjaUndefined, NoneIsDefined) {
  EXPECT_EQ(render("{{ tools is defined }}{{ tools is none }}{{ tools }}"), "TrueTrueNone");
}

// ------------------------------------------------------------ values

TEST(ChatJinjaValues, PythonPrinting) {
  EXPECT_EQ(render("{{ none }} {{ true }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-05 }} {{ 7 / 2 }} {{ 7 // 2 }}"),
            "None True 1.0 0.30000000000000004 1e+16 1e-05 3.5 3");
  EXPECT_EQ(render("{{ ['a', \"it's\", 1, none] }} {{ {'k': true} }} {{ (1,) }}"),
            "['a', \"it's\", 1, None] {'k': True} (1,)");
}

TEST(ChatJinjaValues, PythonTruthiness) {
  EXPECT_EQ(render("{% for v in ['', [], {}, none, 0, 0.0, 'x', [0], 1] %}{{ 1 if v else 0 }}{% endfor %}"),
            "000000111");
}

TEST(ChatJinjaValues, FiltersBindTighterThanPlus) {
  EXPECT_EQ(render("{{ '<x>' + c | trim }}", Json::parse(R"({"c": "  hi  "})")), "<x>hi");
}

TEST(ChatJinjaValues, InOperator) {
  EXPECT_EQ(render("{{ 'a' in 'cat' }}{{ 'k' in {'k': 1} }}{{ 2 in [1, 2] }}{{ 3 not in [3] }}"), "TrueTrueTrueFalse");
}

TEST(ChatJinjaValues, NegativeIndicesAndSlices) {
  EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ [1,2,3][-1] }} {{ [1,2,3,4][1:] }} {{ 'hello'[:-1] }} {{ 'héllo'[1] }}"),
            "cba 3 [2, 3, 4] hell é");
}

TEST(ChatJinjaValues, StringPlusNoneIsATypeError) {
  try {
    render("{{ 'a' + none }}");
    FAIL();
  } catch (const m40::chat::TemplateRenderError& e) {
    EXPECT_EQ(e.message(), "can only concatenate str (not \"NoneType\") to str");
  }
}

TEST(ChatJinjaValues, LengthCountsCodePoints) { EXPECT_EQ(render("{{ 'Grüße 🌍' | length }}"), "7"); }

// ------------------------------------------------------------ filters and methods

TEST(ChatJinjaFilters, ToJsonIsPythonJsonDumps) {
  const Json v = Json::parse(R"({"v": {"name": "Zürich \"q\"", "list": [1, 2.5, true, null], "empty": {}}})");
  EXPECT_EQ(render("{{ v | tojson }}", v),
            R"({"name": "Zürich \"q\"", "list": [1, 2.5, true, null], "empty": {}})");
  EXPECT_EQ(render("{{ v.list | tojson(indent=2) }}", v), "[\n  1,\n  2.5,\n  true,\n  null\n]");
  EXPECT_EQ(render("{{ v.name | tojson(ensure_ascii=true) }}", v), R"("Z\u00fcrich \"q\"")");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}"), R"({"a":2,"b":1})");
}

TEST(ChatJinjaFilters, SelectAttrRejectMapJoin) {
  const Json m = Json::parse(R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"},
                                 {"role":"user","content":"c"}])");
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}",
                   Json::object(), m),
            "a, c");
  EXPECT_EQ(render("{{ ['code_interpreter', 'x', 'y'] | reject('equalto', 'code_interpreter') | join(', ') }}"), "x, y");
  EXPECT_EQ(render("{{ messages | rejectattr('role', 'eq', 'user') | list | length }}", Json::object(), m), "1");
}

TEST(ChatJinjaFilters, CommonFilters) {
  EXPECT_EQ(render("{{ '  x ' | trim }}|{{ 'ab' | upper }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|"
                   "{{ nothing | default('d') }}|{{ [3, 1, 2] | sort | first }}|{{ [3, 1, 2] | last }}|"
                   "{{ 'a-b' | replace('-', '+') }}|{{ '7' | int + 1 }}|{{ 'x\ny' | indent(2) }}|{{ 5 | string }}"),
            "x|AB|Hello World|Hello|d|1|2|a+b|8|x\n  y|5");
}

TEST(ChatJinjaFilters, StringMethods) {
  EXPECT_EQ(render("{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'a</think>b'.split('</think>')[-1] }}|"
                   "{{ 'a b c'.rsplit(' ', 1)[0] }}|{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith(('x', 'lo')) }}|"
                   "{{ '/no_think text'.replace('/no_think', '') }}|{{ 'abc'.find('c') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}"),
            "x|hixx|b|a b|True|True| text|2|ABab");
  EXPECT_EQ(render("{{ 'Hi {}, {name}!'.format(1, name='you') }} {{ '%s=%d' % ('n', 5) }}"), "Hi 1, you! n=5");
}

// Python's str.upper()/lower() on every script with case, from the Unicode
// tables the tokenizer lowercases with (common/unicode.h); the expected
// strings are Python 3.11's.
TEST(ChatJinjaFilters, CaseMappingCoversEveryCasedScript) {
  EXPECT_EQ(render("{{ 'ⴀ' | upper }}{{ 'Ⴀ' | lower }}{{ 'ა'.upper() }}{{ 'Ა'.lower() }}"), "Ⴀⴀ\u1c90\u10d0");  // Georgian
  EXPECT_EQ(render("{{ 'ꭰ' | upper }}{{ 'Ꭰ' | lower }}"), "Ꭰꭰ");                                          // Cherokee
  EXPECT_EQ(render("{{ '𐐨' | upper }}{{ '𐐀' | lower }}"), "𐐀𐐨");                                          // Deseret
  EXPECT_EQ(render("{{ 'ⰰ' | upper }}{{ 'Ⰰ' | lower }}"), "Ⰰⰰ");                                          // Glagolitic
  EXPECT_EQ(render("{{ 'ａ' | upper }}{{ 'Ａ' | lower }}"), "Ａａ");                                        // fullwidth Latin
  EXPECT_EQ(render("{{ 'ա' | upper }}{{ 'Ա' | lower }}"), "Աա");                                          // Armenian
}

TEST(ChatJinjaFilters, CaseMappingIsPythonsFullMapping) {
  EXPECT_EQ(render("{{ 'straße' | upper }} {{ 'ﬀ'.upper() }} {{ 'İ'.lower() | length }} {{ 'ß'.casefold() }}"),
            "STRASSE FF 2 ss");
  // A capital sigma lowercases to ς at the end of a word.
  EXPECT_EQ(render("{{ 'ΟΔΟΣ ΟΔΟΣ. Σ' | lower }}"), "οδος οδος. σ");
  // title() and capitalize() use the titlecase mapping; the title filter
  // upper-cases the first character of each word.
  EXPECT_EQ(render("{{ 'ǆemal'.title() }} {{ 'ǆemal' | capitalize }} {{ 'ǆemal' | title }} {{ 'ǅ'.isupper() }}"),
            "ǅemal ǅemal Ǆemal False");
}

TEST(ChatJinjaFilters, DictMethods) {
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z', 0) }}{{ d.keys() | list }}{{ d.values() | list }}",
                   Json::parse(R"({"d": {"a": 1}})")),
            "10['a'][1]");
}

TEST(ChatJinjaFilters, ListsAndDictsCannotBeModified) {
  EXPECT_THROW(render("{{ [1].append(2) }}"), m40::chat::TemplateRenderError);
  EXPECT_THROW(render("{{ {'a': 1}.update({}) }}"), m40::chat::TemplateRenderError);
}

// ------------------------------------------------------------ tests, macros, globals

TEST(ChatJinjaTests, IsTests) {
  EXPECT_EQ(render("{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is number }}{{ none is none }}"
                   "{{ false is false }}{{ 0 is false }}{{ 3 is odd }}{{ 1 is in [1] }}{{ x is not defined }}"),
            "TrueTrueTrueTrueTrueTrueFalseTrueTrueTrue");
}

TEST(ChatJinjaMacros, DefaultsVarargsKwargsAndCaller) {
  EXPECT_EQ(render("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 3, 4, c=5) }}"),
            "13(4,){'c': 5}");
  EXPECT_EQ(render("{% macro m() %}<{{ caller(1) }}>{% endmacro %}{% call(x) m() %}c{{ x }}{% endcall %}"), "<c1>");
}

TEST(ChatJinjaGlobals, RaiseExceptionCarriesTheMessageVerbatim) {
  try {
    render("line one\n{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}");
    FAIL();
  } catch (const m40::chat::TemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant/user/assistant/...");
    EXPECT_EQ(e.line(), 2);
  }
}

TEST(ChatJinjaGlobals, StrftimeNowUsesTheGivenDate) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %d, %Y') }}|{{ strftime_now('%Y-%m-%d') }}|"
                   "{{ strftime_now('%A') }}"),
            "26 Jul 2024|July 26, 2024|2024-07-26|Friday");
}

TEST(ChatJinjaGlobals, RangeNamespaceDict) {
  EXPECT_EQ(render("{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ dict(a=1) }}{{ namespace(x=1).x }}"),
            "[0, 1, 2][1, 3, 5]{'a': 1}1");
}

TEST(ChatJinjaGlobals, ExtraVariablesReachTheTemplate) {
  EXPECT_EQ(render("{% if enable_thinking is defined and enable_thinking is false %}no-think{% endif %}",
                   Json::parse(R"({"enable_thinking": false})")),
            "no-think");
}

TEST(ChatJinjaGlobals, GenerationTagRendersItsBody) {
  EXPECT_EQ(render("{% generation %}answer{% endgeneration %}"), "answer");
}

// ------------------------------------------------------------ errors

TEST(ChatJinjaErrors, SyntaxErrorsGiveLineAndColumn) {
  try {
    ChatTemplate("line 1\n{% if x %}\n  {{ 1 + }}\n{% endif %}");
    FAIL();
  } catch (const m40::chat::TemplateSyntaxError& e) {
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.column(), 10);
    EXPECT_EQ(e.message(), "unexpected 'end of print statement'");
    EXPECT_NE(std::string(e.what()).find("line 3, column 10"), std::string::npos) << e.what();
  }
}

// Columns count code points from the line start, also far along a long line
// with many tokens and non-ASCII text before the error, and on later lines.
TEST(ChatJinjaErrors, ColumnsAreRightAlongLongLinesAndAfterThem) {
  auto where = [](const std::string& source) {
    try {
      ChatTemplate{source};
    } catch (const m40::chat::TemplateSyntaxError& e) {
      return std::to_string(e.line()) + ":" + std::to_string(e.column());
    }
    return std::string("no error");
  };
  std::string prefix;
  for (int i = 0; i < 1000; ++i) prefix += "{{ 'ü' ~ x[1:2] }}é";  // 19 code points, 21 bytes
  EXPECT_EQ(where(prefix + "{{ 1 + }}"), "1:" + std::to_string(19 * 1000 + 8));
  EXPECT_EQ(where(prefix + "\nab{{ 'é' ~ ü ~ }}"), "2:16");
  EXPECT_EQ(where(prefix + "\n" + prefix + "{{ ) }}"), "2:" + std::to_string(19 * 1000 + 4));
  EXPECT_EQ(where("é{{ 'x\ny' ~ a.\n }}"), "3:2");
  EXPECT_EQ(where("{{ [1, 2 }}"), "1:10");
}

TEST(ChatJinjaErrors, UnclosedBlockNamesWhereItOpened) {
  try {
    ChatTemplate("a\n{% for m in messages %}\nx");
    FAIL();
  } catch (const m40::chat::TemplateSyntaxError& e) {
    EXPECT_NE(e.message().find("'endfor'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("opened at line 2"), std::string::npos) << e.message();
  }
}

TEST(ChatJinjaErrors, UnknownTagsFiltersAndTestsFailWhenParsing) {
  EXPECT_THROW(ChatTemplate("{% foo %}"), m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{% if false %}{{ x | nosuchfilter }}{% endif %}"), m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{{ x is nosuchtest }}"), m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{% include 'other.jinja' %}"), m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{% break %}"), m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{{ 'unterminated }}"), m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{# no end"), m40::chat::TemplateSyntaxError);
}

TEST(ChatJinjaErrors, RenderErrorsGiveTheLine) {
  try {
    render("ok\n{% for t in tools %}{% endfor %}");
    FAIL();
  } catch (const m40::chat::TemplateRenderError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.message(), "'NoneType' object is not iterable");
  }
}

TEST(ChatJinjaThreads, OneTemplateRendersFromManyThreads) {
  const ChatTemplate tpl(
      "{%- set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ loop.index }}:{{ m.content | upper }};{% endfor %}{{ ns.n }}");
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      Json messages = Json::array();
      for (size_t i = 0; i <= t; ++i) {
        std::string content = "m";
        content += std::to_string(i);
        messages.push_back({{"role", "user"}, {"content", content}});
      }
      for (int repeat = 0; repeat < 200; ++repeat) results[t] = tpl.render(messages);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(results[0], "1:M0;1");
  EXPECT_EQ(results[2], "1:M0;2:M1;3:M2;3");
}

TEST(ChatJinjaErrors, MessagesMustBeAnArray) {
  EXPECT_THROW(ChatTemplate("x").render(Json::object()), m40::Error);
}

}  // namespace

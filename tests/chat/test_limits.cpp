// A chat template comes from a model file, which is untrusted input: no
// template may loop forever, build gigabytes or overflow the stack. Each
// attack below must end quickly in a TemplateLimitError (or a syntax error).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

#include "chat/chat_template.h"

namespace {

using Json = nlohmann::ordered_json;
using m40::chat::ChatTemplate;
using m40::chat::RenderOptions;
using m40::chat::TemplateLimitError;

std::string render(const std::string& source, const RenderOptions& options = {}) {
  return ChatTemplate(source).render(Json::array(), options);
}

// Runs `source`, expects a TemplateLimitError within seconds (a few in Release, more under sanitizers).
void expect_limit(const std::string& source, const RenderOptions& options = {}) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(render(source, options), TemplateLimitError) << source;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0) << source;
}

TEST(ChatLimits, EndlessMacroRecursion) {
  expect_limit("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
}

TEST(ChatLimits, EndlessRecursiveLoop) {
  expect_limit("{% for item in [[]] recursive %}{{ loop([item]) }}{% endfor %}");
}

TEST(ChatLimits, NestedLoopsRunOutOfSteps) {
  expect_limit("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
}

TEST(ChatLimits, HugeOutput) {
  expect_limit("{% for i in range(100000) %}{% for j in range(1000) %}0123456789abcdef{% endfor %}{% endfor %}");
}

TEST(ChatLimits, HugeStringFromRepetition) {
  expect_limit("{{ 'x' * 100000000000 }}");
  expect_limit("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
}

TEST(ChatLimits, DoublingListsRunOutOfMemoryBudget) {
  expect_limit("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}");
  expect_limit("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l * 2 %}{% endfor %}");
  expect_limit("{% set s = 'x' * 16000000 %}{{ s | list | length }}");
}

TEST(ChatLimits, RangeIsCappedAsInTheSandbox) {
  EXPECT_THROW(render("{{ range(1000000) | length }}"), m40::chat::TemplateRenderError);
}

// A step near the int64 limits must not overflow the index (it once read
// wild memory): Python's slice takes one item, or walks backwards.
TEST(ChatLimits, SlicesWithHugeStepsDoNotOverflow) {
  EXPECT_EQ(render("{{ 'abc'[2::9223372036854775807] }}"), "c");
  EXPECT_EQ(render("{{ 'abc'[::9223372036854775807] }}"), "a");
  EXPECT_EQ(render("{{ [1, 2, 3][2::9223372036854775807] }}"), "[3]");
  EXPECT_EQ(render("{{ [1, 2, 3][0::9223372036854775807] }}"), "[1]");
  EXPECT_EQ(render("{{ 'abc'[0::-9223372036854775807] }}"), "a");
  EXPECT_EQ(render("{{ 'abc'[::-9223372036854775807] }}"), "c");
  EXPECT_EQ(render("{{ [1, 2, 3][::-9223372036854775807 - 1] }}"), "[3]");
  EXPECT_EQ(render("{{ 'añc'[2::9223372036854775807] }}"), "c");
  EXPECT_EQ(render("{{ 'abcdefg'[1:6:2] }}|{{ 'abcdefg'[6:0:-3] }}|{{ [1, 2, 3][5:0:-1] }}"), "bdf|gd|[3, 2]");
}

// range() near the int64 limits is counted exactly: no overflow, no endless loop.
TEST(ChatLimits, RangeNearTheIntegerLimitsIsCountedExactly) {
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 5) | list }}"),
            "[9223372036854775800, 9223372036854775805]");
  EXPECT_EQ(render("{{ range(-9223372036854775807 - 1, -9223372036854775800, 7) | list }}"),
            "[-9223372036854775808, -9223372036854775801]");
  EXPECT_EQ(render("{{ range(9223372036854775807, 9223372036854775800, -4) | list }}"),
            "[9223372036854775807, 9223372036854775803]");
  EXPECT_EQ(render("{{ range(0, 9223372036854775807, 9223372036854775807) | list }}"), "[0]");
  EXPECT_EQ(render("{{ range(5, 0, -9223372036854775807 - 1) | list }}"), "[5]");
  EXPECT_EQ(render("{{ range(10, 0) | list }}{{ range(0, 10, -1) | list }}"), "[][]");
  EXPECT_THROW(render("{{ range(-9223372036854775807 - 1, 9223372036854775807) | length }}"),
               m40::chat::TemplateRenderError);
  EXPECT_THROW(render("{{ range(9223372036854775807, -9223372036854775807 - 1, -1) | length }}"),
               m40::chat::TemplateRenderError);
}

// Repeating an empty sequence any number of times is empty, at once.
TEST(ChatLimits, EmptySequenceTimesAHugeNumberIsEmpty) {
  EXPECT_EQ(render("[{{ '' * 9223372036854775807 }}]"), "[]");
  EXPECT_EQ(render("{{ [] * 9223372036854775807 }}"), "[]");
  EXPECT_EQ(render("{{ 'ab' * 0 }}|{{ 'ab' * -5 }}|{{ [1] * -9223372036854775807 }}"), "||[]");
}

// Format widths and precisions are capped at 4096 (a clear render error,
// not gigabytes in snprintf or an int overflow while parsing the digits);
// output up to the cap is exact, not cut at some buffer size.
TEST(ChatLimits, FormatWidthAndPrecisionAreBounded) {
  using m40::chat::TemplateRenderError;
  EXPECT_THROW(render("{{ '%.999999999f' % 1.0 }}"), TemplateRenderError);
  EXPECT_THROW(render("{{ '%.99999999999999999999f' % 1.0 }}"), TemplateRenderError);
  EXPECT_THROW(render("{{ '%2147483647d' % 1 }}"), TemplateRenderError);
  EXPECT_THROW(render("{{ '%*d' % (100000000, 1) }}"), TemplateRenderError);
  EXPECT_THROW(render("{{ '%.*f' % (-9223372036854775807, 1.0) }}"), TemplateRenderError);
  EXPECT_THROW(render("{{ '{:,.2147483647f}'.format(1e300) }}"), TemplateRenderError);
  EXPECT_THROW(render("{{ '{:4097}'.format('x') }}"), TemplateRenderError);
  EXPECT_THROW(render("{{ '{:.4097}'.format('x') }}"), TemplateRenderError);

  EXPECT_EQ(render("{{ ('%4096d' % 7) | length }}"), "4096");
  EXPECT_EQ(render("{{ '{:>4096}'.format('x') | length }}"), "4096");
  EXPECT_EQ(render("{{ '%*d|%-*d|' % (3, 7, 3, 8) }}"), "  7|8  |");
  // 1e300 with 600 decimals is 301 + 1 + 600 characters, past the old 511-byte buffer.
  EXPECT_EQ(render("{{ ('%.600f' % 1e300) | length }}"), "902");
  EXPECT_EQ(render("{{ ('{:.4096f}'.format(1e308)) | length }}"), std::to_string(309 + 1 + 4096));
  EXPECT_EQ(render("{{ '%.3f|{:.2f}' % 3.14159 }}"), "3.142|{:.2f}");
  EXPECT_EQ(render("{{ '{:08.3f}'.format(-3.14159) }}"), "-003.142");
}

// A list holding another list twice, nested deep, is small in memory but its
// text is exponentially long: str, repr and tojson stop at the output limit.
TEST(ChatLimits, TextOfSharedNestedListsIsBounded) {
  const std::string build =
      "{% set ns = namespace(a=[]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}";
  expect_limit(build + "{{ ns.a }}");
  expect_limit(build + "{{ ns.a | tojson }}");
  expect_limit(build + "{{ ns.a | string | length }}");
  expect_limit(build + "{{ ns.a | tojson(indent=2) | length }}");
  expect_limit(build + "{{ '%s' % [ns.a] }}");
  expect_limit(build + "{{ {'k': ns.a} }}");
  expect_limit(build + "{{ ns }}");

  RenderOptions small;
  small.limits.max_output_bytes = 100;
  const std::string pair = "{% set x = ['a' * 50, 'b' * 50] %}";
  EXPECT_EQ(render(pair + "{{ x | length }}", small), "2");
  EXPECT_THROW(render(pair + "{{ x | string | length }}", small), TemplateLimitError);
  EXPECT_THROW(render(pair + "{{ x | tojson | length }}", small), TemplateLimitError);
  EXPECT_EQ(render("{{ [['a', 1], {'k': (2,)}] }}|{{ [['a', 1], {'k': (2,)}] | tojson }}", small),
            "[['a', 1], {'k': (2,)}]|[[\"a\", 1], {\"k\": [2]}]");
}

// Two lists built apart, each holding its previous self twice, 40 deep: item
// by item they are 2^40 pairs, but each distinct pair is compared once.
TEST(ChatLimits, ComparingSharedNestedListsIsFast) {
  const std::string lists =
      "{% set ns = namespace(a=[], b=[]) %}{% for i in range(40) %}"
      "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}";
  EXPECT_EQ(render(lists + "{{ ns.a == ns.b }}|{{ ns.a != ns.b }}|{{ ns.a is eq ns.b }}"), "True|False|True");
  EXPECT_EQ(render(lists + "{{ ns.a in [ns.b] }}|{{ [1, ns.a].index(ns.b) }}|{{ [ns.a, ns.b].count(ns.a) }}"),
            "True|1|2");
  EXPECT_EQ(render(lists + "{{ ns.a < ns.b }}|{{ ns.a <= ns.b }}|{{ [ns.a, ns.b] | sort | length }}"),
            "False|True|2");
  EXPECT_EQ(render(lists + "{{ [ns.a, ns.b] | max | length }}|{{ ns.a | length }}|{{ ns.a | list | length }}"),
            "2|2|2");
  // Differing only in the deepest item: found at the first leaf compared.
  const std::string differing =
      "{% set ns = namespace(a=[1], b=[2]) %}{% for i in range(40) %}"
      "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}";
  EXPECT_EQ(render(differing + "{{ ns.a == ns.b }}|{{ ns.a < ns.b }}|{{ ns.b < ns.a }}"), "False|True|False");

  // The same with tuples, which are hashable: dict keys and |unique.
  const std::string tuples =
      "{% set ns = namespace(a=(), b=()) %}{% for i in range(40) %}"
      "{% set ns.a = (ns.a, ns.a) %}{% set ns.b = (ns.b, ns.b) %}{% endfor %}";
  EXPECT_EQ(render(tuples + "{% set d = {ns.a: 'found'} %}{{ d[ns.b] }}|{{ ns.b in d }}|{{ d | length }}"),
            "found|True|1");
  EXPECT_EQ(render(tuples + "{{ [ns.a, ns.b, ns.a] | unique | list | length }}"), "1");
}

// Lists with many distinct items still cost a visit per pair compared, and the
// visits count against the step budget.
TEST(ChatLimits, ComparingCountsAgainstTheStepBudget) {
  const std::string lists = "{% set a = range(3000) | batch(1) | list %}{% set b = range(3000) | batch(1) | list %}";
  EXPECT_EQ(render(lists + "{{ a == b }}"), "True");
  RenderOptions small;
  small.limits.max_steps = 1000;
  EXPECT_EQ(render(lists + "{{ a | length }}", small), "3000");
  expect_limit(lists + "{{ a == b }}", small);
  expect_limit(lists + "{{ a in [b] }}", small);
}

TEST(ChatLimits, DeepNestingIsASyntaxErrorNotACrash) {
  const std::string parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_THROW(ChatTemplate("{{ " + parens + " }}"), m40::chat::TemplateSyntaxError);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if 1 %}";
  for (int i = 0; i < 5000; ++i) ifs += "{% endif %}";
  EXPECT_THROW(ChatTemplate{ifs}, m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{{ " + std::string(5000, '-') + "1 }}"), m40::chat::TemplateSyntaxError);
  EXPECT_THROW(ChatTemplate("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"),
               m40::chat::TemplateSyntaxError);
}

TEST(ChatLimits, LimitsAreOptions) {
  RenderOptions small;
  small.limits.max_output_bytes = 10;
  EXPECT_EQ(render("0123456789", small), "0123456789");
  EXPECT_THROW(render("0123456789x", small), TemplateLimitError);

  RenderOptions few_steps;
  few_steps.limits.max_steps = 100;
  EXPECT_THROW(render("{% for i in range(1000) %}{% endfor %}", few_steps), TemplateLimitError);

  RenderOptions shallow;
  shallow.limits.max_call_depth = 3;
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(2) }}", shallow),
            "012");
  EXPECT_THROW(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}", shallow),
               TemplateLimitError);
}

TEST(ChatLimits, RealConversationsFitTheDefaults) {
  // 2000 turns through a template with reversed iteration and namespaces.
  Json messages = Json::array();
  for (int i = 0; i < 1000; ++i) {
    messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(i)}});
    messages.push_back({{"role", "assistant"}, {"content", "<think>x</think>answer " + std::to_string(i)}});
  }
  const ChatTemplate tpl(
      "{%- set ns = namespace(last=messages|length - 1) %}"
      "{%- for message in messages[::-1] %}{%- if message.role == 'user' and ns.last == messages|length - 1 %}"
      "{%- set ns.last = (messages|length - 1) - loop.index0 %}{%- endif %}{%- endfor %}"
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
      "message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}{%- endfor %}");
  EXPECT_NO_THROW(tpl.render(messages));
}

}  // namespace

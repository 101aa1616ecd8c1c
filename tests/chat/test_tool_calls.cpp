// Tool calls of the chat-template families: which family a template is
// (shared/templates), how each family's answers read back into content,
// reasoning and calls, the same answers streamed in every split, and the
// grammar that forces a call.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/tool_call_format.h"
#include "chat/tool_call_grammar.h"
#include "chat/tool_call_parser.h"
#include "common/error.h"
#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using m40::chat::AnswerDelta;
using m40::chat::AnswerOptions;
using m40::chat::ParsedAnswer;
using m40::chat::StreamingAnswerParser;
using m40::chat::ToolCall;
using m40::chat::ToolCallFormat;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path templates_dir() { return m40::test::shared_dir() / "templates"; }

// ---------------------------------------------------------------------------
// Template traits

struct TraitsCase {
  std::string name;
  bool renders_tools;
  bool has_thinking;
  ToolCallFormat format;
};

const std::vector<TraitsCase> kSharedTemplates = {
    {"HuggingFaceTB-SmolLM3-3B", false, true, ToolCallFormat::None},
    {"Qwen-Qwen2.5-7B-Instruct", true, false, ToolCallFormat::Hermes},
    {"Qwen-Qwen3-0.6B", true, true, ToolCallFormat::Hermes},
    {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", false, true, ToolCallFormat::DeepSeekV3},
    {"google-gemma-2-2b-it", false, false, ToolCallFormat::None},
    {"ibm-granite-granite-3.3-2B-Instruct", true, true, ToolCallFormat::Granite},
    {"meta-llama-Llama-3.1-8B-Instruct", true, false, ToolCallFormat::Llama3},
    {"microsoft-Phi-3.5-mini-instruct", false, false, ToolCallFormat::None},
    {"mistralai-Mistral-Nemo-Instruct-2407", true, false, ToolCallFormat::MistralNemo},
};

TEST(ToolCallFormat, TraitsOfEverySharedTemplate) {
  std::set<std::string> seen;
  for (const auto& entry : fs::directory_iterator(templates_dir())) {
    if (entry.path().extension() == ".jinja") seen.insert(entry.path().stem().string());
  }
  ASSERT_EQ(seen.size(), kSharedTemplates.size()) << "a template was added to shared/templates: list it here";
  for (const auto& c : kSharedTemplates) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(seen.count(c.name));
    const auto traits = m40::chat::template_traits(read_file(templates_dir() / (c.name + ".jinja")));
    EXPECT_EQ(traits.renders_tools, c.renders_tools);
    EXPECT_EQ(traits.has_thinking, c.has_thinking);
    EXPECT_EQ(m40::chat::tool_call_format_name(traits.tool_format), m40::chat::tool_call_format_name(c.format));
    EXPECT_EQ(traits.thinking_open, c.has_thinking ? "<think>" : "");
    EXPECT_EQ(traits.thinking_close, c.has_thinking ? "</think>" : "");
  }
}

// renders_tools must agree with what the template really does: the g_tools
// case's recorded rendering shows the tool definition exactly when it is true.
TEST(ToolCallFormat, RendersToolsAgreesWithTheRecordedToolsCase) {
  for (const auto& c : kSharedTemplates) {
    SCOPED_TRACE(c.name);
    const auto cases = Json::parse(read_file(templates_dir() / (c.name + ".cases.json")));
    bool found = false;
    for (const auto& tc : cases.at("cases")) {
      if (!tc.contains("tools") || !tc.contains("expected")) continue;
      found = true;
      const std::string expected = tc.at("expected");
      const auto traits = m40::chat::template_traits(read_file(templates_dir() / (c.name + ".jinja")));
      EXPECT_EQ(traits.renders_tools, expected.find("get_weather") != std::string::npos);
    }
    EXPECT_TRUE(found);
  }
}

TEST(ToolCallFormat, PromptOpensThinkingOnlyWhereTheGenerationPromptEndsInTheOpenTag) {
  for (const auto& c : kSharedTemplates) {
    SCOPED_TRACE(c.name);
    const auto traits = m40::chat::template_traits(read_file(templates_dir() / (c.name + ".jinja")));
    const auto cases = Json::parse(read_file(templates_dir() / (c.name + ".cases.json")));
    const std::string prompt = cases.at("cases").at(0).at("expected");
    EXPECT_EQ(m40::chat::prompt_opens_thinking(traits, prompt),
              c.name == "deepseek-ai-DeepSeek-R1-Distill-Llama-8B");
  }
  m40::chat::TemplateTraits qwen3;
  qwen3.has_thinking = true;
  qwen3.thinking_open = "<think>";
  qwen3.thinking_close = "</think>";
  // Qwen 3 with enable_thinking=false closes the section in the prompt.
  EXPECT_FALSE(m40::chat::prompt_opens_thinking(qwen3, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(m40::chat::prompt_opens_thinking(qwen3, "<|im_start|>assistant\n<think>\n"));
}

TEST(ToolCallFormat, AnswerOptionsFromTraitsAndPrompt) {
  const auto r1 = m40::chat::template_traits(read_file(templates_dir() / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"));
  const auto o = m40::chat::answer_options(r1, true, "<｜User｜>Hi<｜Assistant｜><think>\n");
  EXPECT_EQ(o.tool_format, ToolCallFormat::DeepSeekV3);
  EXPECT_TRUE(o.tools_given);
  EXPECT_TRUE(o.thinking);
  EXPECT_TRUE(o.starts_in_thinking);
  const auto answer = m40::chat::parse_answer(o, "Greet back.\n</think>\n\nHello!");
  EXPECT_EQ(answer.reasoning, "Greet back.");
  EXPECT_EQ(answer.content, "Hello!");

  const auto magistral = m40::chat::template_traits("[THINK][/THINK][TOOL_CALLS][ARGS]{{ tools }}");
  const auto m = m40::chat::answer_options(magistral, false, "[INST]Hi[/INST]");
  EXPECT_EQ(m.thinking_open, "[THINK]");
  EXPECT_FALSE(m.starts_in_thinking);
  EXPECT_EQ(m40::chat::parse_answer(m, "[THINK]Hm.[/THINK]Hi!").reasoning, "Hm.");

  const auto gemma = m40::chat::template_traits(read_file(templates_dir() / "google-gemma-2-2b-it.jinja"));
  const auto g = m40::chat::answer_options(gemma, true, "<start_of_turn>model\n");
  EXPECT_FALSE(g.thinking);
  EXPECT_EQ(m40::chat::parse_answer(g, "<think>x</think>").content, "<think>x</think>");
}

TEST(ToolCallFormat, FamiliesOutsideTheSharedSet) {
  using m40::chat::template_traits;
  // Phi-4-mini reads the tools from the system message.
  const auto phi4 = template_traits(
      "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is "
      "not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + "
      "'<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor "
      "%}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}");
  EXPECT_EQ(phi4.tool_format, ToolCallFormat::Phi4);
  EXPECT_FALSE(phi4.renders_tools);

  // Mistral Small 3.2: name[ARGS]{...}; the same template without [ARGS] is Nemo's form
  // unless the vocabulary has the [ARGS] token.
  const std::string mistral_new =
      "{%- for m in messages %}{%- if m.tool_calls %}{{- '[TOOL_CALLS]' + m.tool_calls[0].function.name + '[ARGS]' + "
      "m.tool_calls[0].function.arguments|tojson }}{%- endif %}{%- endfor %}{{ tools }}";
  EXPECT_EQ(template_traits(mistral_new).tool_format, ToolCallFormat::Mistral);
  const std::string mistral_old = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}{% endif %}[TOOL_CALLS]";
  EXPECT_EQ(template_traits(mistral_old).tool_format, ToolCallFormat::MistralNemo);
  EXPECT_EQ(template_traits(mistral_old, [](std::string_view t) { return t == "[ARGS]"; }).tool_format,
            ToolCallFormat::Mistral);

  // A template that renders tools in no known format: Generic, unless the vocabulary tells.
  const std::string plain = "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}{% for m in messages %}{{ m.content "
                            "}}{% endfor %}";
  const auto generic = template_traits(plain);
  EXPECT_TRUE(generic.renders_tools);
  EXPECT_EQ(generic.tool_format, ToolCallFormat::Generic);
  EXPECT_EQ(template_traits(plain, [](std::string_view t) { return t == "<tool_call>"; }).tool_format,
            ToolCallFormat::Hermes);

  // Mentions of "tools" outside a tag, in a string literal or as an attribute do not count.
  const auto mentions = template_traits("# tools <tools>{{ 'tools' }}{{ message.tools }}{% set x = \"tools\" %}");
  EXPECT_FALSE(mentions.renders_tools);
  EXPECT_EQ(mentions.tool_format, ToolCallFormat::None);

  // Llama 3.2: no <|python_tag|> in the template, but the header tokens and tools.
  const auto llama32 = template_traits(
      "{{- bos_token }}{%- if tools is not none %}Environment: ipython{% endif %}<|start_header_id|>user<|end_header_id|>");
  EXPECT_EQ(llama32.tool_format, ToolCallFormat::Llama3);

  // Magistral's [THINK] section.
  const auto magistral = template_traits("[SYSTEM_PROMPT][THINK]...[/THINK][TOOL_CALLS]{{ tools }}[ARGS]");
  EXPECT_TRUE(magistral.has_thinking);
  EXPECT_EQ(magistral.thinking_open, "[THINK]");
  EXPECT_EQ(magistral.thinking_close, "[/THINK]");
  EXPECT_EQ(magistral.tool_format, ToolCallFormat::Mistral);
}

TEST(ToolCallFormat, Names) {
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::None), "none");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::Hermes), "hermes");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::Llama3), "llama3");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::MistralNemo), "mistral-nemo");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::Mistral), "mistral");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::DeepSeekV3), "deepseek-v3");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::Granite), "granite");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::Phi4), "phi4");
  EXPECT_EQ(m40::chat::tool_call_format_name(ToolCallFormat::Generic), "generic");
}

TEST(ToolCallFormat, GenericInstructionJoinsTheSystemMessage) {
  const std::string instruction(m40::chat::generic_tool_instruction());
  EXPECT_EQ(instruction,
            "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to the "
            "user's request");
  const auto with_system = m40::chat::with_system_instruction(
      Json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])"), instruction);
  EXPECT_EQ(with_system.size(), 2u);
  EXPECT_EQ(with_system[0]["content"], "Be brief.\n\n" + instruction);
  const auto without = m40::chat::with_system_instruction(Json::parse(R"([{"role": "user", "content": "Hi"}])"),
                                                          instruction);
  ASSERT_EQ(without.size(), 2u);
  EXPECT_EQ(without[0], (Json{{"role", "system"}, {"content", instruction}}));
  EXPECT_EQ(without[1]["role"], "user");
}

// ---------------------------------------------------------------------------
// Parsing: recorded outputs of each family, whole and streamed.

struct Call {
  std::string name;
  std::string arguments;
};

struct ParseCase {
  std::string name;
  AnswerOptions options;
  std::string output;
  std::string content;
  std::string reasoning;
  std::vector<Call> calls;
  // Marker texts that must never show in the content (none for outputs that
  // are not valid calls: their text is the content).
  std::vector<std::string> markers;
};

AnswerOptions tools(ToolCallFormat format, bool thinking = false, bool starts_in_thinking = false) {
  AnswerOptions o;
  o.tool_format = format;
  o.tools_given = true;
  o.thinking = thinking;
  o.starts_in_thinking = starts_in_thinking;
  o.id_seed = 42;
  return o;
}

const std::vector<std::string> kHermesMarkers = {"<tool_call>", "</tool_call>", "{\"name\""};
const std::vector<std::string> kLlamaMarkers = {"<|python_tag|>", "\"parameters\"", "{\"name\""};
const std::vector<std::string> kMistralMarkers = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "\"arguments\""};
const std::vector<std::string> kDsMarkers = {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                                             "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "```"};
const std::vector<std::string> kToolCallTokenMarkers = {"<|tool_call|>", "<|/tool_call|>", "\"arguments\""};
const std::vector<std::string> kGenericMarkers = {"\"tool_call", "\"response\"", "\"arguments\""};
const std::vector<std::string> kThinkMarkers = {"<think>", "</think>"};

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::string kWeather = R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}})";
const std::string kWeatherArgs = R"({"city":"Paris","unit":"celsius"})";
const std::string kTime = R"({"name": "get_time", "arguments": {"timezone": "Europe/Paris"}})";
const std::string kTimeArgs = R"({"timezone":"Europe/Paris"})";
// Unicode, escaped quotes and backslashes, nesting, numbers of every shape.
const std::string kTricky =
    R"({"name": "search", "arguments": {"q": "Grüße \"世界\" 🌍 \\ \u00e9", "n": -1.5e3, "tags": [ "a" , {"b" :null} ], "ok": true}})";
const std::string kTrickyArgs =
    R"({"q":"Grüße \"世界\" 🌍 \\ \u00e9","n":-1.5e3,"tags":["a",{"b":null}],"ok":true})";

std::vector<ParseCase> parse_cases() {
  std::vector<ParseCase> cases;
  const auto add = [&](ParseCase c) { cases.push_back(std::move(c)); };
  const auto H = ToolCallFormat::Hermes;

  // --- Hermes (Qwen 2.5 / Qwen 3 / SmolLM3) ---
  add({"hermes_no_call", tools(H), "It is sunny in Paris today.", "It is sunny in Paris today.", "", {}, kHermesMarkers});
  add({"hermes_one_call", tools(H), "<tool_call>\n" + kWeather + "\n</tool_call>", "", "", {{"get_weather", kWeatherArgs}},
       kHermesMarkers});
  add({"hermes_two_calls", tools(H), "<tool_call>\n" + kWeather + "\n</tool_call>\n<tool_call>\n" + kTime + "\n</tool_call>",
       "", "", {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kHermesMarkers});
  add({"hermes_content_before", tools(H), "Let me check the weather.\n\n<tool_call>\n" + kWeather + "\n</tool_call>",
       "Let me check the weather.", "", {{"get_weather", kWeatherArgs}}, kHermesMarkers});
  add({"hermes_content_after", tools(H), "<tool_call>\n" + kWeather + "\n</tool_call>\nI asked for it.", "I asked for it.",
       "", {{"get_weather", kWeatherArgs}}, kHermesMarkers});
  add({"hermes_tricky_arguments", tools(H), "<tool_call>\n" + kTricky + "\n</tool_call>", "", "", {{"search", kTrickyArgs}},
       kHermesMarkers});
  add({"hermes_arguments_before_name", tools(H),
       "<tool_call>\n{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}\n</tool_call>", "", "",
       {{"get_weather", R"({"city":"Paris"})"}}, kHermesMarkers});
  add({"hermes_arguments_as_a_string", tools(H),
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}\n</tool_call>", "", "",
       {{"get_weather", R"({"city":"Paris"})"}}, kHermesMarkers});
  add({"hermes_no_arguments", tools(H), "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>", "", "",
       {{"get_time", "{}"}}, kHermesMarkers});
  add({"hermes_no_closing_tag", tools(H), "<tool_call>\n" + kWeather, "", "", {{"get_weather", kWeatherArgs}},
       kHermesMarkers});
  add({"hermes_escaped_name", tools(H), "<tool_call>\n{\"name\": \"get_\\u0077eather\", \"arguments\": {}}\n</tool_call>",
       "", "", {{"get_weather", "{}"}}, kHermesMarkers});
  add({"hermes_reasoning_then_call", tools(H, true),
       "<think>\nThe user wants the weather.\nI will call get_weather.\n</think>\n\n<tool_call>\n" + kWeather +
           "\n</tool_call>",
       "", "The user wants the weather.\nI will call get_weather.", {{"get_weather", kWeatherArgs}},
       plus(kHermesMarkers, kThinkMarkers)});
  add({"hermes_reasoning_content_and_call", tools(H, true),
       "<think>\n\n</think>\n\nChecking.\n<tool_call>\n" + kWeather + "\n</tool_call>", "Checking.", "",
       {{"get_weather", kWeatherArgs}}, plus(kHermesMarkers, kThinkMarkers)});
  add({"hermes_call_inside_reasoning_is_reasoning", tools(H, true),
       "<think><tool_call>{\"name\": \"x\"}</tool_call></think>Done.", "Done.",
       "<tool_call>{\"name\": \"x\"}</tool_call>", {}, {}});
  // Malformed: all of it stays content, byte for byte.
  add({"hermes_not_json", tools(H), "<tool_call>\nI cannot call tools.\n</tool_call>",
       "<tool_call>\nI cannot call tools.\n</tool_call>", "", {}, {}});
  add({"hermes_no_name", tools(H), "See:\n<tool_call>\n{\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "See:\n<tool_call>\n{\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "", {}, {}});
  add({"hermes_bad_json_before_arguments", tools(H), "<tool_call>\n{\"name\": \"get_weather\" \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\" \"arguments\": {}}\n</tool_call>", "", {}, {}});
  add({"hermes_name_not_a_string", tools(H), "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>",
       "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>", "", {}, {}});
  add({"hermes_arguments_not_an_object", tools(H), "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
       "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "", {}, {}});
  add({"hermes_malformed_then_good", tools(H),
       "<tool_call>oops</tool_call>\n<tool_call>\n" + kWeather + "\n</tool_call>", "<tool_call>oops</tool_call>", "",
       {{"get_weather", kWeatherArgs}}, {}});
  add({"hermes_lone_marker_text", tools(H), "Use <tool_call> tags, like <tool", "Use <tool_call> tags, like <tool", "", {},
       {}});
  add({"hermes_without_tools", AnswerOptions{.tool_format = H}, "<tool_call>\n" + kWeather + "\n</tool_call>",
       "<tool_call>\n" + kWeather + "\n</tool_call>", "", {}, {}});

  // --- Reasoning alone ---
  add({"think_then_answer", tools(H, true), "<think>\nHmm, 2+2.\n</think>\n\nIt is 4.", "It is 4.", "Hmm, 2+2.", {},
       plus(kHermesMarkers, kThinkMarkers)});
  add({"think_unclosed", tools(H, true), "<think>\nStill thinking about it", "", "Still thinking about it", {},
       plus(kHermesMarkers, kThinkMarkers)});
  add({"think_off", AnswerOptions{.tool_format = H}, "<think>x</think>y", "<think>x</think>y", "", {}, {}});
  add({"think_absent", tools(H, true), "  Plain answer.", "  Plain answer.", "", {}, plus(kHermesMarkers, kThinkMarkers)});
  add({"think_started_by_the_prompt", tools(ToolCallFormat::DeepSeekV3, true, true),
       "Okay, so 2+2.\n</think>\n\nIt is 4.", "It is 4.", "Okay, so 2+2.", {}, plus(kDsMarkers, kThinkMarkers)});
  add({"think_whitespace_inside_kept", tools(H, true), "<think>a \n\n b</think>c", "c", "a \n\n b", {},
       plus(kHermesMarkers, kThinkMarkers)});

  // --- Llama 3.x ---
  const auto L = ToolCallFormat::Llama3;
  add({"llama3_no_call", tools(L), "The capital of France is Paris.", "The capital of France is Paris.", "", {},
       kLlamaMarkers});
  add({"llama3_bare_json", tools(L), R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}})", "",
       "", {{"get_weather", kWeatherArgs}}, kLlamaMarkers});
  add({"llama3_bare_json_arguments", tools(L), "  " + kWeather, "", "", {{"get_weather", kWeatherArgs}}, kLlamaMarkers});
  add({"llama3_type_function", tools(L),
       R"({"type": "function", "name": "get_time", "parameters": {"timezone": "Europe/Paris"}})", "", "",
       {{"get_time", kTimeArgs}}, kLlamaMarkers});
  add({"llama3_several_with_semicolons", tools(L),
       R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; {"name": "get_time", "parameters": {"timezone": "Europe/Paris"}})",
       "", "", {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kLlamaMarkers});
  add({"llama3_python_tag_builtin", tools(L), "<|python_tag|>brave_search.call(query=\"weather in Paris\")", "", "",
       {{"brave_search", R"({"query":"weather in Paris"})"}}, kLlamaMarkers});
  add({"llama3_python_tag_builtin_args", tools(L),
       "<|python_tag|>wolfram_alpha.call(query='2+2 \\'quoted\\'', precision=3, exact=True)", "", "",
       {{"wolfram_alpha", R"({"query":"2+2 'quoted'","precision":3,"exact":true})"}}, kLlamaMarkers});
  add({"llama3_python_tag_json", tools(L), "<|python_tag|>" + kTricky, "", "", {{"search", kTrickyArgs}}, kLlamaMarkers});
  add({"llama3_content_then_python_tag", tools(L),
       "I'll search for that.\n<|python_tag|>brave_search.call(query=\"Grüße \\\"x\\\"\")", "I'll search for that.", "",
       {{"brave_search", R"({"query":"Grüße \"x\""})"}}, kLlamaMarkers});
  add({"llama3_python_tag_code", tools(L), "<|python_tag|>import math\nprint(math.pi)\n", "", "",
       {{"python", R"x({"code":"import math\nprint(math.pi)"})x"}}, kLlamaMarkers});
  add({"llama3_json_answer_is_content", tools(L), R"({"city": "Paris", "country": "France"})",
       R"({"city": "Paris", "country": "France"})", "", {}, {}});
  add({"llama3_name_without_parameters_is_content", tools(L), R"({"name": "Bob", "age": 3})", R"({"name": "Bob", "age": 3})",
       "", {}, {}});
  add({"llama3_json_mid_answer_is_content", tools(L), "Example: " + kWeather, "Example: " + kWeather, "", {}, {}});
  add({"llama3_call_then_text", tools(L), kWeather + "\n\nDone.", "Done.", "", {{"get_weather", kWeatherArgs}},
       kLlamaMarkers});

  // --- Mistral Nemo ---
  const auto N = ToolCallFormat::MistralNemo;
  add({"nemo_no_call", tools(N), "Bonjour !", "Bonjour !", "", {}, kMistralMarkers});
  add({"nemo_one_call", tools(N),
       R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, "id": "abcdefghi"}])", "",
       "", {{"get_weather", kWeatherArgs}}, kMistralMarkers});
  add({"nemo_two_calls", tools(N), "[TOOL_CALLS][" + kWeather + ", " + kTime + "]", "", "",
       {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kMistralMarkers});
  add({"nemo_content_before", tools(N), "Sure.\n[TOOL_CALLS][" + kTricky + "]", "Sure.", "", {{"search", kTrickyArgs}},
       kMistralMarkers});
  add({"nemo_not_a_list", tools(N), "[TOOL_CALLS] I would call a tool here.", "[TOOL_CALLS] I would call a tool here.", "",
       {}, {}});

  // --- Mistral (name[ARGS]{...}) ---
  const auto M = ToolCallFormat::Mistral;
  add({"mistral_one_call", tools(M), R"([TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"})", "", "",
       {{"get_weather", kWeatherArgs}}, kMistralMarkers});
  add({"mistral_two_calls", tools(M),
       R"([TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]get_time[ARGS]{"timezone": "Europe/Paris"})",
       "", "", {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kMistralMarkers});
  add({"mistral_call_id", tools(M), R"(Looking.[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"timezone": "Europe/Paris"})",
       "Looking.", "", {{"get_time", kTimeArgs}}, kMistralMarkers});
  add({"mistral_tricky", tools(M),
       "[TOOL_CALLS]search[ARGS]" + kTricky.substr(kTricky.find("{\"q\""), kTricky.size() - kTricky.find("{\"q\"") - 1), "",
       "", {{"search", kTrickyArgs}}, kMistralMarkers});
  add({"mistral_list_form", tools(M), "[TOOL_CALLS][" + kWeather + "]", "", "", {{"get_weather", kWeatherArgs}},
       kMistralMarkers});
  add({"mistral_bad_name", tools(M), "[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS]get weather[ARGS]{}", "", {}, {}});
  auto magistral = tools(M, true);
  magistral.thinking_open = "[THINK]";
  magistral.thinking_close = "[/THINK]";
  add({"mistral_reasoning", magistral, "[THINK]Paris.[/THINK][TOOL_CALLS]get_time[ARGS]{}", "", "Paris.",
       {{"get_time", "{}"}}, plus(kMistralMarkers, {"[THINK]", "[/THINK]"})});

  // --- DeepSeek V3 / R1 ---
  const auto D = ToolCallFormat::DeepSeekV3;
  const std::string ds_call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", "
                              "\"unit\": \"celsius\"}\n```<｜tool▁call▁end｜>";
  const std::string ds_call2 =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"timezone\": \"Europe/Paris\"}\n```<｜tool▁call▁end｜>";
  add({"deepseek_one_call", tools(D), "<｜tool▁calls▁begin｜>" + ds_call + "<｜tool▁calls▁end｜>", "", "",
       {{"get_weather", kWeatherArgs}}, kDsMarkers});
  add({"deepseek_two_calls", tools(D), "<｜tool▁calls▁begin｜>" + ds_call + "\n" + ds_call2 + "<｜tool▁calls▁end｜>", "", "",
       {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kDsMarkers});
  add({"deepseek_r1_reasoning_then_call", tools(D, true, true),
       "Okay, the user wants the weather in Paris. I'll call get_weather.\n</think>\n\n<｜tool▁calls▁begin｜>" + ds_call +
           "<｜tool▁calls▁end｜>",
       "", "Okay, the user wants the weather in Paris. I'll call get_weather.", {{"get_weather", kWeatherArgs}},
       plus(kDsMarkers, kThinkMarkers)});
  add({"deepseek_content_before", tools(D), "Let me look.\n<｜tool▁calls▁begin｜>" + ds_call + "<｜tool▁calls▁end｜>",
       "Let me look.", "", {{"get_weather", kWeatherArgs}}, kDsMarkers});
  add({"deepseek_v31_form", tools(D),
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"timezone\": \"Europe/Paris\"}<｜tool▁call▁end｜><"
       "｜tool▁calls▁end｜>",
       "", "", {{"get_time", kTimeArgs}}, kDsMarkers});
  add({"deepseek_marker_variant", tools(D), "<｜tool▁calls｜>" + ds_call + "<｜tool▁calls▁end｜>", "", "",
       {{"get_weather", kWeatherArgs}}, kDsMarkers});
  add({"deepseek_tricky", tools(D),
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n" +
           kTricky.substr(kTricky.find("{\"q\""), kTricky.size() - kTricky.find("{\"q\"") - 1) +
           "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "", "", {{"search", kTrickyArgs}}, kDsMarkers});
  add({"deepseek_garbage", tools(D), "<｜tool▁calls▁begin｜>no calls after all",
       "<｜tool▁calls▁begin｜>no calls after all", "", {}, {}});

  // --- Granite 3.x ---
  const auto G = ToolCallFormat::Granite;
  add({"granite_one_call", tools(G), "<|tool_call|>[" + kWeather + "]", "", "", {{"get_weather", kWeatherArgs}},
       kToolCallTokenMarkers});
  add({"granite_two_calls", tools(G), "<|tool_call|>[" + kWeather + ",\n " + kTime + "]", "", "",
       {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kToolCallTokenMarkers});
  add({"granite_content_before", tools(G), "Checking now. <|tool_call|>[" + kTricky + "]", "Checking now.", "",
       {{"search", kTrickyArgs}}, kToolCallTokenMarkers});
  add({"granite_thinking_response", tools(G, true), "<think>Easy.</think><response>It is 4.</response>", "It is 4.",
       "Easy.", {}, plus(kToolCallTokenMarkers, {"<response>", "</response>"})});
  add({"granite_thinking_then_call", tools(G, true), "<think>Need data.</think><|tool_call|>[" + kWeather + "]", "",
       "Need data.", {{"get_weather", kWeatherArgs}}, plus(kToolCallTokenMarkers, kThinkMarkers)});
  add({"granite_malformed", tools(G), "<|tool_call|>get_weather(Paris)", "<|tool_call|>get_weather(Paris)", "", {}, {}});

  // --- Phi-4-mini ---
  const auto P = ToolCallFormat::Phi4;
  add({"phi4_one_call", tools(P), "<|tool_call|>[" + kWeather + "]<|/tool_call|>", "", "", {{"get_weather", kWeatherArgs}},
       kToolCallTokenMarkers});
  add({"phi4_two_calls_and_text", tools(P), "On it.<|tool_call|>[" + kWeather + ", " + kTime + "]<|/tool_call|>\nWait.",
       "On it.Wait.", "", {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kToolCallTokenMarkers});
  add({"phi4_unicode", tools(P), "<|tool_call|>[" + kTricky + "]<|/tool_call|>", "", "", {{"search", kTrickyArgs}},
       kToolCallTokenMarkers});

  // --- Generic ---
  const auto X = ToolCallFormat::Generic;
  add({"generic_tool_calls", tools(X),
       "{\"tool_calls\": [" + kWeather.substr(0, kWeather.size() - 1) + ", \"id\": \"call_1\"}, " + kTime + "]}", "", "",
       {{"get_weather", kWeatherArgs}, {"get_time", kTimeArgs}}, kGenericMarkers});
  add({"generic_tool_call", tools(X), "{\n  \"tool_call\": " + kTricky + "\n}", "", "", {{"search", kTrickyArgs}},
       kGenericMarkers});
  add({"generic_bare_call", tools(X), kWeather, "", "", {{"get_weather", kWeatherArgs}}, kGenericMarkers});
  add({"generic_response", tools(X), R"({"response": "Hello \"world\" \u00fc \ud83c\udf0d\n\\"})",
       "Hello \"world\" ü 🌍\n\\", "", {}, kGenericMarkers});
  add({"generic_plain_text", tools(X), "Just text.", "Just text.", "", {}, kGenericMarkers});
  add({"generic_other_json", tools(X), R"({"answer": 4})", R"({"answer": 4})", "", {}, {}});
  add({"generic_reasoning", tools(X, true), "<think>JSON it is.</think>\n{\"tool_call\": " + kWeather + "}", "",
       "JSON it is.", {{"get_weather", kWeatherArgs}}, plus(kGenericMarkers, kThinkMarkers)});
  add({"generic_bad_escape_in_response", tools(X), R"({"response": "ab\q"})", R"(ab\q"})", "", {}, {}});

  // --- None: no calls read ---
  add({"none_format", tools(ToolCallFormat::None), "<tool_call>\n" + kWeather + "\n</tool_call>",
       "<tool_call>\n" + kWeather + "\n</tool_call>", "", {}, {}});
  return cases;
}

std::string describe(const ParsedAnswer& a) {
  std::string s = "content=" + Json(a.content).dump() + " reasoning=" + Json(a.reasoning).dump() + " calls=[";
  for (const auto& c : a.tool_calls) s += c.id + ":" + c.name + "(" + c.arguments + ") ";
  return s + "]";
}

bool same(const ParsedAnswer& a, const ParsedAnswer& b) {
  if (a.content != b.content || a.reasoning != b.reasoning || a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    const auto &x = a.tool_calls[i], &y = b.tool_calls[i];
    if (x.id != y.id || x.name != y.name || x.arguments != y.arguments) return false;
  }
  return true;
}

// The deltas of one stream put together, with the rules each delta must keep.
struct Assembled {
  ParsedAnswer answer;
  std::vector<std::string> problems;

  void add(const AnswerDelta& d, const std::vector<std::string>& markers) {
    answer.content += d.content;
    answer.reasoning += d.reasoning;
    for (const auto& m : markers) {
      if (d.content.find(m) != std::string::npos) problems.push_back("marker " + m + " in content delta " + d.content);
    }
    for (const auto& c : d.calls) {
      if (c.index == static_cast<int>(answer.tool_calls.size())) {
        if (c.name.empty() || c.id.empty()) problems.push_back("a call's first delta has no name or id");
        answer.tool_calls.push_back({c.id, c.name, c.arguments});
      } else if (c.index == static_cast<int>(answer.tool_calls.size()) - 1) {
        if (!c.name.empty() || !c.id.empty()) problems.push_back("name or id repeated in a later delta");
        answer.tool_calls.back().arguments += c.arguments;
      } else {
        problems.push_back("delta for call " + std::to_string(c.index) + " out of order");
      }
    }
  }
};

// Feeds `output` in the given pieces; checks the deltas against `whole`.
void expect_stream_equals(const ParseCase& c, const std::vector<std::string_view>& pieces, const ParsedAnswer& whole,
                          const std::string& how) {
  StreamingAnswerParser parser(c.options);
  Assembled got;
  for (const auto piece : pieces) got.add(parser.push(piece), c.markers);
  got.add(parser.finish(), c.markers);
  EXPECT_TRUE(got.problems.empty()) << c.name << " " << how << ": " << got.problems.front();
  EXPECT_TRUE(same(got.answer, whole)) << c.name << " " << how << "\n  stream: " << describe(got.answer)
                                       << "\n  whole:  " << describe(whole);
  EXPECT_TRUE(same(parser.answer(), whole)) << c.name << " " << how << " answer(): " << describe(parser.answer());
}

void PrintTo(const ParseCase& c, std::ostream* os) { *os << c.name << ": " << Json(c.output).dump(); }

class ParseCases : public ::testing::TestWithParam<ParseCase> {};

TEST_P(ParseCases, WholeOutput) {
  const auto& c = GetParam();
  const auto got = m40::chat::parse_answer(c.options, c.output);
  EXPECT_EQ(got.content, c.content);
  EXPECT_EQ(got.reasoning, c.reasoning);
  ASSERT_EQ(got.tool_calls.size(), c.calls.size()) << describe(got);
  std::set<std::string> ids;
  const std::regex id_form(c.options.tool_format == ToolCallFormat::MistralNemo ? "[A-Za-z0-9]{9}"
                                                                               : "call_[A-Za-z0-9]{24}");
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, c.calls[i].name);
    EXPECT_EQ(got.tool_calls[i].arguments, c.calls[i].arguments);
    const auto parsed = Json::parse(got.tool_calls[i].arguments);
    EXPECT_TRUE(parsed.is_object());
    EXPECT_EQ(parsed.dump(), Json::parse(c.calls[i].arguments).dump());
    EXPECT_TRUE(std::regex_match(got.tool_calls[i].id, id_form)) << got.tool_calls[i].id;
    ids.insert(got.tool_calls[i].id);
  }
  EXPECT_EQ(ids.size(), c.calls.size()) << "ids are unique within an answer";
  for (const auto& m : c.markers) EXPECT_EQ(got.content.find(m), std::string::npos) << m;
}

TEST_P(ParseCases, StreamedSplitAtEveryByte) {
  const auto& c = GetParam();
  const auto whole = m40::chat::parse_answer(c.options, c.output);
  const std::string_view out = c.output;
  for (size_t split = 0; split <= out.size(); ++split) {
    expect_stream_equals(c, {out.substr(0, split), out.substr(split)}, whole, "split at " + std::to_string(split));
    if (HasFailure()) return;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < out.size(); ++i) bytes.push_back(out.substr(i, 1));
  expect_stream_equals(c, bytes, whole, "byte by byte");
}

TEST_P(ParseCases, StreamedInRandomPieces) {
  const auto& c = GetParam();
  const auto whole = m40::chat::parse_answer(c.options, c.output);
  const std::string_view out = c.output;
  std::mt19937 rng(7);
  for (int round = 0; round < 50 && !HasFailure(); ++round) {
    std::vector<std::string_view> pieces;
    for (size_t i = 0; i < out.size();) {
      const size_t n = std::min<size_t>(out.size() - i, 1 + rng() % 12);
      pieces.push_back(out.substr(i, n));
      i += n;
    }
    expect_stream_equals(c, pieces, whole, "random round " + std::to_string(round));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ParseCases, ::testing::ValuesIn(parse_cases()),
                         [](const ::testing::TestParamInfo<ParseCase>& p) { return p.param.name; });

// ---------------------------------------------------------------------------
// Streaming behaviour beyond the final result.

std::vector<AnswerDelta> feed(StreamingAnswerParser& parser, const std::vector<std::string>& pieces) {
  std::vector<AnswerDelta> out;
  for (const auto& p : pieces) out.push_back(parser.push(p));
  return out;
}

TEST(ToolCallStreaming, PlainTextIsNotHeldBack) {
  StreamingAnswerParser parser(tools(ToolCallFormat::Hermes));
  EXPECT_EQ(parser.push("The answer").content, "The answer");
  EXPECT_EQ(parser.push(" is 4.").content, " is 4.");
  // What may start a marker waits, with the whitespace before it.
  EXPECT_EQ(parser.push(" <").content, "");
  EXPECT_EQ(parser.push("tool").content, "");
  EXPECT_EQ(parser.push("s>").content, " <tools>");
  EXPECT_EQ(parser.push("\n").content, "");
  EXPECT_EQ(parser.finish().content, "\n");
}

TEST(ToolCallStreaming, ArgumentsArriveInPiecesAfterTheName) {
  StreamingAnswerParser parser(tools(ToolCallFormat::Hermes));
  const auto d = feed(parser, {"<tool_call>\n{\"name\": \"get_", "weather\", ", "\"arguments\": {\"ci", "ty\": \"Pa",
                               "ris\"}}", "\n</tool_call>"});
  EXPECT_TRUE(d[0].empty());
  EXPECT_TRUE(d[1].empty());  // the name is known, the arguments not yet started
  ASSERT_EQ(d[2].calls.size(), 1u);
  EXPECT_EQ(d[2].calls[0].index, 0);
  EXPECT_EQ(d[2].calls[0].name, "get_weather");
  EXPECT_FALSE(d[2].calls[0].id.empty());
  EXPECT_EQ(d[2].calls[0].arguments, "{\"ci");
  ASSERT_EQ(d[3].calls.size(), 1u);
  EXPECT_EQ(d[3].calls[0].name, "");
  EXPECT_EQ(d[3].calls[0].arguments, "ty\":\"Pa");
  EXPECT_EQ(d[4].calls[0].arguments, "ris\"}");
  EXPECT_TRUE(d[5].empty());
  EXPECT_TRUE(parser.finish().empty());
  ASSERT_EQ(parser.answer().tool_calls.size(), 1u);
  EXPECT_EQ(parser.answer().tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(parser.answer().content, "");
}

TEST(ToolCallStreaming, ReasoningStreamsAsItComes) {
  StreamingAnswerParser parser(tools(ToolCallFormat::Hermes, true));
  EXPECT_EQ(parser.push("<think>\n").reasoning, "");
  EXPECT_EQ(parser.push("First,").reasoning, "First,");
  EXPECT_EQ(parser.push(" add.\n").reasoning, " add.");
  EXPECT_EQ(parser.push("</th").reasoning, "");
  const auto d = parser.push("ink>\n\n4");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "4");
  EXPECT_EQ(parser.answer().reasoning, "First, add.");
}

// A call whose name was sent and that then breaks cannot be taken back: the
// deltas keep it, the final answer gives its text as content, and the stream
// sends that text as content too.
TEST(ToolCallStreaming, CallBrokenAfterItsNameWasSent) {
  for (const std::string tail : {"", "]}\n</tool_call> and more"}) {
    SCOPED_TRACE(tail);
    const std::string output = "Hi.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"" + tail;
    StreamingAnswerParser parser(tools(ToolCallFormat::Hermes));
    Assembled got;
    const size_t cut = output.find("\"Paris");
    got.add(parser.push(output.substr(0, cut)), {});
    got.add(parser.push(output.substr(cut)), {});
    got.add(parser.finish(), {});
    ASSERT_EQ(got.answer.tool_calls.size(), 1u);
    EXPECT_EQ(got.answer.tool_calls[0].name, "get_weather");
    EXPECT_TRUE(parser.answer().tool_calls.empty());
    EXPECT_EQ(parser.answer().content, output);
    EXPECT_EQ(got.answer.content, parser.answer().content);
    const auto whole = m40::chat::parse_answer(tools(ToolCallFormat::Hermes), output);
    EXPECT_TRUE(same(whole, parser.answer()));
  }
}

TEST(ToolCallStreaming, CallIdsAreRandomUnlessSeeded) {
  const std::string two = "<tool_call>" + kWeather + "</tool_call><tool_call>" + kTime + "</tool_call>";
  const auto a = m40::chat::parse_answer(ToolCallFormat::Hermes, two, true, false);
  const auto b = m40::chat::parse_answer(ToolCallFormat::Hermes, two, true, false);
  ASSERT_EQ(a.tool_calls.size(), 2u);
  ASSERT_EQ(b.tool_calls.size(), 2u);
  EXPECT_NE(a.tool_calls[0].id, a.tool_calls[1].id);
  EXPECT_NE(a.tool_calls[0].id, b.tool_calls[0].id);
  const auto nemo = m40::chat::parse_answer(ToolCallFormat::MistralNemo, "[TOOL_CALLS][" + kWeather + "]", true, false);
  ASSERT_EQ(nemo.tool_calls.size(), 1u);
  EXPECT_TRUE(std::regex_match(nemo.tool_calls[0].id, std::regex("[A-Za-z0-9]{9}")));
}

TEST(ToolCallStreaming, NothingAfterFinish) {
  StreamingAnswerParser parser(tools(ToolCallFormat::Llama3));
  EXPECT_TRUE(parser.push("{\"na").empty());
  const auto end = parser.finish();
  EXPECT_EQ(end.content, "{\"na");
  EXPECT_TRUE(parser.push("more").empty());
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_EQ(parser.answer().content, "{\"na");
}

// ---------------------------------------------------------------------------
// The families' own templates write an assistant turn with tool calls; the
// parser, told the family by template_traits, reads that turn back.

struct RenderedTurn {
  std::string template_name;
  Json assistant;          // the assistant message with tool_calls
  Json variables;          // extra template variables
  std::string turn_start;  // the last assistant turn starts after this
  std::string turn_end;    // and ends before this (or at the end)
  std::vector<Call> calls;
  std::string content;
  std::string reasoning;
};

TEST(ToolCallTemplates, EachFamilyReadsBackItsTemplatesToolCallTurn) {
  const Json weather_obj = Json::parse(R"({"city": "Zürich \"Altstadt\"", "unit": "celsius"})");
  const Json time_obj = Json::parse(R"({"timezone": "Europe/Paris"})");
  const std::string weather_args = R"({"city":"Zürich \"Altstadt\"","unit":"celsius"})";
  const std::string time_args = R"({"timezone":"Europe/Paris"})";
  const auto tool_call = [](const std::string& id, const std::string& name, const Json& args) {
    return Json{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
  };
  const Json two_calls = Json::array({tool_call("abcdefghi", "get_weather", weather_obj),
                                      tool_call("jklmnopqr", "get_time", time_obj)});
  const std::vector<RenderedTurn> turns = {
      {"Qwen-Qwen2.5-7B-Instruct",
       {{"role", "assistant"}, {"content", "Checking both."}, {"tool_calls", two_calls}},
       Json::object(), "<|im_start|>assistant\n", "<|im_end|>",
       {{"get_weather", weather_args}, {"get_time", time_args}}, "Checking both.", ""},
      {"Qwen-Qwen3-0.6B",
       {{"role", "assistant"}, {"content", ""}, {"reasoning_content", "Two lookups."}, {"tool_calls", two_calls}},
       Json::object(), "<|im_start|>assistant\n", "<|im_end|>",
       {{"get_weather", weather_args}, {"get_time", time_args}}, "", "Two lookups."},
      {"mistralai-Mistral-Nemo-Instruct-2407",
       {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", two_calls}},
       Json::object(), "[/INST]", "</s>",
       {{"get_weather", weather_args}, {"get_time", time_args}}, "", ""},
      {"meta-llama-Llama-3.1-8B-Instruct",
       {{"role", "assistant"}, {"content", nullptr},
        {"tool_calls", Json::array({tool_call("x", "get_weather", weather_obj)})}},
       Json::object(), "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
       {{"get_weather", weather_args}}, "", ""},
      {"meta-llama-Llama-3.1-8B-Instruct",
       {{"role", "assistant"}, {"content", nullptr},
        {"tool_calls", Json::array({tool_call("x", "brave_search", Json{{"query", "weather in Zürich"}})})}},
       Json{{"builtin_tools", Json::array({"brave_search", "wolfram_alpha"})}},
       "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eom_id|>",
       {{"brave_search", R"({"query":"weather in Zürich"})"}}, "", ""},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
       {{"role", "assistant"}, {"content", nullptr},
        {"tool_calls", Json::array({tool_call("x", "get_weather", weather_obj.dump())})}},
       Json::object(), "<｜Assistant｜>", "<｜end▁of▁sentence｜>",
       {{"get_weather", weather_args}}, "", ""},
  };
  const Json tool_defs = Json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  for (const auto& t : turns) {
    SCOPED_TRACE(t.template_name);
    const std::string source = read_file(templates_dir() / (t.template_name + ".jinja"));
    const auto traits = m40::chat::template_traits(source);
    m40::chat::ChatTemplate tpl(source);
    m40::chat::RenderOptions options;
    options.add_generation_prompt = false;
    options.bos_token = "<s>";
    options.eos_token = t.template_name.find("Mistral") != std::string::npos ? "</s>" : "";
    options.tools = tool_defs;
    options.extra_variables = t.variables;
    options.now = m40::chat::DateTime{};
    const Json messages = Json::array({{{"role", "user"}, {"content", "Weather and time, please."}}, t.assistant});
    const std::string prompt = tpl.render(messages, options);
    const size_t start = prompt.rfind(t.turn_start);
    ASSERT_NE(start, std::string::npos) << prompt;
    std::string turn = prompt.substr(start + t.turn_start.size());
    turn = turn.substr(0, turn.find(t.turn_end));
    AnswerOptions o = tools(traits.tool_format, traits.has_thinking);
    const auto got = m40::chat::parse_answer(o, turn);
    EXPECT_EQ(got.content, t.content) << Json(turn).dump();
    EXPECT_EQ(got.reasoning, t.reasoning) << Json(turn).dump();
    ASSERT_EQ(got.tool_calls.size(), t.calls.size()) << Json(turn).dump();
    for (size_t i = 0; i < t.calls.size(); ++i) {
      EXPECT_EQ(got.tool_calls[i].name, t.calls[i].name);
      EXPECT_EQ(got.tool_calls[i].arguments, t.calls[i].arguments);
    }
  }
}

// Text that cannot be decoded never throws: it stays content, or is replaced in the arguments.
TEST(ToolCallStreaming, InvalidUtf8NeverThrows) {
  const auto bad_name = m40::chat::parse_answer(tools(ToolCallFormat::Hermes),
                                                "<tool_call>{\"name\": \"a\xff\", \"arguments\": {}}</tool_call>");
  EXPECT_TRUE(bad_name.tool_calls.empty());
  EXPECT_EQ(bad_name.content, "<tool_call>{\"name\": \"a\xff\", \"arguments\": {}}</tool_call>");
  const auto bad_key = m40::chat::parse_answer(tools(ToolCallFormat::Hermes), "<tool_call>{\"\xfe\": 1}");
  EXPECT_TRUE(bad_key.tool_calls.empty());
  const auto builtin = m40::chat::parse_answer(tools(ToolCallFormat::Llama3), "<|python_tag|>f.call(q=\"\xff\")");
  ASSERT_EQ(builtin.tool_calls.size(), 1u);
  EXPECT_EQ(builtin.tool_calls[0].arguments, "{\"q\":\"\xef\xbf\xbd\"}");
  const auto response = m40::chat::parse_answer(tools(ToolCallFormat::Generic), "{\"response\": \"\\ud800x\"}");
  EXPECT_TRUE(response.tool_calls.empty());
}

// Random texts made of each family's fragments: whatever the text, the stream
// (in any pieces) gives the content and reasoning of the whole parse, every
// call of the whole parse with the same id, name and arguments, and never a
// call delta without its name first.
TEST(ToolCallStreaming, RandomFragmentsStreamLikeTheWhole) {
  const std::vector<std::string> common = {
      "{", "}", "[", "]", "\"name\"", ": ", "\"get_weather\"", ", ", "\"arguments\"", "\"parameters\"",
      "{\"city\": \"Paris\"}", "\"", "\\", "\n", " ", "Hello", "ü🌍", "<think>", "</think>", ";", "<", "|",
      "1", "-2.5e3", "null", "true", ",", ":", "\"id\": \"abc\"", "\"type\": \"function\"", "x"};
  const std::map<ToolCallFormat, std::vector<std::string>> extra = {
      {ToolCallFormat::Hermes, {"<tool_call>", "</tool_call>", "<tool_call>\n", "<tool"}},
      {ToolCallFormat::Llama3, {"<|python_tag|>", "brave_search.call(query=\"a\")", ".call(", "print(1)", "<|py"}},
      {ToolCallFormat::MistralNemo, {"[TOOL_CALLS]", "[TOOL_CALLS][", "[TOOL"}},
      {ToolCallFormat::Mistral, {"[TOOL_CALLS]", "get_time", "[ARGS]", "[CALL_ID]", "a1b2c3d4e", "[AR"}},
      {ToolCallFormat::DeepSeekV3,
       {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function<｜tool▁sep｜>", "<｜tool▁sep｜>", "get_time\n",
        "```json\n", "\n```", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁"}},
      {ToolCallFormat::Granite, {"<|tool_call|>", "<|tool_call|>[", "<response>", "</response>", "<|tool"}},
      {ToolCallFormat::Phi4, {"<|tool_call|>", "<|tool_call|>[", "]<|/tool_call|>", "<|/tool_call|>"}},
      {ToolCallFormat::Generic, {"{\"tool_calls\": [", "{\"tool_call\": ", "{\"response\": \"", "\\u00e9", "\\ud83c"}},
  };
  std::mt19937 rng(1234);
  int calls_seen = 0;
  for (const auto& [format, own] : extra) {
    auto fragments = common;
    for (int i = 0; i < 3; ++i) fragments.insert(fragments.end(), own.begin(), own.end());
    for (int round = 0; round < 400; ++round) {
      for (const bool thinking : {false, true}) {
        std::string text;
        // Often start with a call, so that calls are made and broken in every way.
        if (rng() % 2 == 0) text = own[0] + (format == ToolCallFormat::Mistral ? "get_time[ARGS]" : "");
        const size_t n = 1 + rng() % 24;
        for (size_t i = 0; i < n; ++i) text += fragments[rng() % fragments.size()];
        ParseCase c{"random", tools(format, thinking), text, "", "", {}, {}};
        ParsedAnswer whole;
        ASSERT_NO_THROW(whole = m40::chat::parse_answer(c.options, text)) << text;
        calls_seen += static_cast<int>(whole.tool_calls.size());
        for (int split_round = 0; split_round < 3; ++split_round) {
          std::vector<std::string_view> pieces;
          for (size_t i = 0; i < text.size();) {
            const size_t len = split_round == 0 ? 1 : std::min<size_t>(text.size() - i, 1 + rng() % 9);
            pieces.push_back(std::string_view(text).substr(i, len));
            i += len;
          }
          StreamingAnswerParser parser(c.options);
          Assembled got;
          for (const auto piece : pieces) got.add(parser.push(piece), {});
          got.add(parser.finish(), {});
          ASSERT_TRUE(got.problems.empty()) << Json(text).dump() << ": " << got.problems.front();
          ASSERT_TRUE(same(parser.answer(), whole)) << Json(text).dump() << "\n  stream answer(): "
                                                    << describe(parser.answer()) << "\n  whole: " << describe(whole);
          ASSERT_EQ(got.answer.content, whole.content) << Json(text).dump();
          ASSERT_EQ(got.answer.reasoning, whole.reasoning) << Json(text).dump();
          std::map<std::string, const ToolCall*> streamed;
          for (const auto& call : got.answer.tool_calls) streamed[call.id] = &call;
          for (const auto& call : whole.tool_calls) {
            ASSERT_TRUE(streamed.count(call.id)) << Json(text).dump();
            EXPECT_EQ(streamed[call.id]->name, call.name);
            EXPECT_EQ(streamed[call.id]->arguments, call.arguments);
            EXPECT_TRUE(Json::accept(call.arguments) && Json::parse(call.arguments).is_object()) << call.arguments;
          }
        }
      }
    }
  }
  EXPECT_GT(calls_seen, 500) << "the random texts should make many calls";
}

}  // namespace

namespace {

// ---------------------------------------------------------------------------
// Forced-call grammars: the text each family writes for a call matches, a
// wrong name or arguments outside the schema do not, and what matches reads
// back as the call.

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather, e.g. \"Zürich\".",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
     "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
     "timezone": {"type": "string"}}, "required": ["timezone"]}}},
  {"type": "function", "function": {"name": "ping"}}
])");

// One call as the family writes it (the layout the grammar forces).
std::string call_text(ToolCallFormat f, const std::string& name, const std::string& args, bool first) {
  const std::string q = Json(name).dump();
  switch (f) {
    case ToolCallFormat::Hermes:
      return std::string(first ? "" : "\n") + "<tool_call>\n{\"name\": " + q + ", \"arguments\": " + args + "}\n</tool_call>";
    case ToolCallFormat::Llama3: return std::string(first ? "" : "; ") + "{\"name\": " + q + ", \"parameters\": " + args + "}";
    case ToolCallFormat::MistralNemo:
      return std::string(first ? "" : ", ") + "{\"name\": " + q + ", \"arguments\": " + args + ", \"id\": \"a1B2c3D4e\"}";
    case ToolCallFormat::Mistral: return "[TOOL_CALLS]" + name + "[ARGS]" + args;
    case ToolCallFormat::DeepSeekV3:
      return std::string(first ? "" : "\n") + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + args +
             "\n```<｜tool▁call▁end｜>";
    case ToolCallFormat::Granite:
    case ToolCallFormat::Phi4:
    case ToolCallFormat::Generic:
      return std::string(first ? "" : ", ") + "{\"name\": " + q + ", \"arguments\": " + args + "}";
    case ToolCallFormat::None: break;
  }
  return {};
}

std::string answer_text(ToolCallFormat f, const std::vector<Call>& calls, bool parallel) {
  std::string inner;
  for (size_t i = 0; i < calls.size(); ++i) inner += call_text(f, calls[i].name, calls[i].arguments, i == 0);
  switch (f) {
    case ToolCallFormat::MistralNemo: return "[TOOL_CALLS][" + inner + "]";
    case ToolCallFormat::DeepSeekV3: return "<｜tool▁calls▁begin｜>" + inner + "<｜tool▁calls▁end｜>";
    case ToolCallFormat::Granite: return "<|tool_call|>[" + inner + "]";
    case ToolCallFormat::Phi4: return "<|tool_call|>[" + inner + "]<|/tool_call|>";
    case ToolCallFormat::Generic: return parallel ? "{\"tool_calls\": [" + inner + "]}" : "{\"tool_call\": " + inner + "}";
    default: return inner;
  }
}

const std::vector<ToolCallFormat> kCallFormats = {
    ToolCallFormat::Hermes, ToolCallFormat::Llama3, ToolCallFormat::MistralNemo, ToolCallFormat::Mistral,
    ToolCallFormat::DeepSeekV3, ToolCallFormat::Granite, ToolCallFormat::Phi4, ToolCallFormat::Generic};

bool grammar_matches(const std::string& gbnf, const std::string& text) {
  return m40::grammar::GrammarMatcher::matches(m40::grammar::parse_gbnf(gbnf), text);
}

const Call kParisCall = {"get_weather", R"({"city":"Paris","unit":"celsius"})"};
const Call kTimeCall = {"get_time", R"({"timezone":"Europe/Paris"})"};

TEST(ToolCallGrammar, EachFamilysCallMatchesAndReadsBack) {
  for (const auto f : kCallFormats) {
    SCOPED_TRACE(std::string(m40::chat::tool_call_format_name(f)));
    const auto gbnf = m40::chat::forced_tool_call_grammar(f, kTools, std::nullopt, false);
    ASSERT_NO_THROW(m40::grammar::parse_gbnf(gbnf)) << gbnf;
    for (const auto& call : {kParisCall, kTimeCall, Call{"get_weather", R"({"city":"Grüße \"世界\""})"},
                             Call{"ping", "{}"}}) {
      const std::string text = answer_text(f, {call}, false);
      EXPECT_TRUE(grammar_matches(gbnf, text)) << text << "\n" << gbnf;
      const auto back = m40::chat::parse_answer(tools(f), text);
      ASSERT_EQ(back.tool_calls.size(), 1u) << text;
      EXPECT_EQ(back.tool_calls[0].name, call.name);
      EXPECT_EQ(Json::parse(back.tool_calls[0].arguments), Json::parse(call.arguments));
      EXPECT_EQ(back.content, "");
    }
    // A function not offered, arguments outside the schema, text around the call.
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {{"get_wether", R"({"city":"Paris"})"}}, false)));
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {{"get_weather", R"({"unit":"celsius"})"}}, false)));
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {{"get_weather", R"({"city":"Paris","unit":"kelvin"})"}}, false)));
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {{"get_weather", R"({"city":7})"}}, false)));
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {{"get_time", R"({"city":"Paris"})"}}, false)));
    EXPECT_FALSE(grammar_matches(gbnf, "Sure. " + answer_text(f, {kParisCall}, false)));
    // One call only unless parallel.
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {kParisCall, kTimeCall}, false)));
  }
}

TEST(ToolCallGrammar, ParallelCalls) {
  for (const auto f : kCallFormats) {
    SCOPED_TRACE(std::string(m40::chat::tool_call_format_name(f)));
    const auto gbnf = m40::chat::forced_tool_call_grammar(f, kTools, std::nullopt, true);
    for (const auto& calls : std::vector<std::vector<Call>>{{kParisCall}, {kParisCall, kTimeCall},
                                                            {kTimeCall, kParisCall, kTimeCall}}) {
      const std::string text = answer_text(f, calls, true);
      EXPECT_TRUE(grammar_matches(gbnf, text)) << text;
      const auto back = m40::chat::parse_answer(tools(f), text);
      ASSERT_EQ(back.tool_calls.size(), calls.size()) << text;
      for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(back.tool_calls[i].name, calls[i].name);
    }
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {kParisCall, {"nope", "{}"}}, true)));
  }
}

TEST(ToolCallGrammar, OnlyTheNamedFunction) {
  for (const auto f : kCallFormats) {
    SCOPED_TRACE(std::string(m40::chat::tool_call_format_name(f)));
    const auto gbnf = m40::chat::forced_tool_call_grammar(f, kTools, "get_time", false);
    EXPECT_TRUE(grammar_matches(gbnf, answer_text(f, {kTimeCall}, false)));
    EXPECT_FALSE(grammar_matches(gbnf, answer_text(f, {kParisCall}, false)));
  }
}

TEST(ToolCallGrammar, RefusesWhatCannotBeForced) {
  EXPECT_THROW(m40::chat::forced_tool_call_grammar(ToolCallFormat::None, kTools, std::nullopt, false), m40::Error);
  EXPECT_THROW(m40::chat::forced_tool_call_grammar(ToolCallFormat::Hermes, kTools, "launch", false), m40::Error);
  EXPECT_THROW(m40::chat::forced_tool_call_grammar(ToolCallFormat::Hermes, Json::array(), std::nullopt, false),
               m40::Error);
}

}  // namespace

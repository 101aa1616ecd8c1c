// Tools and structured output through the server, on tiny random-weight
// models served with a real tool-calling chat template (--chat-template-file):
// random weights call no tools and write no JSON by themselves, so every
// valid call and document here is the grammar's doing. Checked:
//   - response_format json_schema / json_object, Ollama format, llama.cpp
//     json_schema and grammar: the answer parses and obeys the schema, for
//     many seeds, whole and streamed;
//   - tool_choice "required" or a named function: the answer is a tool call
//     (message.tool_calls, finish_reason "tool_calls"), its arguments valid
//     under the function's schema; streamed as delta.tool_calls with the
//     name first; Ollama's message.tool_calls with object arguments;
//   - the tools and a tool-call history reach the template (the prompt is
//     the template's own rendering of them);
//   - refusals: a model whose template has no tools, an unknown forced
//     function, a bad grammar or schema, think on a template without it;
//   - /api/show capabilities.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "chat/chat_template.h"
#include "event_streams.h"
#include "in_process_server.h"
#include "test_paths.h"
#include "tokenizer/vocab.h"

using namespace m40;
using json = nlohmann::ordered_json;

namespace {

std::filesystem::path qwen2_model() { return test::shared_model("arch/tiny-qwen2-F32.gguf"); }
std::filesystem::path template_file(const std::string& name) {
  return test::shared_dir() / "templates" / (name + ".jinja");
}
std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const json kWeatherTool = json::parse(R"({
  "type": "function",
  "function": {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
      "type": "object",
      "properties": {
        "city": {"type": "string", "maxLength": 6},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
      },
      "required": ["city", "unit"],
      "additionalProperties": false
    }
  }
})");
const json kTimeTool = json::parse(R"({
  "type": "function",
  "function": {
    "name": "get_time",
    "parameters": {
      "type": "object",
      "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
      "required": ["zone"]
    }
  }
})");

// A schema whose every value is bounded, so a random model ends it in time.
const json kPersonSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 5},
    "alive": {"type": "boolean"},
    "kind": {"enum": ["cat", "dog", 3]},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 1, "maxItems": 3}
  },
  "required": ["name", "alive", "kind", "tags"],
  "additionalProperties": false
})");

void expect_person(const std::string& text) {
  json v;
  ASSERT_NO_THROW(v = json::parse(text)) << text;
  ASSERT_TRUE(v.is_object()) << text;
  EXPECT_EQ(v.size(), 4u) << text;
  ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << text;
  const auto name_length = v["name"].get<std::string>().size();
  EXPECT_TRUE(name_length >= 1) << text;  // up to 5 characters: up to 20 bytes
  EXPECT_TRUE(v["alive"].is_boolean()) << text;
  EXPECT_TRUE(v["kind"] == "cat" || v["kind"] == "dog" || v["kind"] == 3) << text;
  ASSERT_TRUE(v["tags"].is_array()) << text;
  EXPECT_GE(v["tags"].size(), 1u);
  EXPECT_LE(v["tags"].size(), 3u);
  for (const auto& t : v["tags"]) EXPECT_TRUE(t == "a" || t == "b") << text;
}

void expect_weather_arguments(const json& args) {
  ASSERT_TRUE(args.is_object()) << args.dump();
  EXPECT_EQ(args.size(), 2u) << args.dump();
  ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << args.dump();
  EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << args.dump();
}

using test::sse_data;

class StructuredAnswerTest : public test::InProcessServerTest {
 protected:
  std::vector<std::filesystem::path> required_models() const override {
    return {qwen2_model(), template_file("Qwen-Qwen2.5-7B-Instruct")};
  }
  void SetUp() override {
    InProcessServerTest::SetUp();
    if (IsSkipped()) return;
    start("Qwen-Qwen2.5-7B-Instruct");
  }
  void start(const std::string& template_name, const std::filesystem::path& model = qwen2_model()) {
    server::ServerOptions o;
    o.allow_paths = true;
    o.n_ctx = 1024;
    o.parallel = 2;
    if (!template_name.empty()) o.chat_template = read_file(template_file(template_name));
    start_server(o, model);
  }
  json chat(json body, int status = 200) const {
    body["messages"] = json::array({{{"role", "user"}, {"content", "What is it like in Paris?"}}});
    auto r = client(120).Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r) << "no answer";
    if (!r) return nullptr;
    EXPECT_EQ(r->status, status) << r->body;
    return json::parse(r->body);
  }
};

TEST_F(StructuredAnswerTest, JsonSchemaResponseFormatIsObeyedForEverySeed) {
  for (int seed = 0; seed < 6; ++seed) {
    const json r = chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", kPersonSchema}}}}},
                         {"temperature", 1.0}, {"seed", seed}, {"max_tokens", 200}});
    ASSERT_FALSE(r.is_null());
    const auto& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "stop") << r.dump();
    expect_person(choice["message"]["content"].get<std::string>());
  }
}

TEST_F(StructuredAnswerTest, JsonSchemaStreamedAddsUpToAValidDocument) {
  json body = {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", kPersonSchema}}}}},
               {"temperature", 1.0}, {"seed", 7}, {"max_tokens", 200}, {"stream", true}};
  body["messages"] = json::array({{{"role", "user"}, {"content", "Describe a pet."}}});
  auto r = client(120).Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  std::string finish;
  for (const auto& data : sse_data(r->body)) {
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    for (const auto& c : chunk["choices"]) {
      if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  EXPECT_EQ(finish, "stop");
  expect_person(text);
}

TEST_F(StructuredAnswerTest, LlamaCppGrammarAndJsonSchemaFields) {
  for (int seed = 0; seed < 4; ++seed) {
    const json r = chat({{"grammar", "root ::= (\"yes\" | \"no\") \"!\""}, {"temperature", 1.0}, {"seed", seed}});
    const std::string content = r["choices"][0]["message"]["content"];
    EXPECT_TRUE(content == "yes!" || content == "no!") << content;
  }
  const json r = chat({{"json_schema", kPersonSchema}, {"temperature", 1.0}, {"seed", 3}, {"max_tokens", 200}});
  expect_person(r["choices"][0]["message"]["content"]);
  // Completions too, on a raw prompt.
  auto c = client(120).Post("/v1/completions",
                            json({{"prompt", "Answer:"}, {"grammar", "root ::= [0-9]{3}"}, {"temperature", 1.0}}).dump(),
                            "application/json");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  const std::string digits = json::parse(c->body)["choices"][0]["text"];
  ASSERT_EQ(digits.size(), 3u) << digits;
  for (char ch : digits) EXPECT_TRUE(ch >= '0' && ch <= '9') << digits;
}

TEST_F(StructuredAnswerTest, RequiredToolChoiceGivesAValidCall) {
  for (int seed = 0; seed < 5; ++seed) {
    const json r = chat({{"tools", json::array({kWeatherTool, kTimeTool})}, {"tool_choice", "required"},
                         {"parallel_tool_calls", false}, {"temperature", 1.0}, {"seed", seed}, {"max_tokens", 300}});
    const auto& choice = r["choices"][0];
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
    const auto& message = choice["message"];
    EXPECT_TRUE(message["content"].is_null()) << r.dump();
    ASSERT_EQ(message["tool_calls"].size(), 1u) << r.dump();
    const auto& call = message["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_TRUE(call["id"].is_string() && !call["id"].get<std::string>().empty());
    const std::string name = call["function"]["name"];
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    if (name == "get_weather") {
      expect_weather_arguments(args);
    } else {
      ASSERT_EQ(name, "get_time") << r.dump();
      EXPECT_TRUE(args["zone"] == "UTC" || args["zone"] == "CET") << args.dump();
    }
  }
}

TEST_F(StructuredAnswerTest, NamedToolChoiceCallsThatFunctionAndStreamsNameFirst) {
  json body = {{"tools", json::array({kTimeTool, kWeatherTool})},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
               {"parallel_tool_calls", false}, {"temperature", 1.0}, {"seed", 11}, {"max_tokens", 300}, {"stream", true}};
  body["messages"] = json::array({{{"role", "user"}, {"content", "Weather?"}}});
  auto r = client(120).Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string name;
  std::string arguments;
  std::string finish;
  bool arguments_before_name = false;
  for (const auto& data : sse_data(r->body)) {
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    for (const auto& c : chunk["choices"]) {
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      if (!c["delta"].contains("tool_calls")) continue;
      for (const auto& call : c["delta"]["tool_calls"]) {
        EXPECT_EQ(call["index"], 0);
        if (call["function"].contains("name")) name += call["function"]["name"].get<std::string>();
        const std::string piece = call["function"].value("arguments", "");
        if (!piece.empty() && name.empty()) arguments_before_name = true;
        arguments += piece;
      }
    }
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_FALSE(arguments_before_name);
  EXPECT_EQ(finish, "tool_calls");
  expect_weather_arguments(json::parse(arguments));
}

TEST_F(StructuredAnswerTest, OllamaFormatAndToolCalls) {
  json body = {{"model", qwen2_model().string()}, {"stream", false}, {"format", kPersonSchema},
               {"options", {{"temperature", 1.0}, {"seed", 5}, {"num_predict", 200}}},
               {"messages", json::array({{{"role", "user"}, {"content", "A pet?"}}})}};
  auto r = client(120).Post("/api/chat", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  expect_person(json::parse(r->body)["message"]["content"]);

  body["format"] = "json";
  body["stream"] = true;
  r = client(120).Post("/api/chat", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) text += json::parse(line)["message"]["content"].get<std::string>();
  }
  json doc;
  const bool finished = !text.empty() && text.back() == '}';
  if (finished) {
    EXPECT_NO_THROW(doc = json::parse(text)) << text;
    EXPECT_TRUE(doc.is_object()) << text;
  } else {
    // The token limit cut a long string short: what came is a document's beginning.
    EXPECT_EQ(text.front(), '{') << text;
  }
}

TEST_F(StructuredAnswerTest, ToolsAndAToolCallHistoryReachTheTemplate) {
  const json tools = json::array({kWeatherTool});
  const json history = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}
  ])");
  json body = {{"messages", history}, {"tools", tools}, {"max_tokens", 1}, {"temperature", 0}};
  auto r = client(120).Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  // The template's own rendering, with the arguments as an object (as
  // transformers' apply_chat_template takes them).
  json for_template = history;
  for_template[1]["content"] = "";
  for_template[1]["tool_calls"][0]["function"]["arguments"] = json{{"city", "Paris"}, {"unit", "celsius"}};
  chat::ChatTemplate tpl(read_file(template_file("Qwen-Qwen2.5-7B-Instruct")));
  chat::RenderOptions o;
  o.tools = tools;
  const std::string expected = tpl.render(for_template, o);
  EXPECT_NE(expected.find("<tools>"), std::string::npos);
  EXPECT_NE(expected.find("<tool_response>"), std::string::npos);
  EXPECT_NE(expected.find("\"city\": \"Paris\""), std::string::npos);
  const auto vocab = tokenizer::Vocab::from_file(qwen2_model().string());
  tokenizer::EncodeOptions enc;
  enc.add_special = false;
  enc.parse_special = true;
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"].get<size_t>(), vocab.encode(expected, enc).size());
}

TEST_F(StructuredAnswerTest, RefusalsNameWhatIsWrong) {
  auto expect_400 = [&](json body, const std::string& words) {
    const json r = chat(std::move(body), 400);
    EXPECT_NE(r.dump().find(words), std::string::npos) << r.dump();
  };
  expect_400({{"tools", json::array({kWeatherTool})}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
             "nope");
  expect_400({{"tool_choice", "required"}}, "tools");
  expect_400({{"grammar", "root ::= missing"}}, "grammar");
  expect_400({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"}, {"not", {{"const", "x"}}}}}}}}}},
             "not");
  expect_400({{"response_format", {{"type", "xml"}}}}, "response_format");
  expect_400({{"functions", json::array({kWeatherTool["function"]})}}, "functions");

  // Thinking on a template without a thinking section (Ollama's think).
  json ollama = {{"model", qwen2_model().string()}, {"stream", false}, {"think", true},
                 {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  auto r = client().Post("/api/chat", ollama.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("thinking"), std::string::npos) << r->body;
}

TEST_F(StructuredAnswerTest, ATemplateWithoutToolsRefusesThem) {
  start("");  // the model's own (fallback) template renders no tools
  const json r = chat({{"tools", json::array({kWeatherTool})}}, 400);
  EXPECT_NE(r.dump().find("does not support tools"), std::string::npos) << r.dump();
  // Tools with tool_choice "none" are not asked for: the answer is plain text.
  chat({{"tools", json::array({kWeatherTool})}, {"tool_choice", "none"}, {"max_tokens", 2}}, 200);
}

TEST_F(StructuredAnswerTest, ShowListsCapabilitiesFromTheTemplate) {
  auto show = [&] {
    auto r = client().Post("/api/show", json({{"model", qwen2_model().string()}}).dump(), "application/json");
    EXPECT_TRUE(r);
    return r ? json::parse(r->body)["capabilities"] : json();
  };
  EXPECT_EQ(show(), json::array({"completion", "tools"}));
  start("Qwen-Qwen3-0.6B");
  EXPECT_EQ(show(), json::array({"completion", "tools", "thinking"}));
  start("");
  EXPECT_EQ(show(), json::array({"completion"}));
}

TEST_F(StructuredAnswerTest, ThinkingTemplateKeepsReasoningApartAndShapesOnlyTheAnswer) {
  start("Qwen-Qwen3-0.6B");
  // think: false renders the empty thinking section; the grammar shapes the whole answer.
  json body = {{"model", qwen2_model().string()}, {"stream", false}, {"think", false}, {"format", kPersonSchema},
               {"options", {{"temperature", 1.0}, {"seed", 2}, {"num_predict", 200}}},
               {"messages", json::array({{{"role", "user"}, {"content", "A pet?"}}})}};
  auto r = client(120).Post("/api/chat", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json answer = json::parse(r->body);
  expect_person(answer["message"]["content"]);
  EXPECT_FALSE(answer["message"].contains("thinking")) << r->body;
}

}  // namespace

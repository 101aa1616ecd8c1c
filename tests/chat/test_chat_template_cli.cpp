// `m40-llm chat-template`, run as a user runs it: the built binary prints the
// rendered prompt exactly (no newline added), reports template errors as one
// line with exit status 1, and renders a model's own template or fallback.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "binary_runner.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

using RunResult = m40::test::BinaryResult;

std::string read_file(const fs::path& path) { return m40::test::read_text_file(path); }

fs::path temp_path(const std::string& name) {
  return fs::path(testing::TempDir()) / ("m40_chat_cli_" + std::to_string(::getpid()) + "_" + name);
}

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = temp_path(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

RunResult run_m40(const std::vector<std::string>& args, const std::string& stdin_path = "") {
  return m40::test::run_binary(args, stdin_path);
}

fs::path templates_dir() { return m40::test::shared_dir() / "templates"; }

Json case_file(const std::string& name) { return Json::parse(read_file(templates_dir() / (name + ".cases.json"))); }

Json find_case(const Json& doc, const std::string& name) {
  for (const auto& c : doc["cases"])
    if (c["name"] == name) return c;
  return nullptr;
}

class ChatTemplateCli : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::is_directory(templates_dir())) GTEST_SKIP() << "no shared templates at " << templates_dir();
  }
};

TEST_F(ChatTemplateCli, RendersATemplateFileExactly) {
  const std::string name = "meta-llama-Llama-3.1-8B-Instruct";
  const Json doc = case_file(name);
  for (const std::string which : {"c_multi_turn_gen", "d_multi_turn_no_gen", "e_non_ascii_gen"}) {
    const Json c = find_case(doc, which);
    const fs::path messages = write_temp(which + ".json", c["messages"].dump());
    std::vector<std::string> args{"chat-template", "--template", (templates_dir() / (name + ".jinja")).string(),
                                  "--bos", doc["bos_token"].get<std::string>(), "--eos",
                                  doc["eos_token"].get<std::string>(), "--messages", messages.string(), "--date",
                                  doc["strftime_now_date"].get<std::string>()};
    if (!c["add_generation_prompt"].get<bool>()) args.push_back("--no-generation-prompt");
    const RunResult r = run_m40(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c["expected"].get<std::string>()) << which;
    EXPECT_EQ(r.err, "");
    fs::remove(messages);
  }
}

TEST_F(ChatTemplateCli, ToolsFromARequestBodyAndDateOption) {
  const std::string name = "ibm-granite-granite-3.3-2B-Instruct";
  const Json doc = case_file(name);
  const Json c = find_case(doc, "g_tools_user_gen");
  const Json body = {{"messages", c["messages"]}, {"tools", c["tools"]}};
  const fs::path request = write_temp("request.json", body.dump());
  const RunResult r = run_m40({"chat-template", "--template", (templates_dir() / (name + ".jinja")).string(), "--bos",
                               doc["bos_token"].get<std::string>(), "--eos", doc["eos_token"].get<std::string>(),
                               "--messages", request.string(), "--date", "2024-07-26"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, c["expected"].get<std::string>());
  fs::remove(request);
}

TEST_F(ChatTemplateCli, MessagesFromStdinAndExtraVariables) {
  const fs::path tpl = write_temp("vars.jinja", "{{ messages[0].content }}|{{ enable_thinking }}|{{ mode }}");
  const fs::path messages = write_temp("stdin.json", R"([{"role": "user", "content": "hi"}])");
  const RunResult r = run_m40({"chat-template", "--template", tpl.string(), "--messages", "-", "--var",
                               "enable_thinking=false", "--var", "mode=plain text"},
                              messages.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hi|False|plain text");
  fs::remove(tpl);
  fs::remove(messages);
}

TEST_F(ChatTemplateCli, RaiseExceptionIsOneLineAndExitStatusOne) {
  const Json doc = case_file("google-gemma-2-2b-it");
  const Json c = find_case(doc, "b_system_user_gen");
  const fs::path messages = write_temp("gemma.json", c["messages"].dump());
  const RunResult r = run_m40({"chat-template", "--template", (templates_dir() / "google-gemma-2-2b-it.jinja").string(),
                               "--messages", messages.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "error: System role not supported\n");
  fs::remove(messages);
}

TEST_F(ChatTemplateCli, SyntaxErrorNamesLineAndColumn) {
  const fs::path tpl = write_temp("bad.jinja", "ok\n{% for m in messages %}{{ m.content + }}{% endfor %}");
  const fs::path messages = write_temp("bad.json", "[]");
  const RunResult r = run_m40({"chat-template", "--template", tpl.string(), "--messages", messages.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("chat template syntax error at line 2, column 39"), std::string::npos) << r.err;
  fs::remove(tpl);
  fs::remove(messages);
}

TEST_F(ChatTemplateCli, BadInputsAreOneLineErrors) {
  const fs::path tpl = write_temp("ok.jinja", "x");
  const fs::path not_json = write_temp("not.json", "{oops");
  RunResult r = run_m40({"chat-template", "--template", tpl.string(), "--messages", not_json.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  r = run_m40({"chat-template", "--template", tpl.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--messages"), std::string::npos) << r.err;
  r = run_m40({"chat-template", "--messages", not_json.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("MODEL"), std::string::npos) << r.err;
  fs::remove(tpl);
  fs::remove(not_json);
}

TEST_F(ChatTemplateCli, ModelTemplateAndFallback) {
  const fs::path phi3 = m40::test::shared_model("vocab/ggml-vocab-phi-3.gguf");
  const fs::path stories = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!fs::exists(phi3) || !fs::exists(stories)) GTEST_SKIP() << "shared models missing";
  const fs::path messages =
      write_temp("model.json", R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])");

  RunResult r = run_m40({"chat-template", phi3.string(), "--messages", messages.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s><|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n");
  EXPECT_EQ(r.err, "");

  r = run_m40({"chat-template", stories.string(), "--messages", messages.string(), "--no-generation-prompt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|start_story|>user: Hi\n\nassistant: Yo\n\n");
  EXPECT_NE(r.err.find("has no chat template"), std::string::npos) << r.err;

  r = run_m40({"chat-template", stories.string(), "--messages", messages.string(), "--bos", ""});
  EXPECT_EQ(r.out, "user: Hi\n\nassistant: Yo\n\nassistant:");

  r = run_m40({"chat-template", phi3.string(), "--print-template"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("{{ bos_token }}", 0), 0u) << r.out;
  fs::remove(messages);
}

TEST(ChatTemplateCliHelp, DescribesTheCommand) {
  const RunResult r = run_m40({"chat-template", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"--messages", "--template", "--no-generation-prompt", "--bos", "--eos", "--var", "--date",
                        "--print-template", "apply_chat_template"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
}

}  // namespace

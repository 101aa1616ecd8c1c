// The real chat templates of the newer architecture families, end to end:
// each tiny random-weight model of ../shared/models/arch, copied with its
// family's Hugging Face template (../shared/templates) as
// tokenizer.chat_template, answers "Hello" through `m40-llm run` and through
// `m40-llm serve` (OpenAI and Ollama chat routes). What was evaluated is
// checked against paths that bypass the chat code:
//   - the rendering is transformers' own (the template's a_single_user_gen
//     case, "Hello!" made "Hello", the model's BOS text and today's date put
//     in where the template prints them);
//   - its token count is `m40-llm tokenize --special --no-bos` of that text
//     (a chat prompt is tokenized without adding BOS: docs/chat-templates.md);
//   - the greedy answer is `m40-llm run --raw` of that text on a copy that
//     adds no BOS (so both see the same tokens).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include "binary_runner.h"
#include "gguf_copy.h"
#include "serve_process.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using m40::test::run_binary;

struct Family {
  const char* arch;       // tiny-ARCH-F32.gguf
  const char* template_;  // ../shared/templates/TEMPLATE.jinja and .cases.json
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.arch << " + " << f.template_; }

const Family kFamilies[] = {
    {"qwen2", "Qwen-Qwen2.5-7B-Instruct"},
    {"qwen3", "Qwen-Qwen3-0.6B"},
    {"gemma2", "google-gemma-2-2b-it"},
    // Gemma 3's own template is not in ../shared/templates; gemma-2's stands
    // in (Gemma 3 uses the same <start_of_turn> turns, and renders a lone
    // user message exactly as gemma-2 does).
    {"gemma3", "google-gemma-2-2b-it"},
    {"phi3", "microsoft-Phi-3.5-mini-instruct"},
    {"granite", "ibm-granite-granite-3.3-2B-Instruct"},
    {"smollm3", "HuggingFaceTB-SmolLM3-3B"},
    {"mistral3", "mistralai-Mistral-Nemo-Instruct-2407"},
};

const std::string kUser = "Hello";
// Greedy, no repetition penalty (the OpenAI route's default is 1, the CLI's
// and Ollama's 1.1), 8 tokens, and the server's context size (2048): phi3 picks its
// long or short RoPE factors by the context size (past the original 4096:
// long, as llama.cpp does), so the answers compare only at one size.
const std::vector<std::string> kGreedy = {"--temp", "0",    "--repeat-penalty", "1",         "-n", "8",
                                          "--ctx",  "2048", "--cpu",            "--threads", "2"};

fs::path arch_model(const std::string& arch) { return m40::test::shared_model("arch/tiny-" + arch + "-F32.gguf"); }
fs::path template_path(const std::string& name, const char* ext) {
  return m40::test::shared_dir() / "templates" / (name + ext);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

std::string strftime_of(const std::tm& tm, const char* format) {
  char buf[64];
  return std::string(buf, std::strftime(buf, sizeof buf, format, &tm));
}

std::string bos_text(const fs::path& model) {
  const auto md = m40::gguf::File::open(model.string()).metadata();
  const auto id = md.get_optional<uint32_t>("tokenizer.ggml.bos_token_id");
  if (!id) return "";
  return std::get<std::string>(md.get_array_value("tokenizer.ggml.tokens").items.at(*id).storage);
}

// What transformers renders for one user message "Hello" with
// add_generation_prompt, for this model: the case file's rendering of
// "Hello!", with the case file's BOS text replaced by the model's where the
// template prints bos_token, and the fixed date of the case files
// (2024-07-26) by today's, which strftime_now() gives `run` and the server.
std::string expected_rendering(const Family& f) {
  const json cases = json::parse(m40::test::read_text_file(template_path(f.template_, ".cases.json")));
  std::string text;
  for (const auto& c : cases["cases"]) {
    if (c["name"] == "a_single_user_gen") text = c["expected"];
  }
  EXPECT_NE(text.find("Hello!"), std::string::npos) << f.template_;
  text = replace_all(text, "Hello!", kUser);
  const std::string source = m40::test::read_text_file(template_path(f.template_, ".jinja"));
  if (source.find("bos_token") != std::string::npos) {
    text = replace_all(text, cases["bos_token"].get<std::string>(), bos_text(arch_model(f.arch)));
  }
  std::tm fixed{};
  fixed.tm_year = 2024 - 1900;
  fixed.tm_mon = 6;
  fixed.tm_mday = 26;
  fixed.tm_wday = 5;
  const std::time_t now = std::time(nullptr);
  std::tm today{};
  localtime_r(&now, &today);
  for (const char* format : {"%B %d, %Y", "%d %b %Y", "%Y-%m-%d"}) {
    text = replace_all(text, strftime_of(fixed, format), strftime_of(today, format));
  }
  return text;
}

int verbose_prompt_count(const std::string& err) {
  std::smatch m;
  return std::regex_search(err, m, std::regex(R"(prompt eval count:\s+(\d+) token)")) ? std::stoi(m[1]) : -1;
}

int verbose_eval_count(const std::string& err) {
  std::smatch m;
  return std::regex_search(err, m, std::regex(R"(\neval count:\s+(\d+) token)")) ? std::stoi(m[1]) : -1;
}

// One family's model copies and the expectations from the independent paths.
struct Expected {
  fs::path model;      // the tiny model with the family's template
  std::string rendering;
  int prompt_tokens = -1;
  std::string answer;  // what the raw run of the rendering generates (stdout, its final newline included)
  int answer_tokens = -1;
};

class ArchChatTemplate : public ::testing::TestWithParam<Family> {
 protected:
  static void SetUpTestSuite() {
    std::signal(SIGPIPE, SIG_IGN);
    dir_ = fs::path(::testing::TempDir()) / ("m40_arch_templates_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "home");
  }
  static void TearDownTestSuite() {
    server_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void SetUp() override {
    if (!fs::exists(arch_model(GetParam().arch)) || !fs::exists(template_path(GetParam().template_, ".jinja"))) {
      GTEST_SKIP() << "shared models or templates missing";
    }
  }

  Expected expect() {
    const Family& f = GetParam();
    Expected e;
    e.model = m40::test::copy_model_with_template(arch_model(f.arch), template_path(f.template_, ".jinja"),
                                                  dir_ / (std::string(f.arch) + "-chat.gguf"));
    // The same weights, adding no BOS of their own to a raw prompt.
    const fs::path raw = m40::test::copy_model(arch_model(f.arch), dir_ / (std::string(f.arch) + "-raw.gguf"),
                                               [](m40::gguf::Metadata& m) {
                                                 m.set("tokenizer.ggml.add_bos_token", m40::gguf::Value(false));
                                               });
    e.rendering = expected_rendering(f);
    const fs::path text = dir_ / (std::string(f.arch) + "-rendering.txt");
    std::ofstream(text, std::ios::binary) << e.rendering;
    const auto tok =
        run_binary({"tokenize", e.model.string(), "--file", text.string(), "--special", "--no-bos", "--json"});
    EXPECT_EQ(tok.exit_code, 0) << tok.err;
    if (tok.exit_code == 0) e.prompt_tokens = json::parse(tok.out)["n_tokens"].get<int>();

    std::vector<std::string> args{"run", raw.string(), e.rendering, "--raw", "--verbose"};
    args.insert(args.end(), kGreedy.begin(), kGreedy.end());
    const auto r = run_binary(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(verbose_prompt_count(r.err), e.prompt_tokens) << r.err;
    e.answer = r.out;
    e.answer_tokens = verbose_eval_count(r.err);
    return e;
  }

  static m40::test::ServeProcess& server() {
    if (!server_) {
      // No model named: every request names its file and the server loads
      // it, one after the other, in a store of its own.
      ::setenv("M40_LLM_HOME", (dir_ / "home").c_str(), 1);
      server_ = std::make_unique<m40::test::ServeProcess>(
          std::vector<std::string>{"--cpu", "--threads", "2", "--parallel", "1", "--ctx", "2048", "--allow-paths"});
      ::unsetenv("M40_LLM_HOME");
    }
    return *server_;
  }

  static inline fs::path dir_;
  static inline std::unique_ptr<m40::test::ServeProcess> server_;
};

}  // namespace

// `run MODEL "Hello"` renders the model's template: the prompt it evaluates
// has as many tokens as transformers' rendering, and its greedy answer is the
// raw run of that rendering.
TEST_P(ArchChatTemplate, RunEvaluatesTheTemplatesRendering) {
  const Expected e = expect();
  ASSERT_GT(e.prompt_tokens, 0);

  // The chat-template command prints that rendering for the copy.
  const fs::path messages = dir_ / (std::string(GetParam().arch) + "-messages.json");
  std::ofstream(messages) << json::array({{{"role", "user"}, {"content", kUser}}}).dump();
  const auto rendered = run_binary({"chat-template", e.model.string(), "--messages", messages.string()});
  ASSERT_EQ(rendered.exit_code, 0) << rendered.err;
  EXPECT_EQ(rendered.out, e.rendering);

  std::vector<std::string> args{"run", e.model.string(), kUser, "--verbose"};
  args.insert(args.end(), kGreedy.begin(), kGreedy.end());
  const auto r = run_binary(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(verbose_prompt_count(r.err), e.prompt_tokens) << r.err;
  EXPECT_EQ(verbose_eval_count(r.err), e.answer_tokens) << r.err;
  EXPECT_EQ(r.out, e.answer);
}

// The server renders it too: /v1/chat/completions and /api/chat evaluate the
// same prompt tokens and answer what `run` answers.
TEST_P(ArchChatTemplate, ServerEvaluatesTheTemplatesRendering) {
  const Expected e = expect();
  ASSERT_GT(e.prompt_tokens, 0);
  ASSERT_FALSE(e.answer.empty());
  const std::string answer = e.answer.substr(0, e.answer.size() - 1);  // `run` ends it with a newline

  auto& serve = server();
  ASSERT_TRUE(serve.running()) << serve.stderr_text();
  httplib::Client client("127.0.0.1", serve.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(60);
  const json messages = json::array({{{"role", "user"}, {"content", kUser}}});

  const json openai = {{"model", e.model.string()}, {"messages", messages}, {"temperature", 0},
                       {"max_tokens", 8},           {"seed", 7},          {"repeat_penalty", 1}};
  auto r = client.Post("/v1/chat/completions", openai.dump(), "application/json");
  ASSERT_TRUE(r) << serve.stderr_text();
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<int>(), e.prompt_tokens) << r->body;
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), e.answer_tokens) << r->body;
  EXPECT_EQ(j["choices"][0]["message"]["content"].get<std::string>(), answer) << r->body;

  const json ollama = {{"model", e.model.string()},
                       {"messages", messages},
                       {"stream", false},
                       {"options", {{"temperature", 0}, {"num_predict", 8}, {"seed", 7}, {"repeat_penalty", 1}}}};
  r = client.Post("/api/chat", ollama.dump(), "application/json");
  ASSERT_TRUE(r) << serve.stderr_text();
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  // The same prompt as the OpenAI request's: all of it is reused from the
  // KV cache (whole blocks, then the partly filled last one) but the last
  // token, always evaluated, and Ollama counts what was evaluated.
  EXPECT_EQ(j["prompt_eval_count"].get<int>(), 1) << r->body;
  EXPECT_EQ(j["eval_count"].get<int>(), e.answer_tokens) << r->body;
  EXPECT_EQ(j["message"]["content"].get<std::string>(), answer) << r->body;
}

INSTANTIATE_TEST_SUITE_P(Families, ArchChatTemplate, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& p) { return std::string(p.param.arch); });

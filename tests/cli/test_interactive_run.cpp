// The interactive `m40-llm run MODEL` as a user at a terminal sees it: the
// binary under a pseudo-terminal, lines typed in, the screen read back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "binary_runner.h"
#include "gguf_copy.h"
#include "pty_session.h"

namespace {

namespace fs = std::filesystem;
using m40::test::PtySession;
using m40::test::run_binary;

const std::string kPrompt = ">>> ";
constexpr size_t npos = std::string::npos;

std::string model_path() { return m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string(); }

class InteractiveRun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(model_path())) GTEST_SKIP() << "shared models missing";
    home_ = fs::path(::testing::TempDir()) / ("m40_chat_home_" + std::to_string(::getpid()));
    fs::create_directories(home_);
  }
  void TearDown() override { fs::remove_all(home_); }

  // Starts the chat and waits for its first prompt.
  std::unique_ptr<PtySession> start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"run", model_path(), "--cpu", "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto s = std::make_unique<PtySession>(args, std::vector<std::pair<std::string, std::string>>{
                                                    {"M40_LLM_HOME", home_.string()}, {"TERM", "xterm"}});
    EXPECT_TRUE(s->started());
    EXPECT_NE(s->wait_for(kPrompt, 0), npos) << s->output();
    return s;
  }

  // Types a line and returns what the program printed in answer, up to the
  // next prompt (the echo of the line left out).
  static std::string say(PtySession& s, const std::string& line) {
    EXPECT_TRUE(s.wait_until_editing()) << s.output();
    const size_t from = s.mark();
    s.type(line + "\r");
    const size_t echoed = s.wait_for(line + "\n", from);
    if (echoed == npos) {
      ADD_FAILURE() << "no echo of '" << line << "' in: " << s.output().substr(from);
      return "";
    }
    const size_t start = echoed + line.size() + 1;
    const size_t next = s.wait_for(kPrompt, start);
    if (next == npos) {
      ADD_FAILURE() << "no prompt after '" << line << "' in: " << s.output().substr(from);
      return "";
    }
    return s.output().substr(start, next - start);
  }

  // The answer of the one-shot `m40-llm run`, for comparison.
  static std::string one_shot(const std::string& prompt, int n) {
    const auto r = run_binary({"run", model_path(), prompt, "--cpu", "--temp", "0", "-n", std::to_string(n)});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.substr(0, r.out.size() - 1);  // its closing newline
  }

  fs::path home_;
};

}  // namespace

// An answer is streamed after the prompt and ends with a blank line; with
// temperature 0 it is what the one-shot `run --temp 0` prints.
TEST_F(InteractiveRun, GreedyFirstAnswerIsTheOneShotAnswer) {
  auto s = start();
  EXPECT_EQ(say(*s, "/set parameter temperature 0"), "Set parameter 'temperature' to '0'\n");
  EXPECT_EQ(say(*s, "/set parameter num_predict 24"), "Set parameter 'num_predict' to '24'\n");
  const std::string expected = one_shot("Once upon a time", 24);
  ASSERT_GT(expected.size(), 20u);
  EXPECT_EQ(say(*s, "Once upon a time"), expected + "\n\n");
  ASSERT_TRUE(s->wait_until_editing());
  s->type("/bye\r");
  EXPECT_EQ(s->wait_exit(), 0);
}

// A message between """ lines is one message, its lines joined by newlines.
TEST_F(InteractiveRun, MultiLineMessagesBetweenTripleQuotes) {
  auto s = start();
  say(*s, "/set parameter temperature 0");
  say(*s, "/set parameter num_predict 16");
  ASSERT_TRUE(s->wait_until_editing());
  const size_t from = s->mark();
  s->type("\"\"\"\r");
  ASSERT_NE(s->wait_for("... ", from), npos) << s->output().substr(from);  // the continuation prompt
  ASSERT_TRUE(s->wait_until_editing());
  s->type("Once upon\r");
  const std::string answer = say(*s, "a time\"\"\"");
  EXPECT_EQ(answer, one_shot("Once upon\na time", 16) + "\n\n");
  ASSERT_TRUE(s->wait_until_editing());
  s->type("\x04");
  EXPECT_EQ(s->wait_exit(), 0);
}

// /clear forgets the conversation: the same first message gets the same
// answer again, although the cache still holds the longer conversation.
TEST_F(InteractiveRun, ClearStartsTheConversationOver) {
  auto s = start();
  say(*s, "/set parameter temperature 0");
  say(*s, "/set parameter num_predict 12");
  const std::string first = say(*s, "Once upon a time");
  ASSERT_GT(first.size(), 10u);
  const std::string second = say(*s, "Once upon a time");
  EXPECT_NE(second, first);  // the second turn sees the first in its prompt
  EXPECT_EQ(say(*s, "/clear"), "Cleared session context\n");
  EXPECT_EQ(say(*s, "Once upon a time"), first);
}

// Each turn renders the whole conversation, but the positions the cache
// holds already (whole KV blocks, then the partly filled one after them)
// are not evaluated again.
TEST_F(InteractiveRun, LaterTurnsReuseTheCachedPrefix) {
  auto s = start();
  say(*s, "/set parameter num_predict 8");
  say(*s, "/set system You tell short stories.");
  EXPECT_EQ(say(*s, "/set verbose"), "Set 'verbose' mode.\n");
  const std::regex counts(R"(prompt eval count: +(\d+) token\(s\)[\s\S]*prompt cache reused: +(\d+) token\(s\))");
  std::smatch m;
  const std::string first = say(*s, "The dog");
  ASSERT_TRUE(std::regex_search(first, m, counts)) << first;
  const int first_prompt = std::stoi(m[1]);
  EXPECT_EQ(std::stoi(m[2]), 0);
  const std::string second = say(*s, "The cat");
  ASSERT_TRUE(std::regex_search(second, m, counts)) << second;
  // The first turn's prompt comes from the cache up to where its answer
  // joins the new rendering (at worst a few tokens before its end, where
  // the rendering of the answer's turn begins).
  const int reused = std::stoi(m[2]);
  EXPECT_GE(reused, first_prompt - 16) << second;
  EXPECT_GT(reused, 16) << second;
}

TEST_F(InteractiveRun, ShowInfoDescribesTheModel) {
  auto s = start();
  const std::string info = say(*s, "/show info");
  for (const char* line : {"architecture        llama", "parameters          656.0K", "context length      512",
                           "quantization        Q8_0"}) {
    EXPECT_NE(info.find(line), npos) << line << " not in:\n" << info;
  }
  EXPECT_NE(say(*s, "/show parameters").find("temperature         0.8"), npos);
}

TEST_F(InteractiveRun, HelpAndUnknownCommands) {
  auto s = start();
  const std::string help = say(*s, "/?");
  for (const char* item : {"/set", "/show", "/clear", "/bye", "\"\"\""}) EXPECT_NE(help.find(item), npos) << help;
  EXPECT_EQ(say(*s, "/help"), help);
  EXPECT_EQ(say(*s, "/frobnicate now"), "Unknown command '/frobnicate'. Type /? for help\n");
  EXPECT_EQ(say(*s, "/set parameter top_k many"), "Couldn't set parameter: 'many' is not an integer for top_k\n");
  EXPECT_EQ(say(*s, "/set parameter warmth 3"),
            "Couldn't set parameter: unknown parameter 'warmth' (/set parameter lists them)\n");
  ASSERT_TRUE(s->wait_until_editing());
  s->type("/bye\r");
  EXPECT_EQ(s->wait_exit(), 0);
}

// Ctrl-C while an answer streams stops it and the prompt comes back; the
// conversation goes on. Ctrl-C at an empty prompt only says how to leave;
// Ctrl-D leaves with status 0.
TEST_F(InteractiveRun, CtrlCStopsTheAnswerAndCtrlDExits) {
  // Without end-of-story tokens the answer would fill the 4096-token context.
  auto s = start({"--ctx", "4096", "--ignore-eos"});
  say(*s, "/set verbose");
  ASSERT_TRUE(s->wait_until_editing());
  size_t from = s->mark();
  s->type("Once upon a time\r");
  const size_t echoed = s->wait_for("Once upon a time\n", from);
  ASSERT_NE(echoed, npos);
  // The answer streams (the terminal is out of the line editor) and some
  // words of it are shown: then Ctrl-C.
  ASSERT_TRUE(s->wait_until_editing(false));
  ASSERT_NE(s->wait_for(" ", echoed + 17), npos) << s->output().substr(from);
  s->type("\x03");
  const size_t prompt = s->wait_for(kPrompt, echoed);
  ASSERT_NE(prompt, npos) << s->output().substr(from);
  const std::string stopped = s->output().substr(echoed, prompt - echoed);
  EXPECT_EQ(stopped.find("is full"), npos) << stopped;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(stopped, m, std::regex(R"(eval count: +(\d+) token)"))) << stopped;
  EXPECT_LT(std::stoi(m[1]), 4000);

  say(*s, "/set quiet");
  say(*s, "/set parameter num_predict 4");
  EXPECT_GT(say(*s, "The dog").size(), 2u);  // the next turn is answered

  ASSERT_TRUE(s->wait_until_editing());
  from = s->mark();
  s->type("\x03");
  EXPECT_NE(s->wait_for("Use Ctrl + d or /bye to exit.\n" + kPrompt, from), npos) << s->output().substr(from);
  ASSERT_TRUE(s->wait_until_editing());
  s->type("\x04");
  EXPECT_EQ(s->wait_exit(), 0);
}

// A conversation longer than the context is refused with what to do, and
// the chat goes on; an answer that fills the context says so at its end.
TEST_F(InteractiveRun, AConversationOverTheContextIsExplained) {
  auto s = start({"--ctx", "64", "--ignore-eos"});  // answers run until a limit
  const auto dogs = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) text += (i ? " dog" : "dog");
    return text;
  };
  const std::string refused = say(*s, dogs(100));
  EXPECT_NE(refused.find("more than the context of 64 holds"), npos) << refused;
  EXPECT_NE(refused.find("/clear to start over"), npos) << refused;
  say(*s, "/set parameter num_predict 3");
  EXPECT_GT(say(*s, "The dog").size(), 2u);

  say(*s, "/clear");
  say(*s, "/set parameter num_predict -1");
  const std::string cut = say(*s, dogs(40));
  EXPECT_NE(cut.find("(the context of 64 tokens is full; the answer stops here: /clear to start over)"), npos) << cut;
  ASSERT_TRUE(s->wait_until_editing());
  s->type("/bye\r");
  EXPECT_EQ(s->wait_exit(), 0);
}

// Off a terminal the chat reads messages and commands line by line.
TEST(PipedRun, ReadsMessagesLineByLine) {
  if (!fs::exists(model_path())) GTEST_SKIP() << "shared models missing";
  const fs::path input = fs::path(::testing::TempDir()) / ("m40_chat_in_" + std::to_string(::getpid()));
  {
    std::ofstream f(input);
    f << "/set parameter temperature 0\n/set parameter num_predict 20\nOnce upon a time\n/bye\nnot read\n";
  }
  const auto r = run_binary({"run", model_path(), "--cpu"}, input.string());
  fs::remove(input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto expected = run_binary({"run", model_path(), "Once upon a time", "--cpu", "--temp", "0", "-n", "20"});
  EXPECT_EQ(r.out, "Set parameter 'temperature' to '0'\nSet parameter 'num_predict' to '20'\n" +
                       expected.out.substr(0, expected.out.size() - 1) + "\n\n");
}

namespace {

std::string piped_chat(const fs::path& model, const std::string& input, m40::test::BinaryResult& r) {
  const fs::path in = fs::path(::testing::TempDir()) / ("m40_chat_in_" + std::to_string(::getpid()));
  std::ofstream(in) << input;
  r = run_binary({"run", model.string(), "--cpu", "--threads", "1"}, in.string());
  fs::remove(in);
  return r.out;
}

}  // namespace

// A turn that fails (here gemma-2's template refuses a system message) is
// reported and dropped; the chat goes on, and the next turn renders the
// conversation without it (gemma-2's template would refuse two user turns
// in a row, so "third" is answered only if "hello again" was dropped).
TEST(PipedRun, AFailedTurnIsDroppedAndTheChatGoesOn) {
  const fs::path tpl = m40::test::shared_dir() / "templates" / "google-gemma-2-2b-it.jinja";
  if (!fs::exists(model_path()) || !fs::exists(tpl)) GTEST_SKIP() << "shared models or templates missing";
  // TinyStories shipping gemma-2's template.
  const fs::path model = m40::test::copy_model_with_template(
      model_path(), tpl, fs::path(::testing::TempDir()) / ("m40_gemma_tpl_" + std::to_string(::getpid()) + ".gguf"));
  m40::test::BinaryResult r;
  piped_chat(model,
             "/set parameter temperature 0\n/set parameter num_predict 4\nhello\n/set system be nice\n"
             "hello again\n/set system\nthird\n/bye\n",
             r);
  fs::remove(model);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "Error: System role not supported\n\n");
  // Both answers are there, each followed by the blank line of a finished answer.
  const size_t cleared = r.out.find("Cleared system message.\n");
  ASSERT_NE(cleared, npos) << r.out;
  EXPECT_NE(r.out.find("\n\n", cleared + 24), npos) << "no answer to 'third' in: " << r.out;
}

// Integer parameters are not wrapped into their type: past int32, top_k (no
// limit), repeat_last_n (past any context) and num_predict (until the
// context is full) are int32's largest, and top_k below int32 (off, as any
// value of 0 or less) its smallest, as on the server, and the message
// says what was set; a value outside what a parameter takes is refused
// with its range, and leaves the parameter as it was.
TEST(PipedRun, IntegerParametersAreNotWrapped) {
  if (!fs::exists(model_path())) GTEST_SKIP() << "shared models missing";
  m40::test::BinaryResult r;
  piped_chat(model_path(),
             "/set parameter top_k 4294967297\n/set parameter num_predict 4294967296\n"
             "/set parameter repeat_last_n 99999999999999999999999\n/set parameter num_predict -5\n"
             "/set parameter top_k -99999999999\n/set parameter repeat_last_n -2\n"
             "/set parameter seed 99999999999999999999\n/show parameters\n",
             r);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "Set parameter 'top_k' to '2147483647' (the largest it takes; 4294967297 is past it)\n"
            "Set parameter 'num_predict' to '2147483647' (the largest it takes; 4294967296 is past it)\n"
            "Set parameter 'repeat_last_n' to '2147483647' (the largest it takes; 99999999999999999999999 is past it)\n"
            "Set parameter 'num_predict' to '-1' (any negative value means no limit)\n"
            "Set parameter 'top_k' to '-2147483648' (the smallest it takes; -99999999999 is past it)\n"
            "Couldn't set parameter: '-2' is out of range for repeat_last_n (-1..2147483647)\n"
            "Couldn't set parameter: '99999999999999999999' is out of range for seed "
            "(-9223372036854775808..9223372036854775807)\n"
            "Parameters:\n"
            "  temperature         0.8\n"
            "  top_k               -2147483648\n"
            "  top_p               0.95\n"
            "  min_p               0.05\n"
            "  repeat_penalty      1.1\n"
            "  repeat_last_n       2147483647\n"
            "  presence_penalty    0\n"
            "  frequency_penalty   0\n"
            "  seed                -1\n"
            "  num_predict         -1\n"
            "  stop                (none)\n");
}

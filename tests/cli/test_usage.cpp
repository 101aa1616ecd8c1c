// Every command answers --help, and every usage mistake is one line that
// names the command and where to look — the same shape as every other error.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "binary_runner.h"

namespace {

using m40::test::BinaryResult;
using m40::test::run_binary;

const std::vector<std::string> kCommands = {"show",  "gen-model", "tokenize", "detokenize", "run", "bench",
                                            "chat-template", "pull", "list", "rm", "serve", "ps"};

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(Usage, EveryCommandHasHelp) {
  const BinaryResult top = run_binary({"--help"});
  ASSERT_EQ(top.exit_code, 0) << top.err;
  for (const auto& command : kCommands) {
    SCOPED_TRACE(command);
    EXPECT_NE(top.out.find(command), std::string::npos) << top.out;  // listed in the top-level help
    const BinaryResult r = run_binary({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("Usage:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(command), std::string::npos) << r.out;
    EXPECT_EQ(r.err, "");
  }
}

TEST(Usage, AMistakeIsOneLineThatSaysWhereToLook) {
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  const std::vector<Case> cases = {
      {{"pull"}, "error: REF is required; see `m40-llm pull --help`\n"},
      {{"rm"}, "error: NAME is required; see `m40-llm rm --help`\n"},
      {{"list", "extra"}, "error: The following argument was not expected: extra; see `m40-llm list --help`\n"},
      {{"serve", "--bogus"}, "error: The following argument was not expected: --bogus; see `m40-llm serve --help`\n"},
      {{"frobnicate"}, "error: unknown command 'frobnicate'; see `m40-llm --help` for the commands\n"},
      {{"bench", "model.gguf", "--split-mode", "diagonal"},
       "error: --split-mode: diagonal not in {auto,layer,row}; see `m40-llm bench --help`\n"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args.front());
    const BinaryResult r = run_binary(c.args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(r.err, c.err);
    EXPECT_EQ(r.out, "");
  }
  // Whatever CLI11 says about a bad value, it stays on one line.
  for (const auto& command : kCommands) {
    SCOPED_TRACE(command);
    const BinaryResult r = run_binary({command, "--no-such-option"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("see `m40-llm " + command + " --help`"), std::string::npos) << r.err;
  }
}

}  // namespace

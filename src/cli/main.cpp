// m40-llm: the command-line entry point. Each command lives in its own file
// and registers itself here.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"m40-llm: run GGUF language models on NVIDIA GPUs (Tesla M40 first) or the CPU",
               "m40-llm"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("m40-llm ") + m40::cli::kVersion);

  m40::cli::register_show_command(app);
  m40::cli::register_gen_model_command(app);
  m40::cli::register_tokenize_command(app);
  m40::cli::register_run_command(app);
  m40::cli::register_bench_command(app);
  m40::cli::register_chat_template_command(app);
  m40::cli::register_pull_command(app);
  m40::cli::register_list_command(app);
  m40::cli::register_rm_command(app);
  m40::cli::register_serve_command(app);
  m40::cli::register_ps_command(app);

  // A usage error is one line that names the command and where to look,
  // like every other error.
  app.failure_message([](const CLI::App* top, const CLI::Error& e) {
    std::string command = "m40-llm";
    const auto chosen = top->get_subcommands();
    if (!chosen.empty()) command += " " + chosen.front()->get_name();
    std::string what = e.what();
    for (auto& c : what) {
      if (c == '\n') c = ' ';
    }
    while (!what.empty() && what.back() == ' ') what.pop_back();
    return "error: " + what + "; see `" + command + " --help`\n";
  });

  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    const auto commands = app.get_subcommands([&](const CLI::App* c) { return c->check_name(word); });
    if (commands.empty()) {
      std::fprintf(stderr, "error: unknown command '%s'; see `m40-llm --help` for the commands\n", word.c_str());
      return 1;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return m40::cli::run_selected_command();
}

// The commands of the m40-llm binary. Each register_* function adds one
// subcommand to the CLI11 app and arranges for its action to run.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace m40::cli {

inline constexpr const char* kVersion = "0.1.0";

void register_show_command(CLI::App& app);
void register_gen_model_command(CLI::App& app);
void register_tokenize_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_run_command(CLI::App& app);
void register_chat_template_command(CLI::App& app);
void register_pull_command(CLI::App& app);  // pull, list, rm: the model store
void register_list_command(CLI::App& app);
void register_rm_command(CLI::App& app);
void register_serve_command(CLI::App& app);
void register_ps_command(CLI::App& app);  // asks a running server

// Registers the action of the subcommand being defined; run_selected_command
// runs the one the user chose, turning m40::Error into a one-line message and
// exit status 1.
void set_command_action(std::function<int()> action);
int run_selected_command();

}  // namespace m40::cli

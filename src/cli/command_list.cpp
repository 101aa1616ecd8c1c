// `m40-llm list`: the models in the store, as a table.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/text_table.h"
#include "store/store.h"

namespace m40::cli {

namespace {

int run_list() {
  const store::Store store = store::Store::from_environment();
  const auto models = store.list();
  std::vector<std::vector<std::string>> rows{{"NAME", "ID", "SIZE", "QUANT", "MODIFIED"}};
  const auto now = static_cast<int64_t>(std::time(nullptr));
  for (const auto& m : models) {
    rows.push_back({m.model_name().str(), m.sha256.substr(0, 12), store::human_size(m.size),
                    m.quant.empty() ? "-" : m.quant, store::relative_time(m.pulled_at, now)});
  }
  print_table(rows);
  return 0;
}

}  // namespace

void register_list_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("list", "List the models in the store");
  cmd->alias("ls");
  cmd->callback([] { set_command_action([] { return run_list(); }); });
}

}  // namespace m40::cli

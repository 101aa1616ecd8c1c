// `m40-llm list`: the models in the store, as a table.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "cli/commands.h"
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
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 4, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace

void register_list_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("list", "List the models in the store");
  cmd->alias("ls");
  cmd->callback([] { set_command_action([] { return run_list(); }); });
}

}  // namespace m40::cli

// `m40-llm rm NAME...`: remove models from the store, or what a pull that
// never finished left of one.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "store/store.h"

namespace m40::cli {

namespace {

int run_rm(const std::vector<std::string>& names) {
  const store::Store store = store::Store::from_environment();
  for (const auto& text : names) {
    const store::ModelName name = store::parse_model_name(text);
    const auto removed = store.remove(name);
    std::printf("deleted '%s'%s\n", name.str().c_str(),
                removed == store::Store::Removed::UnfinishedDownload ? " (an unfinished download)" : "");
  }
  return 0;
}

}  // namespace

void register_rm_command(CLI::App& app) {
  auto names = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("rm", "Remove models from the store (the file, its manifest, any partial download), or the partial "
                                    "download of a pull that never finished; refused while a pull of the name is running");
  cmd->add_option("NAME", *names, "Model names, NAME[:TAG] (tag 'latest' when left out)")->required();
  cmd->callback([names] { set_command_action([names] { return run_rm(*names); }); });
}

}  // namespace m40::cli

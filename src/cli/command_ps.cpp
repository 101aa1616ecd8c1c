// `m40-llm ps`: the models a running `m40-llm serve` has loaded, asked over
// its Ollama API (GET /api/ps), as a table like `ollama ps`.
#include <CLI/CLI.hpp>
#include <httplib.h>

#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/running_models.h"
#include "cli/server_address.h"
#include "cli/text_table.h"
#include "common/error.h"

namespace m40::cli {

namespace {

struct PsOptions {
  std::optional<std::string> host;
  std::optional<int> port;
};

int run_ps(const PsOptions& o) {
  const ServerAddress address = server_address(o.host, o.port);
  httplib::Client client(address.host, address.port);
  client.set_connection_timeout(5);
  client.set_read_timeout(30);
  const auto res = client.Get("/api/ps");
  if (!res) {
    // A refused connection is the common case and needs no detail.
    const std::string why = res.error() == httplib::Error::Connection ? "" : " (" + httplib::to_string(res.error()) + ")";
    throw Error("no m40-llm server answers at " + address.url() + why + ": start one with `m40-llm serve MODEL`");
  }
  if (res->status != 200) {
    throw Error("the server at " + address.url() + " answered /api/ps with HTTP " + std::to_string(res->status) +
                (res->body.empty() ? "" : ": " + res->body.substr(0, 200)));
  }
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(res->body);
  } catch (const std::exception&) {
    throw Error("the server at " + address.url() + " answered /api/ps with something that is not JSON");
  }
  print_table(running_models_table(body, static_cast<int64_t>(std::time(nullptr))));
  return 0;
}

}  // namespace

void register_ps_command(CLI::App& app) {
  auto opts = std::make_shared<PsOptions>();
  CLI::App* cmd = app.add_subcommand("ps", "List the models a running `m40-llm serve` has loaded");
  cmd->add_option("--host", opts->host, "The server's address (default 127.0.0.1; $M40_LLM_HOST=host:port also works)");
  cmd->add_option("--port", opts->port, "The server's port (default 11434)");
  cmd->callback([opts] { set_command_action([opts] { return run_ps(*opts); }); });
}

}  // namespace m40::cli

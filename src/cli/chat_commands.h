// The slash commands of the interactive `m40-llm run`, as Ollama's REPL has
// them: /set parameter NAME VALUE, /set system TEXT, /set verbose|quiet,
// /show info|parameters|system|template, /clear, /bye, /? and /help.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/chat_session.h"
#include "engine/generator.h"
#include "engine/request_options.h"

namespace m40::gguf {
class File;
}

namespace m40::cli {

// What the conversation runs with; /set parameter changes it.
struct ChatSettings {
  engine::GenerationOptions generation;
  int64_t seed = -1;     // -1: a fresh random seed every answer
  bool verbose = false;  // timings after each answer, like `ollama run --verbose`

  // The options for one answer, the seed filled in.
  engine::GenerationOptions options() const;
  // What /set parameter writes (engine/request_options.h).
  engine::OptionTargets targets() { return {generation.sampler, generation.max_tokens, generation.stop, seed}; }
};

enum class CommandResult { Continue, Exit };

class ChatCommands {
 public:
  // `model_info` is what /show info prints (model_info_text()).
  ChatCommands(ChatSession& session, ChatSettings& settings, std::string model_info)
      : session_(session), settings_(settings), model_info_(std::move(model_info)) {}

  // Runs a line that starts with '/', writing what it says to `out`.
  CommandResult run(const std::string& line, std::string& out);

  // Sets one generation parameter by its Ollama name; returns the message
  // to show ("Set parameter 'top_k' to '20'" or why it could not).
  std::string set_parameter(const std::string& name, const std::vector<std::string>& values);

 private:
  std::string show(const std::vector<std::string>& words) const;
  std::string parameters_text() const;

  ChatSession& session_;
  ChatSettings& settings_;
  std::string model_info_;
};

// The help /? prints.
std::string chat_help_text();

// "  Model\n    architecture  llama\n    parameters  656.0K\n ..." for /show info.
std::string model_info_text(const gguf::File& file, int n_ctx, const std::string& backend_name);

}  // namespace m40::cli

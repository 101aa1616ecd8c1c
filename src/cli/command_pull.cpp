// `m40-llm pull REF [--name NAME]`: a model into the store from a URL, from
// Hugging Face (hf.co/ORG/REPO[:QUANT], ORG/REPO/FILE.gguf), from the Ollama
// library (NAME[:TAG], NAMESPACE/NAME[:TAG]) or from a file.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "store/http_download.h"
#include "store/pull.h"

namespace m40::cli {

namespace {

struct PullCommandOptions {
  std::string ref;
  std::string name;
};

std::atomic<bool> g_interrupted{false};

void note_interrupt(int) { g_interrupted.store(true); }

// Ctrl-C or SIGTERM stops the transfer cleanly: the partial file is closed
// and kept for a resume, and the message says so. A second Ctrl-C (the
// handler resets itself) kills the process at once.
void catch_interrupts() {
  struct sigaction action {};
  action.sa_handler = note_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

int run_pull(const PullCommandOptions& opts) {
  const store::Store store = store::Store::from_environment();
  catch_interrupts();
  store::PullOptions options;
  options.interrupted = [] { return g_interrupted.load(); };
  options.ref = opts.ref;
  if (!opts.name.empty()) options.name = opts.name;
  options.terminal = ::isatty(STDERR_FILENO) != 0;
  store::PullResult result;
  try {
    result = store::pull_model(store, options);
  } catch (const store::InterruptedError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 130;  // as a shell reports a process ended by SIGINT
  }
  std::printf("%s\n", result.manifest.model_name().str().c_str());
  return 0;
}

}  // namespace

void register_pull_command(CLI::App& app) {
  auto opts = std::make_shared<PullCommandOptions>();
  CLI::App* cmd = app.add_subcommand("pull", "Download a GGUF model into the model store ($M40_LLM_HOME, default ~/.m40-llm)");
  cmd->add_option("REF", opts->ref,
                  "A URL, hf.co/ORG/REPO[:QUANT] (default quantization Q4_K_M), ORG/REPO/FILE.gguf, an Ollama "
                  "library name NAME[:TAG] or NAMESPACE/NAME[:TAG] (default tag latest), or a local GGUF file")
      ->required();
  cmd->add_option("--name", opts->name, "Store it under this NAME[:TAG] instead of the name made from REF");
  cmd->footer(
      "Interrupted downloads resume where they stopped; the file is checked against the\n"
      "sha256 the source gives and validated as GGUF before it appears in `m40-llm list`.\n"
      "A Hugging Face model split into parts (NAME-00001-of-0000N.gguf) is pulled part by part\n"
      "and stored as one model.\n"
      "M40_LLM_HF_ENDPOINT sets the Hugging Face server, HF_TOKEN a token for gated repositories,\n"
      "M40_LLM_OLLAMA_REGISTRY the Ollama registry (default https://registry.ollama.ai).\n"
      "\n"
      "Examples:\n"
      "  m40-llm pull qwen3:8b\n"
      "  m40-llm pull hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M\n"
      "  m40-llm pull TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF/tinyllama-1.1b-chat-v1.0.Q8_0.gguf\n"
      "  m40-llm pull https://example.com/model.gguf --name mymodel:q8_0\n"
      "  m40-llm pull ./model.gguf --name tinystories\n");
  cmd->callback([opts] { set_command_action([opts] { return run_pull(*opts); }); });
}

}  // namespace m40::cli

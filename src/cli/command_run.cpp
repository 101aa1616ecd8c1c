// `m40-llm run MODEL [PROMPT]`: answers PROMPT, streamed to stdout as it is
// produced; without a PROMPT, an interactive chat (interactive_chat.h).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "chat/model_template.h"
#include "engine/answer_grammar.h"
#include "grammar/gbnf_builder.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "cli/interactive_chat.h"
#include "cli/timings.h"
#include "common/error.h"
#include "engine/backend_factory.h"
#include "common/memory_size.h"
#include "engine/generator.h"
#include "tokenizer/vocab.h"
#include "store/model_ref.h"

namespace m40::cli {

namespace {

struct RunOptions {
  std::string model;
  std::string prompt;
  bool prompt_given = false;  // an empty PROMPT given is still a one-shot prompt
  engine::SamplerParams sampler;
  int64_t seed = -1;
  int max_tokens = -1;
  int ctx = 0;
  unsigned threads = 0;
  DeviceFlags devices;  // --cpu, --gpu, --gpus, --tensor-split, --split-mode, --gpu-layers, --vram
  bool verbose = false;
  bool ignore_eos = false;
  bool raw = false;
  std::string kv_type = "f16";
  std::vector<std::string> stop;
  std::string logits_out;
  std::string format;  // "json" or a JSON schema: the answer is decoded under its grammar
};

// `--format`: "json" (any JSON object, as `ollama run --format json`) or a
// JSON schema given inline, compiled to the grammar the answer follows.
engine::AnswerGrammar format_grammar(const std::string& format, const tokenizer::Vocab& vocab) {
  if (format.empty()) return {};
  std::string gbnf;
  if (format == "json") {
    gbnf = grammar::json_object_gbnf();
  } else {
    nlohmann::ordered_json schema;
    try {
      schema = nlohmann::ordered_json::parse(format);
    } catch (const nlohmann::json::parse_error&) {
      throw Error("--format takes \"json\" or a JSON schema, e.g. '{\"type\": \"object\"}'");
    }
    gbnf = grammar::json_schema_to_gbnf(schema);
  }
  return engine::answer_grammar(gbnf, engine::grammar_vocabulary(vocab));
}

void write_logits(const std::string& path, const std::vector<float>& logits) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) throw Error("cannot write the logits to '" + path + "'");
}

int run_run(RunOptions o) {
  if (!o.prompt_given && (o.raw || !o.logits_out.empty())) {
    throw Error("--raw and --logits-out need a PROMPT; the interactive chat (no PROMPT) always uses the chat template");
  }
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto model = model::LoadedModel::open(store::resolve_model(o.model));
  auto vocab = tokenizer::Vocab::from_metadata(model->file.metadata());
  engine::BackendOptions bo;
  bo.n_ctx = o.ctx;
  bo.threads = o.threads;
  apply_device_flags(o.devices, bo);
  bo.kv_type = engine::kv_type_from_name(o.kv_type);
  auto backend = engine::make_backend(*model, bo);
  const engine::AnswerGrammar format = format_grammar(o.format, vocab);
  const double load_seconds = std::chrono::duration<double>(clock::now() - start).count();

  if (!o.prompt_given) {
    ChatSettings settings;
    settings.generation.sampler = o.sampler;
    settings.generation.max_tokens = o.max_tokens;
    settings.generation.stop = o.stop;
    settings.generation.ignore_eos = o.ignore_eos;
    settings.generation.grammar = format;
    settings.seed = o.seed;
    settings.verbose = o.verbose;
    return run_interactive_chat(*model, vocab, *backend, settings, load_seconds);
  }

  // Like `ollama run`, the prompt is one user message rendered through the
  // model's chat template (for a model without one, the fallback passes a
  // lone message through as plain text); --raw tokenizes it as it is.
  std::vector<int32_t> prompt;
  if (o.raw) {
    prompt = vocab.encode(o.prompt, {.add_special = true, .parse_special = true});
  } else {
    const auto tpl = chat::model_chat_template(model->file);
    auto render = tpl.options();
    render.add_generation_prompt = true;
    const nlohmann::ordered_json messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", o.prompt}}});
    // The rendered text carries BOS where the template wants it.
    prompt = vocab.encode(tpl.render(messages, render), {.add_special = false, .parse_special = true});
  }
  engine::GenerationOptions go;
  go.sampler = o.sampler;
  go.sampler.seed = o.seed < 0 ? engine::kRandomSeed : static_cast<uint64_t>(o.seed);
  go.max_tokens = o.max_tokens;
  go.stop = o.stop;
  go.ignore_eos = o.ignore_eos;
  go.grammar = format;
  engine::Generator generator(*backend, vocab);
  std::vector<float> logits;
  const auto result = generator.generate(
      prompt, go,
      [](std::string_view text) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
        return true;
      },
      o.logits_out.empty() ? nullptr : &logits);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!o.logits_out.empty()) write_logits(o.logits_out, logits);

  if (o.verbose) {
    std::fprintf(stderr, "\n");
    print_timings(stderr, {.total_seconds = std::chrono::duration<double>(clock::now() - start).count(),
                           .load_seconds = load_seconds,
                           .prompt_tokens = result.prompt_tokens,
                           .prompt_seconds = result.prompt_seconds,
                           .generated_tokens = static_cast<int>(result.tokens.size()),
                           .generate_seconds = result.generate_seconds});
    std::fprintf(stderr, "%-22s%s\n", "finish reason:",
                 std::string(engine::finish_reason_name(result.finish_reason)).c_str());
    std::fprintf(stderr, "%-22s%s\n", "backend:", backend->name().c_str());
  }
  return 0;
}

}  // namespace

void register_run_command(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Answer PROMPT with MODEL, streamed to stdout (the prompt goes through the model's chat template); "
      "without PROMPT, chat with it interactively like `ollama run`");
  cmd->add_option("MODEL", opts->model, "A store name (see `m40-llm list`) or a GGUF file")->required();
  auto* prompt = cmd->add_option("PROMPT", opts->prompt,
                  "The prompt (special tokens such as <s> in it are parsed); without one, an interactive chat "
                  "(lines from stdin when it is not a terminal; /? inside lists the commands)");
  auto& s = opts->sampler;
  cmd->add_option("--temperature,--temp", s.temperature, "Sampling temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Keep the K most likely tokens; 0 disables")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Keep the smallest set of tokens whose probability reaches P; 1 disables")
      ->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Drop tokens below P times the most likely one's probability; 0 disables")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repeat_penalty, "Penalty for repeating recent tokens; 1 disables")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", s.penalty_last_n, "How many recent tokens the penalties look at; -1: all")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "Subtracted per earlier occurrence")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "Subtracted once for any earlier occurrence")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Random seed for reproducible sampling; -1: random")->capture_default_str();
  cmd->add_option("-n,--max-tokens", opts->max_tokens, "Most tokens to generate; -1: until end or context full")
      ->capture_default_str();
  cmd->add_option("--stop", opts->stop, "Stop when this text is generated (repeatable; not printed)");
  cmd->add_option("--ctx", opts->ctx, "Context size in tokens (default: the model's trained context, capped by what the GPU or RAM holds)");
  cmd->add_option("-t,--threads", opts->threads, "CPU threads (default: every core)");
  cmd->add_option("--kv-type", opts->kv_type, "KV cache element type: f16, f32 (CPU only) or q8_0 (half the memory of f16)")->capture_default_str();
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_option("--format", opts->format,
                  "Response format: json (any JSON object) or a JSON schema; the answer is decoded so that it is one");
  cmd->add_flag("--raw", opts->raw, "Tokenize PROMPT as it is instead of rendering it through the chat template");
  add_device_flags(cmd, opts->devices);
  cmd->add_flag("--verbose", opts->verbose, "Print timings (prompt and generation speed) to stderr afterwards");
  cmd->add_option("--logits-out", opts->logits_out,
                  "Write the float32 logits of the last prompt position to this file");
  cmd->callback([opts, prompt] {
    opts->prompt_given = prompt->count() > 0;
    set_command_action([opts] { return run_run(*opts); });
  });
}

}  // namespace m40::cli

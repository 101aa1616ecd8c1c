// `m40-llm gen-model`: writes a synthetic model of a given shape (and with it
// an architecture) and weight type, so 7B-scale benchmarks need no download.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "common/error.h"
#include "gguf/file.h"
#include "model/synthetic_llama.h"

namespace m40::cli {

namespace {

struct GenModelOptions {
  std::string output;
  std::string shape = "tiny";
  std::string type = "q4_k_m";
  std::string tokenizer_from;
  uint64_t seed = 1234;
  unsigned threads = 0;
  uint32_t layers = 0, embd = 0, ff = 0, heads = 0, kv_heads = 0, head_dim = 0, ctx = 0;
  float rope_base = 0.0f;
};

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

int run_gen_model(const GenModelOptions& o) {
  auto shape = model::synthetic_shape(o.shape);
  if (!shape) throw Error("unknown shape '" + o.shape + "' (known: " + join(model::synthetic_shape_names()) + ")");
  // Explicit dimensions override the named shape (making it a custom one).
  auto override_dim = [&](uint32_t value, uint32_t& field) {
    if (value != 0) {
      field = value;
      shape->name = "custom";
    }
  };
  override_dim(o.layers, shape->n_layer);
  override_dim(o.embd, shape->n_embd);
  override_dim(o.ff, shape->n_ff);
  override_dim(o.heads, shape->n_head);
  override_dim(o.kv_heads, shape->n_head_kv);
  override_dim(o.head_dim, shape->head_dim);
  override_dim(o.ctx, shape->context_length);
  if (o.rope_base > 0.0f) shape->rope_freq_base = o.rope_base;

  gguf::File tokenizer = gguf::File::open(o.tokenizer_from);
  model::SyntheticOptions options;
  options.shape = *shape;
  options.recipe = o.type;
  options.seed = o.seed;
  options.threads = o.threads;
  options.tokenizer_source = &tokenizer;

  const auto start = std::chrono::steady_clock::now();
  std::string experts;
  if (shape->n_expert != 0) {
    experts = ", " + std::to_string(shape->n_expert_used) + " of " + std::to_string(shape->n_expert) +
              " experts of ff " + std::to_string(shape->expert_width());
  }
  std::fprintf(stderr, "writing %s: shape %s (%s, %u layers, embd %u, ff %u, heads %u/%u of %u%s), weights %s\n",
               o.output.c_str(), shape->name.c_str(), shape->architecture.c_str(), shape->n_layer, shape->n_embd,
               shape->n_ff, shape->n_head, shape->n_head_kv, shape->head_width(), experts.c_str(), o.type.c_str());
  const model::SyntheticReport report = model::write_synthetic_llama(options, o.output);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& note : report.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  const double params = static_cast<double>(report.parameter_count);
  std::printf("wrote %s: %.2f%s parameters, %.2f GiB, %.1f s\n", o.output.c_str(),
              params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M",
              static_cast<double>(report.file_bytes) / (1024.0 * 1024.0 * 1024.0), seconds);
  return 0;
}

}  // namespace

void register_gen_model_command(CLI::App& app) {
  auto opts = std::make_shared<GenModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "gen-model",
      "Write a synthetic model with random weights in a real model's shape and architecture\n"
      "(llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, phi3; mixture-of-experts shapes\n"
      "qwen3-30b-a3b, qwen1.5-moe-a2.7b and mixtral-8x7b), for benchmarks and tests.\n"
      "Example: m40-llm gen-model llama2-7b-q4km.gguf --shape llama2-7b --type q4_k_m "
      "--tokenizer-from llama-2-tiny-random.gguf");
  cmd->add_option("OUTPUT", opts->output, "Path of the GGUF file to write")->required();
  cmd->add_option("--shape", opts->shape, "Named shape: " + join(model::synthetic_shape_names()))
      ->capture_default_str();
  cmd->add_option("--type", opts->type, "Weight type: " + join(model::synthetic_weight_recipes()))
      ->capture_default_str();
  cmd->add_option("--tokenizer-from", opts->tokenizer_from,
                  "GGUF file whose tokenizer.* metadata is copied (sets the vocabulary size)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--seed", opts->seed, "Random seed (same seed, same file)")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "Worker threads (default: every core)");
  cmd->add_option("--layers", opts->layers, "Override the number of layers");
  cmd->add_option("--embd", opts->embd, "Override the embedding length");
  cmd->add_option("--ff", opts->ff, "Override the feed-forward length (Mixtral shapes: of each expert)");
  cmd->add_option("--heads", opts->heads, "Override the number of attention heads");
  cmd->add_option("--kv-heads", opts->kv_heads, "Override the number of KV heads");
  cmd->add_option("--head-dim", opts->head_dim,
                  "Override the head dimension (qwen3 and gemma shapes; others take embd / heads)");
  cmd->add_option("--ctx", opts->ctx, "Override the context length");
  cmd->add_option("--rope-base", opts->rope_base, "Override the RoPE frequency base");
  cmd->callback([opts] { set_command_action([opts] { return run_gen_model(*opts); }); });
}

}  // namespace m40::cli

// `m40-llm bench MODEL`: prompt processing and generation throughput, printed
// as a markdown table like llama-bench's.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/device_flags.h"
#include "engine/backend_factory.h"
#include "common/memory_size.h"
#include "engine/benchmark.h"
#include "model/model_summary.h"
#include "store/model_ref.h"

namespace m40::cli {

namespace {

struct BenchOptions {
  std::string model;
  std::vector<int> prompt_sizes = {512};
  std::vector<int> generate_sizes = {128};
  std::vector<int> sequence_counts = {1};
  std::vector<int> depths = {0};
  std::string kv_type = "f16";
  int repetitions = 5;
  unsigned threads = 0;
  DeviceFlags devices;  // --cpu, --gpu, --gpus, --tensor-split, --split-mode, --gpu-layers, --vram
};

int run_bench(const BenchOptions& o) {
  auto model = model::LoadedModel::open(store::resolve_model(o.model));
  std::vector<engine::BenchmarkTest> tests;
  int n_ctx = 16;
  int n_seq = 1;
  for (int d : o.depths) {
    // llama-bench's names: "pp512 @ d4096".
    const std::string at = d > 0 ? " @ d" + std::to_string(d) : "";
    for (int p : o.prompt_sizes) {
      if (p > 0) tests.push_back({"pp" + std::to_string(p) + at, p, 0, 1, d});
      n_ctx = std::max(n_ctx, d + p);
    }
    for (int n : o.generate_sizes) {
      if (n <= 0) continue;
      for (int s : o.sequence_counts) {
        std::string name = "tg" + std::to_string(n);
        if (s > 1) name += "@" + std::to_string(s);
        tests.push_back({name + at, 0, n, s, d});
        n_seq = std::max(n_seq, s);
      }
      n_ctx = std::max(n_ctx, d + n);
    }
  }
  if (tests.empty()) throw Error("nothing to measure: give -p or -n a positive size");

  engine::BackendOptions bo;
  bo.n_ctx = n_ctx;
  bo.n_seq = n_seq;
  bo.threads = o.threads;
  apply_device_flags(o.devices, bo);
  bo.kv_type = engine::kv_type_from_name(o.kv_type);
  auto backend = engine::make_backend(*model, bo);

  uint64_t params = 0;
  for (const auto& t : model->file.tensors()) params += t.element_count;
  const std::string size = model::format_bytes(model->weights.total_bytes());
  const std::string threads = o.threads == 0 ? std::to_string(std::max(1u, std::thread::hardware_concurrency()))
                                             : std::to_string(o.threads);
  std::printf("| model                          |       size |     params | backend    | threads |            test |"
              "                  t/s |\n");
  std::printf("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: |"
              " -------------------: |\n");
  for (const auto& test : tests) {
    const auto r = engine::run_benchmark(*backend, test, o.repetitions);
    char rate[64];
    std::snprintf(rate, sizeof rate, "%.2f ± %.2f", r.tokens_per_second_mean, r.tokens_per_second_stddev);
    std::printf("| %-30s | %10s | %10s | %-10s | %7s | %15s | %20s |\n", model->description().c_str(), size.c_str(),
                model::format_parameter_count(params).c_str(), backend->name().c_str(), threads.c_str(),
                test.name.c_str(), rate);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench",
                                     "Measure prompt processing (ppN) and generation (tgN) speed in tokens/s, "
                                     "as a markdown table like llama-bench");
  cmd->add_option("MODEL", opts->model, "A store name (see `m40-llm list`) or a GGUF file")->required();
  cmd->add_option("-p,--n-prompt", opts->prompt_sizes, "Prompt sizes to process in one batch (0 skips)")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", opts->generate_sizes, "Numbers of tokens to generate one by one (0 skips)")
      ->capture_default_str();
  cmd->add_option("-b,--batch", opts->sequence_counts,
                  "Sequences decoded together in each generation step (tgN@S: N steps of S sequences; t/s "
                  "counts every sequence's tokens), as the server's continuous batching does")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("-d,--depth", opts->depths,
                  "Positions cached before each test, untimed (\"tg128 @ d4096\": generation reading a 4096-position "
                  "KV cache), as llama-bench's -d")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-type", opts->kv_type, "KV cache element type: f16, f32 (CPU) or q8_0")->capture_default_str();
  cmd->add_option("-r,--repetitions", opts->repetitions, "Timed repetitions per test (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("-t,--threads", opts->threads, "CPU threads (default: every core)");
  add_device_flags(cmd, opts->devices);
  cmd->callback([opts] { set_command_action([opts] { return run_bench(*opts); }); });
}

}  // namespace m40::cli

#include "engine/benchmark.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "common/error.h"

namespace m40::engine {

namespace {

double run_once(backend::Backend& backend, const BenchmarkTest& test, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(1, backend.n_vocab() - 1);
  std::vector<float> logits(static_cast<size_t>(backend.n_vocab()) * static_cast<size_t>(test.n_sequences));
  backend::Batch batch;
  // The depth, untimed: every sequence's first n_depth positions, a chunk
  // of each at a time.
  constexpr int kDepthChunk = 512;
  for (int s = 0; s < test.n_sequences; ++s) {
    for (int begin = 0; begin < test.n_depth; begin += kDepthChunk) {
      batch.clear();
      const int end = std::min(test.n_depth, begin + kDepthChunk);
      for (int p = begin; p < end; ++p) batch.add(token(rng), p, s, p + 1 == end);
      backend.forward(batch, logits);
    }
  }
  const int at = test.n_depth;
  batch.clear();
  const auto start = std::chrono::steady_clock::now();
  if (test.n_prompt > 0) {
    for (int i = 0; i < test.n_prompt; ++i) batch.add(token(rng), at + i, 0, i + 1 == test.n_prompt);
    backend.forward(batch, logits);
  }
  for (int i = 0; i < test.n_generate; ++i) {
    batch.clear();
    for (int s = 0; s < test.n_sequences; ++s) batch.add(token(rng), at + test.n_prompt + i, s, true);
    backend.forward(batch, logits);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

BenchmarkResult run_benchmark(backend::Backend& backend, const BenchmarkTest& test, int repetitions) {
  if (test.n_depth + test.n_prompt + test.n_generate > backend.n_ctx()) {
    throw Error(test.name + " needs a context of " + std::to_string(test.n_depth + test.n_prompt + test.n_generate) +
                " tokens; the backend has " + std::to_string(backend.n_ctx()));
  }
  if (repetitions < 1) throw Error("at least one repetition is needed");
  if (test.n_sequences < 1 || test.n_sequences > backend.n_seq_max()) {
    throw Error(test.name + " decodes " + std::to_string(test.n_sequences) + " sequences; the backend has " +
                std::to_string(backend.n_seq_max()) + " slots");
  }
  std::mt19937 rng(42);
  BenchmarkResult result;
  result.test = test;
  run_once(backend, test, rng);  // warm-up: page in the weights, start the threads
  std::vector<double> rates;
  for (int r = 0; r < repetitions; ++r) {
    const double s = run_once(backend, test, rng);
    result.seconds.push_back(s);
    rates.push_back((test.n_prompt + test.n_generate * test.n_sequences) / s);
  }
  double mean = 0;
  for (double v : rates) mean += v;
  mean /= static_cast<double>(rates.size());
  double var = 0;
  for (double v : rates) var += (v - mean) * (v - mean);
  result.tokens_per_second_mean = mean;
  result.tokens_per_second_stddev = rates.size() > 1 ? std::sqrt(var / static_cast<double>(rates.size() - 1)) : 0.0;
  return result;
}

}  // namespace m40::engine

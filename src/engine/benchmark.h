// Throughput measurement in llama-bench's terms: prompt processing (ppN: one
// batch of N tokens) and text generation (tgN: N single-token steps), each
// repeated, after an untimed warm-up run. Batched generation (tgN@S: N steps
// that each decode one token of S sequences at once, as the server's
// continuous batching does) counts the tokens of all S sequences. A depth
// d ("tg128 @ d4096", llama-bench's -d) first fills d positions of each
// sequence, untimed, so the test reads a KV cache that long.
#pragma once

#include <string>
#include <vector>

#include "backends/backend.h"

namespace m40::engine {

struct BenchmarkTest {
  std::string name;  // "pp512", "tg128"
  int n_prompt = 0;  // tokens in one batch (pp)
  int n_generate = 0;  // single-token steps (tg)
  int n_sequences = 1;  // sequences decoded together in each tg step
  int n_depth = 0;      // positions cached before the timed part
};

struct BenchmarkResult {
  BenchmarkTest test;
  std::vector<double> seconds;  // one per repetition
  double tokens_per_second_mean = 0;
  double tokens_per_second_stddev = 0;
};

// Runs `test` once untimed, then `repetitions` times, each from position n_depth of
// sequences 0 .. n_sequences - 1 (earlier contents are overwritten). Token ids are drawn
// reproducibly from the vocabulary.
BenchmarkResult run_benchmark(backend::Backend& backend, const BenchmarkTest& test, int repetitions);

}  // namespace m40::engine

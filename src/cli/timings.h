// The timings `m40-llm run --verbose` prints after an answer, in the layout
// of `ollama run --verbose` (on stderr, so stdout holds only the answer).
#pragma once

#include <cstdio>

namespace m40::cli {

struct AnswerTimings {
  double total_seconds = 0;
  double load_seconds = 0;
  int prompt_tokens = 0;     // tokens evaluated (not those reused from the cache)
  double prompt_seconds = 0;
  int generated_tokens = 0;
  double generate_seconds = 0;
};

void print_timings(std::FILE* out, const AnswerTimings& t);

}  // namespace m40::cli

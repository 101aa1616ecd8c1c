#include "cli/timings.h"

namespace m40::cli {

namespace {

void print_duration(std::FILE* out, const char* label, double seconds) {
  if (seconds >= 1.0) {
    std::fprintf(out, "%-22s%.6fs\n", label, seconds);
  } else {
    std::fprintf(out, "%-22s%.6fms\n", label, seconds * 1e3);
  }
}

double rate(int tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0.0; }

}  // namespace

void print_timings(std::FILE* out, const AnswerTimings& t) {
  print_duration(out, "total duration:", t.total_seconds);
  print_duration(out, "load duration:", t.load_seconds);
  std::fprintf(out, "%-22s%d token(s)\n", "prompt eval count:", t.prompt_tokens);
  print_duration(out, "prompt eval duration:", t.prompt_seconds);
  std::fprintf(out, "%-22s%.2f tokens/s\n", "prompt eval rate:", rate(t.prompt_tokens, t.prompt_seconds));
  std::fprintf(out, "%-22s%d token(s)\n", "eval count:", t.generated_tokens);
  print_duration(out, "eval duration:", t.generate_seconds);
  std::fprintf(out, "%-22s%.2f tokens/s\n", "eval rate:", rate(t.generated_tokens, t.generate_seconds));
}

}  // namespace m40::cli

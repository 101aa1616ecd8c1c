// Download and copy progress on stderr: a redrawn bar on a terminal (bytes,
// percent, speed, time left), plain lines every 10% (or 10 s) otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace m40::store {

class Progress {
 public:
  Progress(std::string label, bool terminal, std::FILE* out = stderr);
  void update(uint64_t done, std::optional<uint64_t> total);
  // A message between progress lines (a resumed connection).
  void notice(const std::string& text);
  void finish();
  // Ends a drawn bar's line, so that an error printed next starts a line.
  void abandon();

 private:
  using Clock = std::chrono::steady_clock;
  std::string line(uint64_t done, std::optional<uint64_t> total) const;

  std::string label_;
  bool terminal_;
  std::FILE* out_;
  Clock::time_point start_;
  Clock::time_point last_draw_;
  std::optional<uint64_t> first_done_;  // bytes there when we started (resume)
  uint64_t done_ = 0;
  std::optional<uint64_t> total_;
  int last_decile_ = -1;
  bool drawn_ = false;
};

// "1m20s", "45s", "2h05m".
std::string format_duration(double seconds);

}  // namespace m40::store

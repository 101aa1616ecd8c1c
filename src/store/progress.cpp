#include "store/progress.h"

#include <algorithm>
#include <cmath>

#include "store/store.h"

namespace m40::store {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  return buf;
}

Progress::Progress(std::string label, bool terminal, std::FILE* out)
    : label_(std::move(label)), terminal_(terminal), out_(out), start_(Clock::now()), last_draw_(start_) {}

std::string Progress::line(uint64_t done, std::optional<uint64_t> total) const {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double moved = static_cast<double>(done - std::min(done, first_done_.value_or(0)));
  const double speed = elapsed > 0.05 ? moved / elapsed : 0.0;
  std::string text = label_ + "  ";
  if (total && *total > 0) {
    const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(*total));
    char pct[16];
    std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(fraction * 100.0));
    text += pct;
    if (terminal_) {
      constexpr int kWidth = 25;
      const int filled = static_cast<int>(fraction * kWidth);
      text += " [";
      text.append(static_cast<size_t>(filled), '#');
      text.append(static_cast<size_t>(kWidth - filled), ' ');
      text += ']';
    }
    text += ' ';
    text += human_size(done);
    text += '/';
    text += human_size(*total);
  } else {
    text += human_size(done);
  }
  if (speed > 0) {
    text += "  ";
    text += human_size(static_cast<uint64_t>(speed));
    text += "/s";
    if (total && *total > done) {
      text += "  ";
      text += format_duration(static_cast<double>(*total - done) / speed);
      text += " left";
    }
  }
  return text;
}

void Progress::update(uint64_t done, std::optional<uint64_t> total) {
  if (!first_done_) first_done_ = done;
  done_ = done;
  total_ = total;
  const auto now = Clock::now();
  if (terminal_) {
    if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    std::fprintf(out_, "\r\x1b[K%s", line(done, total).c_str());
    std::fflush(out_);
  } else {
    const int decile = total && *total > 0 ? static_cast<int>(10 * done / *total) : -1;
    const bool step = decile > last_decile_;
    if (!step && now - last_draw_ < std::chrono::seconds(10)) return;
    if (decile >= 10) return;  // finish() prints the last line
    last_decile_ = std::max(decile, last_decile_);
    std::fprintf(out_, "%s\n", line(done, total).c_str());
  }
  last_draw_ = now;
  drawn_ = true;
}

void Progress::notice(const std::string& text) {
  if (terminal_ && drawn_) std::fprintf(out_, "\r\x1b[K");
  std::fprintf(out_, "%s\n", text.c_str());
  drawn_ = false;
}

void Progress::finish() {
  const std::string text = line(done_, total_ ? total_ : std::optional<uint64_t>(done_));
  if (terminal_) std::fprintf(out_, "\r\x1b[K%s\n", text.c_str());
  else std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void Progress::abandon() {
  if (terminal_ && drawn_) std::fprintf(out_, "\n");
  drawn_ = false;
  std::fflush(out_);
}

}  // namespace m40::store

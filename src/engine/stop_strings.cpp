#include "engine/stop_strings.h"

#include <algorithm>

namespace m40::engine {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStringFilter::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // The earliest complete stop string wins.
  size_t first = std::string::npos;
  for (const auto& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at < first) {
      first = at;
      matched_ = stop;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& stop : stops_) {
    for (size_t len = std::min(stop.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

}  // namespace m40::engine

#include "common/memory_size.h"

#include <cctype>
#include <cmath>

#include "common/error.h"

namespace m40 {

uint64_t parse_memory_size(const std::string& text) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (...) {
    throw Error("cannot read the memory size '" + text + "' (examples: 24G, 512M)");
  }
  std::string unit = text.substr(end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit == "" || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") scale = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  else throw Error("unknown memory unit '" + unit + "' in '" + text + "' (use K, M, G or T)");
  if (!(value > 0) || !std::isfinite(value)) throw Error("the memory size '" + text + "' must be positive");
  return static_cast<uint64_t>(value * scale);
}

}  // namespace m40

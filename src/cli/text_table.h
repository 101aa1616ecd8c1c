// Left-aligned columns four spaces apart, as `ollama list` and `ollama ps`
// print them; the first row is the header.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace m40::cli {

inline void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 4, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace m40::cli

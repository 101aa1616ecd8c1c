#include "gguf/split_name.h"

#include <cstdio>
#include <regex>

namespace m40::gguf {

std::string split_file_name(const std::string& prefix, uint64_t number, uint64_t count) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "-%05llu-of-%05llu.gguf", static_cast<unsigned long long>(number),
                static_cast<unsigned long long>(count));
  return prefix + tail;
}

std::optional<SplitFileName> parse_split_file_name(const std::string& path) {
  static const std::regex kPart(R"((.+)-([0-9]{5})-of-([0-9]{5})\.gguf)", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(path, m, kPart)) return std::nullopt;
  SplitFileName name{m[1].str(), static_cast<uint32_t>(std::stoul(m[2].str())),
                     static_cast<uint32_t>(std::stoul(m[3].str()))};
  if (name.number == 0 || name.number > name.count) return std::nullopt;
  return name;
}

}  // namespace m40::gguf

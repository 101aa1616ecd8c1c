// The file names of a model split by llama.cpp's gguf-split:
// PREFIX-00001-of-0000N.gguf .. PREFIX-0000N-of-0000N.gguf, parts numbered
// from 1. The loader finds a model's parts by these names, the store keeps
// them under them, and a Hugging Face listing is read by them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace m40::gguf {

struct SplitFileName {
  std::string prefix;   // the path before "-NNNNN-of-NNNNN.gguf"
  uint32_t number = 0;  // 1-based
  uint32_t count = 0;
};

// PREFIX + "-0000k-of-0000N.gguf" (an empty prefix gives the tail alone).
std::string split_file_name(const std::string& prefix, uint64_t number, uint64_t count);

// The name's place among its parts; nullopt unless it ends in
// -NNNNN-of-NNNNN.gguf (".gguf" in any case) with 1 <= number <= count.
std::optional<SplitFileName> parse_split_file_name(const std::string& path);

}  // namespace m40::gguf

// A GGUF model split as llama.cpp's gguf-split splits it: PREFIX-0000k-of-0000N.gguf,
// the metadata in the first part with split.no / split.count /
// split.tensors.count in every part, the tensors dealt round-robin over the
// parts (as --split-max-tensors spreads them). Used by the loader's tests
// (tests/backends/cpu/test_split_model.cpp) and the pull tests (the parts'
// bytes, for a fake hub to serve).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "binary_runner.h"
#include "gguf/file.h"
#include "gguf/split_name.h"
#include "gguf/writer.h"

namespace m40::test {

// Writes `source` as `parts` files PREFIX-0000k-of-0000N.gguf (`prefix`: a
// path without the tail); returns their bytes, in order. count_override,
// when not 0, is written as split.count instead (a damaged file).
inline std::vector<std::string> write_split(const std::filesystem::path& source, const std::filesystem::path& prefix,
                                            int parts, uint64_t count_override = 0) {
  const auto file = gguf::File::open(source.string());
  std::vector<gguf::Writer> writers;
  for (int i = 0; i < parts; ++i) writers.emplace_back(file.alignment());
  for (const auto& [key, value] : file.metadata().entries()) writers[0].metadata().set(key, value);
  for (int i = 0; i < parts; ++i) {
    writers[i].metadata().set("split.no", gguf::Value(static_cast<uint16_t>(i)));
    writers[i].metadata().set("split.count", gguf::Value(static_cast<uint16_t>(count_override != 0 ? count_override : parts)));
    writers[i].metadata().set("split.tensors.count", gguf::Value(static_cast<int32_t>(file.tensors().size())));
  }
  for (size_t t = 0; t < file.tensors().size(); ++t) {
    const auto& info = file.tensors()[t];
    writers[t % static_cast<size_t>(parts)].add_tensor(info.name, info.type, info.dims, file.tensor_data(info));
  }
  std::vector<std::string> bytes;
  for (int i = 0; i < parts; ++i) {
    const std::string path = gguf::split_file_name(prefix.string(), i + 1, parts);
    writers[i].write(path);
    bytes.push_back(read_text_file(path));
  }
  return bytes;
}

}  // namespace m40::test

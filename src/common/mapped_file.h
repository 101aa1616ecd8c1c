// A read-only memory mapping of a whole file. Model weights are read straight
// from the mapping: the CPU backend computes on it, the CUDA backend uploads
// from it, and nothing is copied into process memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace m40 {

class MappedFile {
 public:
  // Throws m40::Error naming the path and the system error.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace m40

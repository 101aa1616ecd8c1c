// Bounds-checked little-endian reads from a byte span. Every failed read
// names what was being read and the offset where it ran out.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "common/error.h"

namespace m40::gguf {

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return bytes_.size() - offset_; }

  template <class T> T read(const char* what) {
    require(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return v;
  }

  // A GGUF string: uint64 length, then that many bytes (not terminated).
  std::string read_string(const char* what) {
    const uint64_t start = offset_;
    const auto length = read<uint64_t>(what);
    if (length > remaining()) {
      throw FormatError(std::string(what) + ": string length " + std::to_string(length) +
                            " exceeds the " + std::to_string(remaining()) + " bytes left in the file",
                        start);
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + offset_), length);
    offset_ += length;
    return s;
  }

 private:
  void require(uint64_t n, const char* what) const {
    if (n > remaining()) {
      throw FormatError("file truncated while reading " + std::string(what), offset_);
    }
  }

  std::span<const uint8_t> bytes_;
  uint64_t offset_ = 0;
};

}  // namespace m40::gguf

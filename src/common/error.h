// The project's exception types. Every user-facing failure is one of these,
// with a message that says what went wrong and, where it can, what to do.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace m40 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input data (a corrupt or unsupported file), located by byte offset.
class FormatError : public Error {
 public:
  FormatError(const std::string& what, uint64_t offset)
      : Error(what + " (at byte offset " + std::to_string(offset) + ")"), offset_(offset) {}
  uint64_t offset() const { return offset_; }

 private:
  uint64_t offset_;
};

}  // namespace m40

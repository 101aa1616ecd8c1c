// Builds GGUF byte images by hand, independently of the project's writer, so
// reader tests do not trust the code they test.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace m40::test {

class GgufBytes {
 public:
  template <class T> GgufBytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return put<uint32_t>(0x46554747).put(version).put(n_tensors).put(n_kv);
  }
  GgufBytes& pad(size_t alignment = 32) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
    return *this;
  }
  GgufBytes& fill(size_t n, uint8_t value) {
    bytes.insert(bytes.end(), n, value);
    return *this;
  }
  // One tensor info: name, dims (ggml order), type id, data offset.
  GgufBytes& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (auto d : dims) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  std::vector<uint8_t> bytes;
};

}  // namespace m40::test

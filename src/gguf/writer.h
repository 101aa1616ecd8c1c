// Writing GGUF version 3 files. Tensor data is produced tensor by tensor at
// write time, so a 7B-shaped model is written without holding it in memory.
// The file appears under its final name only once complete (atomic rename).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gguf/metadata.h"
#include "gguf/tensor_type.h"

namespace m40::gguf {

class Writer {
 public:
  // Fills the whole byte range of one tensor (its size is given by the span).
  using Filler = std::function<void(std::span<uint8_t> out)>;

  explicit Writer(uint32_t alignment = 32);

  Metadata& metadata() { return metadata_; }
  // dims in ggml order (dims[0] = row length). Throws m40::Error on a
  // duplicate name or a shape the type cannot hold.
  void add_tensor(std::string name, TensorType type, std::vector<uint64_t> dims, Filler fill);
  // Copies `bytes` (which must stay alive until write()) as the tensor data.
  void add_tensor(std::string name, TensorType type, std::vector<uint64_t> dims,
                  std::span<const uint8_t> bytes);

  // Writes path.partial, then renames it to path. Throws m40::Error with the
  // path and the system error on failure (the partial file is removed).
  void write(const std::string& path) const;
  // The complete file image in memory (for tests and small files).
  std::vector<uint8_t> to_bytes() const;

  uint64_t tensor_data_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> dims;
    uint64_t byte_size;
    uint64_t offset;  // in the data section
    Filler fill;
  };
  template <class Sink> void emit(Sink& sink) const;

  uint32_t alignment_;
  Metadata metadata_;
  std::vector<PendingTensor> tensors_;
  uint64_t data_size_ = 0;
};

}  // namespace m40::gguf

// Reading GGUF files (versions 2 and 3): header, metadata, tensor infos and
// the tensor data, straight from a memory mapping. Every structural defect —
// truncation, bad magic, absurd counts, tensors outside the data section,
// overlapping or misaligned tensors, unknown types, dimension overflow — is a
// m40::FormatError naming the problem and its byte offset; nothing is
// allocated in proportion to a count the file has not yet backed with bytes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/metadata.h"
#include "gguf/tensor_type.h"

namespace m40 {
class MappedFile;
}

namespace m40::gguf {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

struct TensorInfo {
  std::string name;
  // ggml order: dims[0] is the row length (the fastest-varying dimension).
  std::vector<uint64_t> dims;
  TensorType type = TensorType::F32;
  uint64_t offset = 0;        // relative to the start of the data section
  uint64_t element_count = 0;
  uint64_t byte_size = 0;
  uint64_t info_offset = 0;   // where this tensor's info starts in the file
  uint32_t part = 0;          // a split model's file that holds the data (0: the first)

  uint64_t rows() const { return dims.empty() || dims[0] == 0 ? 0 : element_count / dims[0]; }
};

class File {
 public:
  // Maps and parses a file. Throws m40::Error if it cannot be opened and
  // m40::FormatError if it is not a valid GGUF file. A split model
  // (llama.cpp's gguf-split: PREFIX-00001-of-0000N.gguf, `split.*` keys) is
  // opened by its first file and reads as one: the metadata of the first,
  // the tensors of all; a missing or mismatched part is an error naming it.
  static File open(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the File).
  static File parse(std::span<const uint8_t> bytes);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const Metadata& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // throws if missing

  uint64_t data_offset() const { return data_offset_; }  // start of the data section
  uint64_t file_size() const { return bytes_.size(); }  // this file's (the first part of a split model)
  uint64_t total_size() const {                         // every part's
    uint64_t total = bytes_.size();
    for (const Part& p : parts_) total += p.bytes.size();
    return total;
  }
  std::span<const uint8_t> tensor_data(const TensorInfo& t) const {
    if (t.part == 0) return bytes_.subspan(data_offset_ + t.offset, t.byte_size);
    const Part& p = parts_[t.part - 1];
    return p.bytes.subspan(p.data_offset + t.offset, t.byte_size);
  }
  // How many files the model is stored in (1 unless split).
  size_t file_count() const { return 1 + parts_.size(); }
  const std::string& path() const { return path_; }

 private:
  File() = default;
  void parse_all();
  static File open_one(const std::string& path);
  void open_split_parts();

  // The other files of a split model, in order.
  struct Part {
    std::shared_ptr<MappedFile> mapping;
    std::span<const uint8_t> bytes;
    uint64_t data_offset = 0;
  };
  std::vector<Part> parts_;

  std::shared_ptr<MappedFile> mapping_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
};

// Byte size of a tensor of this type and shape; throws m40::Error when the
// row length is not a whole number of blocks or the size overflows.
uint64_t tensor_byte_size(TensorType type, std::span<const uint64_t> dims);

}  // namespace m40::gguf

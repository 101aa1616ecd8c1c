#include "gguf/file.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <unordered_set>

#include "common/mapped_file.h"
#include "gguf/byte_reader.h"
#include "gguf/split_name.h"

namespace m40::gguf {

namespace {

// Nested arrays deeper than this are refused: no real file needs them, and
// unbounded recursion on hostile input would exhaust the stack.
constexpr int kMaxArrayDepth = 8;

// The fewest bytes one serialized item can take, used to refuse a count the
// rest of the file cannot possibly hold before anything is allocated for it.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;           // key length, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, 1 dim, type, offset

uint64_t min_value_bytes(ValueType type) {
  switch (type) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 4 + 8;
  }
  return 1;
}

bool is_known_value_type(uint32_t id) { return id <= static_cast<uint32_t>(ValueType::FLOAT64); }

template <class T> Value read_scalar(ByteReader& in, const char* what) { return Value(in.read<T>(what)); }

Value read_value(ByteReader& in, ValueType type, int depth);

Array read_array(ByteReader& in, int depth) {
  const uint64_t start = in.offset();
  if (depth >= kMaxArrayDepth) {
    throw FormatError("arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels", start);
  }
  const auto element_id = in.read<uint32_t>("array element type");
  if (!is_known_value_type(element_id)) {
    throw FormatError("unknown array element type " + std::to_string(element_id), start);
  }
  Array array;
  array.element_type = static_cast<ValueType>(element_id);
  const uint64_t count_offset = in.offset();
  const auto count = in.read<uint64_t>("array length");
  if (count > in.remaining() / min_value_bytes(array.element_type)) {
    throw FormatError("array of " + std::to_string(count) + " " +
                          std::string(value_type_name(array.element_type)) +
                          " items cannot fit in the " + std::to_string(in.remaining()) +
                          " bytes left in the file",
                      count_offset);
  }
  array.items.reserve(count);
  for (uint64_t i = 0; i < count; ++i) array.items.push_back(read_value(in, array.element_type, depth + 1));
  return array;
}

Value read_value(ByteReader& in, ValueType type, int depth) {
  switch (type) {
    case ValueType::UINT8: return read_scalar<uint8_t>(in, "uint8 value");
    case ValueType::INT8: return read_scalar<int8_t>(in, "int8 value");
    case ValueType::UINT16: return read_scalar<uint16_t>(in, "uint16 value");
    case ValueType::INT16: return read_scalar<int16_t>(in, "int16 value");
    case ValueType::UINT32: return read_scalar<uint32_t>(in, "uint32 value");
    case ValueType::INT32: return read_scalar<int32_t>(in, "int32 value");
    case ValueType::FLOAT32: return read_scalar<float>(in, "float32 value");
    case ValueType::UINT64: return read_scalar<uint64_t>(in, "uint64 value");
    case ValueType::INT64: return read_scalar<int64_t>(in, "int64 value");
    case ValueType::FLOAT64: return read_scalar<double>(in, "float64 value");
    case ValueType::BOOL: {
      const uint64_t at = in.offset();
      const auto b = in.read<uint8_t>("bool value");
      if (b > 1) throw FormatError("bool value " + std::to_string(b) + " is neither 0 nor 1", at);
      return Value(b == 1);
    }
    case ValueType::STRING: return Value(in.read_string("string value"));
    case ValueType::ARRAY: return Value(read_array(in, depth));
  }
  throw FormatError("unknown value type", in.offset());
}

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

}  // namespace

uint64_t tensor_byte_size(TensorType type, std::span<const uint64_t> dims) {
  const auto& traits = tensor_type_traits(type);
  if (dims.empty()) throw Error("a tensor needs at least one dimension");
  if (dims[0] % traits.block_size != 0) {
    throw Error("row length " + std::to_string(dims[0]) + " is not a multiple of the " +
                std::string(traits.name) + " block size " + std::to_string(traits.block_size));
  }
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const uint64_t blocks_per_row = dims[0] / traits.block_size;
  if (blocks_per_row > kMax / traits.bytes_per_block) throw Error("tensor byte size overflows");
  uint64_t bytes = blocks_per_row * traits.bytes_per_block;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i] != 0 && bytes > kMax / dims[i]) throw Error("tensor byte size overflows");
    bytes *= dims[i];
  }
  return bytes;
}

File File::open(const std::string& path) {
  File file = open_one(path);
  if (file.metadata_.get_optional<uint64_t>("split.count").value_or(1) > 1) file.open_split_parts();
  return file;
}

void File::open_split_parts() {
  const auto count = metadata_.get<uint64_t>("split.count");
  const auto number = metadata_.get_optional<uint64_t>("split.no").value_or(0);
  const std::string tail = split_file_name("", number + 1, count);
  if (!path_.ends_with(tail)) {
    throw Error(path_ + ": a split model's files are named PREFIX-NNNNN-of-" + tail.substr(10, 5) +
                ".gguf; this one's name does not say which part it is");
  }
  const std::string prefix = path_.substr(0, path_.size() - tail.size());
  if (number != 0) {
    throw Error(path_ + " is part " + std::to_string(number + 1) + " of " + std::to_string(count) +
                " of a split model: open its first part, " + split_file_name(prefix, 1, count));
  }
  std::unordered_set<std::string> names;
  for (const auto& t : tensors_) names.insert(t.name);
  for (uint64_t i = 1; i < count; ++i) {
    const std::string part_path = split_file_name(prefix, i + 1, count);
    File part;
    try {
      part = open_one(part_path);
    } catch (const Error& e) {
      throw Error("part " + std::to_string(i + 1) + " of " + std::to_string(count) + " of the split model " + path_ +
                  " cannot be read: " + e.what());
    }
    if (part.metadata_.get_optional<uint64_t>("split.no") != i || part.metadata_.get_optional<uint64_t>("split.count") != count) {
      throw Error(part_path + " is not part " + std::to_string(i + 1) + " of " + std::to_string(count) +
                  " of the same split model (its split.no / split.count say otherwise)");
    }
    const auto index = static_cast<uint32_t>(parts_.size() + 1);
    for (auto& t : part.tensors_) {
      if (!names.insert(t.name).second) throw Error(part_path + ": tensor '" + t.name + "' is also in an earlier part");
      t.part = index;
      tensors_.push_back(std::move(t));
    }
    parts_.push_back(Part{part.mapping_, part.bytes_, part.data_offset_});
  }
  if (auto expected = metadata_.get_optional<uint64_t>("split.tensors.count"); expected && *expected != tensors_.size()) {
    throw Error(path_ + ": the split model's parts hold " + std::to_string(tensors_.size()) + " tensors but split.tensors.count says " +
                std::to_string(*expected));
  }
}

File File::open_one(const std::string& path) {
  File file;
  file.mapping_ = std::make_shared<MappedFile>(path);
  file.bytes_ = file.mapping_->bytes();
  file.path_ = path;
  try {
    file.parse_all();
  } catch (const FormatError& e) {
    // e.what() already ends with the offset, which the new error appends again.
    std::string what = e.what();
    const std::string suffix = " (at byte offset " + std::to_string(e.offset()) + ")";
    if (what.ends_with(suffix)) what.resize(what.size() - suffix.size());
    throw FormatError(path + ": " + what, e.offset());
  }
  return file;
}

File File::parse(std::span<const uint8_t> bytes) {
  File file;
  file.bytes_ = bytes;
  file.parse_all();
  return file;
}

File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

const TensorInfo* File::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const TensorInfo& File::tensor(std::string_view name) const {
  if (const TensorInfo* t = find_tensor(name)) return *t;
  throw Error("tensor '" + std::string(name) + "' is missing from the model file");
}

void File::parse_all() {
  ByteReader in(bytes_);

  const auto magic = in.read<uint32_t>("magic");
  if (magic != kMagic) throw FormatError("not a GGUF file (the magic bytes are not \"GGUF\")", 0);
  version_ = in.read<uint32_t>("version");
  if (version_ == 1) throw FormatError("GGUF version 1 is not supported (re-convert the model)", 4);
  if (version_ != 2 && version_ != 3) {
    throw FormatError("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)", 4);
  }
  const auto tensor_count = in.read<uint64_t>("tensor count");
  const auto kv_count = in.read<uint64_t>("metadata count");
  if (tensor_count > in.remaining() / kMinTensorInfoBytes) {
    throw FormatError("tensor count " + std::to_string(tensor_count) + " cannot fit in the file", 8);
  }
  if (kv_count > in.remaining() / kMinKeyValueBytes) {
    throw FormatError("metadata count " + std::to_string(kv_count) + " cannot fit in the file", 16);
  }

  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t kv_offset = in.offset();
    std::string key = in.read_string("metadata key");
    if (key.empty()) throw FormatError("empty metadata key", kv_offset);
    if (metadata_.contains(key)) throw FormatError("duplicate metadata key '" + key + "'", kv_offset);
    const uint64_t type_offset = in.offset();
    const auto type_id = in.read<uint32_t>("metadata value type");
    if (!is_known_value_type(type_id)) {
      throw FormatError("metadata key '" + key + "' has unknown value type " + std::to_string(type_id),
                        type_offset);
    }
    const uint64_t value_offset = in.offset();
    Value value = read_value(in, static_cast<ValueType>(type_id), 0);
    if (key == "general.alignment") {
      const auto* v = std::get_if<uint32_t>(&value.storage);
      if (v == nullptr || *v == 0 || (*v & (*v - 1)) != 0) {
        throw FormatError("general.alignment must be a power-of-two uint32, got " + value.to_display_string(),
                          value_offset);
      }
      alignment_ = *v;
    }
    metadata_.set(std::move(key), std::move(value));
  }

  std::unordered_set<std::string> names;
  tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    t.info_offset = in.offset();
    t.name = in.read_string("tensor name");
    if (!names.insert(t.name).second) throw FormatError("duplicate tensor name '" + t.name + "'", t.info_offset);
    const uint64_t dims_offset = in.offset();
    const auto n_dims = in.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims) {
      throw FormatError("tensor '" + t.name + "' has " + std::to_string(n_dims) +
                            " dimensions (1 to " + std::to_string(kMaxDims) + " allowed)",
                        dims_offset);
    }
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim_offset = in.offset();
      const auto dim = in.read<uint64_t>("tensor dimension");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw FormatError("tensor '" + t.name + "' dimension " + std::to_string(dim) + " is too large", dim_offset);
      }
      t.dims.push_back(dim);
    }
    const uint64_t type_offset = in.offset();
    const auto type_id = in.read<uint32_t>("tensor type");
    const auto traits = find_tensor_type(type_id);
    if (!traits) {
      throw FormatError("tensor '" + t.name + "' has unknown type id " + std::to_string(type_id), type_offset);
    }
    t.type = traits->type;
    try {
      t.byte_size = tensor_byte_size(t.type, t.dims);
    } catch (const Error& e) {
      throw FormatError("tensor '" + t.name + "': " + e.what(), dims_offset);
    }
    t.element_count = 1;
    for (uint64_t dim : t.dims) t.element_count *= dim;  // cannot overflow: bytes >= elements / 32
    const uint64_t offset_offset = in.offset();
    t.offset = in.read<uint64_t>("tensor data offset");
    if (t.offset % alignment_ != 0) {
      throw FormatError("tensor '" + t.name + "' data offset " + std::to_string(t.offset) +
                            " is not a multiple of the alignment " + std::to_string(alignment_),
                        offset_offset);
    }
    tensors_.push_back(std::move(t));
  }

  data_offset_ = align_up(in.offset(), alignment_);
  if (tensors_.empty()) return;  // vocabulary-only files may end without padding
  if (data_offset_ > bytes_.size()) {
    throw FormatError("file truncated before the tensor data section", in.offset());
  }
  const uint64_t data_size = bytes_.size() - data_offset_;

  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& t : tensors_) {
    if (t.offset > data_size || t.byte_size > data_size - t.offset) {
      throw FormatError("tensor '" + t.name + "' data (" + std::to_string(t.byte_size) + " bytes at data offset " +
                            std::to_string(t.offset) + ") lies outside the file: the data section holds " +
                            std::to_string(data_size) + " bytes (truncated file?)",
                        t.info_offset);
    }
    if (t.byte_size != 0) by_offset.push_back(&t);  // an empty tensor overlaps nothing (writers share its offset)
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.offset < prev.offset + prev.byte_size) {
      throw FormatError("tensor '" + cur.name + "' data overlaps tensor '" + prev.name + "'", cur.info_offset);
    }
  }
}

}  // namespace m40::gguf

#include "store/gguf_extent.h"

#include <array>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "common/error.h"
#include "gguf/file.h"
#include "gguf/tensor_type.h"

namespace m40::store {

namespace {

constexpr uint32_t kMaxArrayDepth = 8;  // as gguf::File allows
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// Thrown inside the probe: the prefix ends before `need` bytes.
struct NeedMore {
  uint64_t need;
};
// Thrown inside the probe: the bytes cannot be a GGUF file.
struct Invalid {
  std::string problem;
};

// Buffered reads of the prefix, in order.
class Cursor {
 public:
  Cursor(const PrefixReader& read, uint64_t available) : read_(read), available_(available) {}

  uint64_t position() const { return position_; }

  template <class T> T read() {
    T value;
    copy(&value, sizeof value);
    return value;
  }

  std::string read_text(uint64_t length) {
    std::string text(length, '\0');
    copy(text.data(), length);
    return text;
  }

  void skip(uint64_t bytes) {
    if (bytes > kMax - position_) throw Invalid{"a length past any file's end"};
    require(position_ + bytes);
    position_ += bytes;
  }

 private:
  void require(uint64_t end) const {
    if (end > available_) throw NeedMore{end};
  }

  void copy(void* out, size_t size) {
    require(position_ + size);
    auto* dest = static_cast<uint8_t*>(out);
    while (size > 0) {
      if (position_ < buffer_start_ || position_ >= buffer_start_ + buffer_size_) fill();
      const size_t at = static_cast<size_t>(position_ - buffer_start_);
      const size_t n = std::min(size, buffer_size_ - at);
      std::memcpy(dest, buffer_.data() + at, n);
      dest += n;
      size -= n;
      position_ += n;
    }
  }

  void fill() {
    buffer_start_ = position_;
    const uint64_t left = available_ - position_;
    const size_t want = static_cast<size_t>(std::min<uint64_t>(left, buffer_.size()));
    buffer_size_ = read_(position_, buffer_.data(), want);
    if (buffer_size_ == 0) throw NeedMore{position_ + 1};  // the file is shorter than it was said to be
  }

  const PrefixReader& read_;
  uint64_t available_;
  uint64_t position_ = 0;
  std::vector<uint8_t> buffer_ = std::vector<uint8_t>(64 << 10);
  uint64_t buffer_start_ = 0;
  size_t buffer_size_ = 0;
};

// Bytes of a value of a fixed-size type; 0 for strings and arrays.
uint64_t fixed_size(uint32_t type) {
  switch (type) {
    case 0: case 1: case 7: return 1;      // uint8, int8, bool
    case 2: case 3: return 2;              // uint16, int16
    case 4: case 5: case 6: return 4;      // uint32, int32, float32
    case 10: case 11: case 12: return 8;   // uint64, int64, float64
    default: return 0;
  }
}
constexpr uint32_t kString = 8;
constexpr uint32_t kArray = 9;

void skip_value(Cursor& in, uint32_t type, uint32_t depth) {
  if (const uint64_t size = fixed_size(type); size > 0) return in.skip(size);
  if (type == kString) return in.skip(in.read<uint64_t>());
  if (type != kArray) throw Invalid{"unknown value type " + std::to_string(type)};
  if (depth >= kMaxArrayDepth) throw Invalid{"arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels"};
  const auto element = in.read<uint32_t>();
  const auto count = in.read<uint64_t>();
  if (const uint64_t size = fixed_size(element); size > 0) {
    if (count > kMax / size) throw Invalid{"an array of " + std::to_string(count) + " items"};
    return in.skip(count * size);
  }
  if (element != kString && element != kArray) throw Invalid{"unknown array element type " + std::to_string(element)};
  for (uint64_t i = 0; i < count; ++i) skip_value(in, element, depth + 1);
}

uint64_t align_up(uint64_t x, uint64_t alignment) {
  const uint64_t rest = x % alignment;
  if (rest == 0) return x;
  if (x > kMax - (alignment - rest)) throw Invalid{"a tensor ends past any file's end"};
  return x + (alignment - rest);
}

GgufExtent read_extent(Cursor& in) {
  if (in.read<uint32_t>() != gguf::kMagic) throw Invalid{"the first bytes are not \"GGUF\""};
  const auto version = in.read<uint32_t>();
  if (version != 2 && version != 3) throw Invalid{"unsupported GGUF version " + std::to_string(version)};
  const auto tensor_count = in.read<uint64_t>();
  const auto kv_count = in.read<uint64_t>();
  uint64_t alignment = gguf::kDefaultAlignment;
  for (uint64_t i = 0; i < kv_count; ++i) {
    const auto key_length = in.read<uint64_t>();
    constexpr std::string_view kAlignmentKey = "general.alignment";
    bool alignment_key = false;
    if (key_length == kAlignmentKey.size()) {
      alignment_key = in.read_text(key_length) == kAlignmentKey;
    } else {
      in.skip(key_length);
    }
    const auto type = in.read<uint32_t>();
    if (alignment_key && type == 4) {  // uint32
      const auto value = in.read<uint32_t>();
      if (value == 0 || (value & (value - 1)) != 0) throw Invalid{"general.alignment is not a power of two"};
      alignment = value;
    } else {
      skip_value(in, type, 0);
    }
  }
  uint64_t data_end = 0;  // the end of the last tensor, from the data section's start
  for (uint64_t i = 0; i < tensor_count; ++i) {
    in.skip(in.read<uint64_t>());  // the name
    const auto n_dims = in.read<uint32_t>();
    if (n_dims == 0 || n_dims > gguf::kMaxDims) throw Invalid{"a tensor with " + std::to_string(n_dims) + " dimensions"};
    std::array<uint64_t, gguf::kMaxDims> dims{};
    for (uint32_t d = 0; d < n_dims; ++d) dims[d] = in.read<uint64_t>();
    const auto type_id = in.read<uint32_t>();
    const auto traits = gguf::find_tensor_type(type_id);
    if (!traits) throw Invalid{"a tensor of unknown type " + std::to_string(type_id)};
    uint64_t bytes = 0;
    try {
      bytes = gguf::tensor_byte_size(traits->type, std::span<const uint64_t>(dims.data(), n_dims));
    } catch (const Error& e) {
      throw Invalid{std::string("a tensor's size: ") + e.what()};
    }
    const auto offset = in.read<uint64_t>();
    if (offset > kMax - bytes) throw Invalid{"a tensor ends past any file's end"};
    data_end = std::max(data_end, offset + bytes);
  }
  const uint64_t infos_end = in.position();
  const uint64_t data_offset = align_up(infos_end, alignment);
  // A file without tensors (a vocabulary) may end before the padding.
  if (tensor_count == 0) return {infos_end, data_offset};
  if (data_end > kMax - data_offset) throw Invalid{"a tensor ends past any file's end"};
  const uint64_t padded_end = align_up(data_end, alignment);
  if (padded_end > kMax - data_offset) throw Invalid{"a tensor ends past any file's end"};
  return {data_offset + data_end, data_offset + padded_end};
}

}  // namespace

GgufProbe probe_gguf(const PrefixReader& read, uint64_t available) {
  GgufProbe probe;
  Cursor in(read, available);
  try {
    probe.extent = read_extent(in);
    probe.status = GgufProbe::Status::Done;
  } catch (const NeedMore& more) {
    probe.status = GgufProbe::Status::NeedMore;
    probe.need = more.need;
  } catch (const Invalid& invalid) {
    probe.status = GgufProbe::Status::Invalid;
    probe.problem = invalid.problem;
  }
  return probe;
}

}  // namespace m40::store

// libFuzzer target for the GGUF reader: parses the input with
// m40::gguf::File::parse, touches every metadata value and tensor info, reads
// the first and last byte of every tensor's data, and checks the promises
// that gguf/file.h makes about a file it accepts. Rejecting the input with
// m40::Error is the expected outcome for most inputs; anything else — a
// crash, a sanitizer report, another exception, a broken promise — is a bug.
//
// An accepted file is also written back with gguf::Writer and parsed again:
// the copy must hold the same metadata and tensors.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "gguf/file.h"
#include "gguf/metadata.h"
#include "gguf/tensor_type.h"
#include "gguf/writer.h"

namespace {

using m40::gguf::File;
using m40::gguf::Metadata;
using m40::gguf::TensorInfo;
using m40::gguf::Value;

// Keeps the compiler from dropping reads whose results are unused.
volatile uint64_t g_sink;
void sink(uint64_t v) { g_sink = g_sink + v; }

[[noreturn]] void broken(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_gguf_reader: broken promise: %s %s\n", what, detail.c_str());
  std::abort();
}

// Bitwise equality, so that NaN metadata compares equal to itself.
bool same_value(const Value& a, const Value& b) {
  if (a.type() != b.type()) return false;
  return std::visit(
      [&](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b.storage);
        if constexpr (std::is_same_v<T, m40::gguf::Array>) {
          if (x.element_type != y.element_type || x.items.size() != y.items.size()) return false;
          for (size_t i = 0; i < x.items.size(); ++i) {
            if (!same_value(x.items[i], y.items[i])) return false;
          }
          return true;
        } else if constexpr (std::is_same_v<T, std::string>) {
          return x == y;
        } else {
          return std::memcmp(&x, &y, sizeof(T)) == 0;
        }
      },
      a.storage);
}

void touch_value(const Value& v, int depth) {
  sink(static_cast<uint64_t>(v.type()));
  sink(m40::gguf::value_type_name(v.type()).size());
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, m40::gguf::Array>) {
          sink(static_cast<uint64_t>(x.element_type) + x.items.size());
          for (const Value& item : x.items) {
            if (item.type() != x.element_type) broken("array item of another type than the array's");
            touch_value(item, depth + 1);
          }
        } else if constexpr (std::is_same_v<T, std::string>) {
          sink(x.size());
          if (!x.empty()) sink(static_cast<uint8_t>(x.front()) + static_cast<uint8_t>(x.back()));
        } else {
          uint64_t bits = 0;
          std::memcpy(&bits, &x, sizeof(T));
          sink(bits);
        }
      },
      v.storage);
  if (depth == 0) sink(v.to_display_string().size());
}

// Typed access converts or throws MetadataError; either is fine.
template <class T> void try_get(const Metadata& md, const std::string& key) {
  try {
    if (auto v = md.get_optional<T>(key)) sink(sizeof(*v));
  } catch (const m40::Error&) {
  }
  try {
    sink(md.get_array<T>(key).size());
  } catch (const m40::Error&) {
  }
}

void touch_metadata(const Metadata& md) {
  sink(md.size());
  for (const auto& [key, value] : md.entries()) {
    if (md.find(key) != &value) broken("Metadata::find does not return the entry for key", key);
    touch_value(value, 0);
    try_get<bool>(md, key);
    try_get<std::string>(md, key);
    try_get<float>(md, key);
    try_get<double>(md, key);
    try_get<uint8_t>(md, key);
    try_get<int8_t>(md, key);
    try_get<uint16_t>(md, key);
    try_get<int16_t>(md, key);
    try_get<uint32_t>(md, key);
    try_get<int32_t>(md, key);
    try_get<uint64_t>(md, key);
    try_get<int64_t>(md, key);
  }
}

void touch_tensors(const File& file) {
  const uint64_t size = file.file_size();
  if (!file.tensors().empty() && file.data_offset() > size) broken("data section starts past the end");
  if (file.alignment() == 0 || (file.alignment() & (file.alignment() - 1)) != 0) broken("alignment");
  if (file.data_offset() % file.alignment() != 0) broken("data section misaligned");
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : file.tensors()) {
    sink(t.name.size() + t.dims.size() + static_cast<uint64_t>(t.type) + t.info_offset);
    sink(t.rows());
    sink(m40::gguf::tensor_type_name(t.type).size());
    if (t.dims.empty() || t.dims.size() > m40::gguf::kMaxDims) broken("dimension count", t.name);
    uint64_t elements = 1;
    for (uint64_t d : t.dims) elements *= d;
    if (elements != t.element_count) broken("element_count is not the product of dims", t.name);
    if (m40::gguf::tensor_byte_size(t.type, t.dims) != t.byte_size) broken("byte_size", t.name);
    if (t.offset % file.alignment() != 0) broken("tensor data misaligned", t.name);
    if (t.offset > size - file.data_offset() || t.byte_size > size - file.data_offset() - t.offset) {
      broken("tensor data outside the file", t.name);
    }
    if (file.find_tensor(t.name) != &t) broken("find_tensor", t.name);
    std::span<const uint8_t> data = file.tensor_data(t);
    if (data.size() != t.byte_size) broken("tensor_data size", t.name);
    if (!data.empty()) sink(data.front() + data.back());
    if (t.byte_size != 0) by_offset.push_back(&t);  // an empty tensor overlaps nothing
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    if (by_offset[i]->offset < prev.offset + prev.byte_size) {
      broken("overlapping tensors", prev.name + " / " + by_offset[i]->name);
    }
  }
}

// Writes an accepted file back and parses the copy: same metadata, same
// tensors, same bytes. The writer may refuse what it cannot represent.
void round_trip(const File& file) {
  // A legal alignment of up to 2^31 would make the writer pad that much.
  if (file.alignment() > (1u << 16)) return;
  std::vector<uint8_t> copy;
  try {
    m40::gguf::Writer writer(file.alignment());
    for (const auto& [key, value] : file.metadata().entries()) writer.metadata().set(key, value);
    for (const TensorInfo& t : file.tensors()) writer.add_tensor(t.name, t.type, t.dims, file.tensor_data(t));
    copy = writer.to_bytes();
  } catch (const m40::Error&) {
    return;
  }
  std::optional<File> again;
  try {
    again.emplace(File::parse(copy));
  } catch (const m40::Error& e) {
    broken("the reader rejects what the writer wrote:", e.what());
  }
  const auto& a = file.metadata().entries();
  const Metadata& b = again->metadata();
  for (const auto& [key, value] : a) {
    const Value* other = b.find(key);
    if (other == nullptr || !same_value(value, *other)) broken("metadata changed in the round trip", key);
  }
  if (again->tensors().size() != file.tensors().size()) broken("tensor count changed in the round trip");
  for (const TensorInfo& t : file.tensors()) {
    const TensorInfo* u = again->find_tensor(t.name);
    if (u == nullptr || u->type != t.type || u->dims != t.dims) broken("tensor changed in the round trip", t.name);
    auto x = file.tensor_data(t);
    auto y = again->tensor_data(*u);
    if (x.size() != y.size() || !std::equal(x.begin(), x.end(), y.begin())) {
      broken("tensor data changed in the round trip", t.name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<File> file;
  try {
    file.emplace(File::parse(std::span<const uint8_t>(data, size)));
  } catch (const m40::Error&) {
    return 0;  // rejected with a message: the expected outcome
  }
  if (file->file_size() != size) broken("file_size");
  if (file->version() != 2 && file->version() != 3) broken("version");
  touch_metadata(file->metadata());
  touch_tensors(*file);
  round_trip(*file);
  return 0;
}

#include "gguf/writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "gguf/file.h"

namespace m40::gguf {

namespace {

// Appends to a byte vector (to_bytes) or a FILE (write); same serialization.
struct VectorSink {
  std::vector<uint8_t>& out;
  void put(const void* p, size_t n) {
    // resize + memcpy rather than insert: GCC 12 warns falsely on the latter.
    const size_t at = out.size();
    out.resize(at + n);
    if (n != 0) std::memcpy(out.data() + at, p, n);
  }
  uint64_t position() const { return out.size(); }
};

struct FileSink {
  std::FILE* f;
  const std::string& path;
  uint64_t written = 0;
  void put(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, f) != n) {
      throw Error("cannot write '" + path + "': " + std::strerror(errno));
    }
    written += n;
  }
  uint64_t position() const { return written; }
};

template <class Sink, class T> void put_scalar(Sink& sink, T v) { sink.put(&v, sizeof v); }

template <class Sink> void put_string(Sink& sink, const std::string& s) {
  put_scalar<Sink, uint64_t>(sink, s.size());
  sink.put(s.data(), s.size());
}

template <class Sink> void put_value(Sink& sink, const Value& value) {
  std::visit(
      [&](const auto& v) {
        using S = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<S, std::string>) {
          put_string(sink, v);
        } else if constexpr (std::is_same_v<S, Array>) {
          put_scalar<Sink, uint32_t>(sink, static_cast<uint32_t>(v.element_type));
          put_scalar<Sink, uint64_t>(sink, v.items.size());
          for (const Value& item : v.items) {
            if (item.type() != v.element_type) throw Error("GGUF arrays must hold one element type");
            put_value(sink, item);
          }
        } else if constexpr (std::is_same_v<S, bool>) {
          put_scalar<Sink, uint8_t>(sink, v ? 1 : 0);
        } else {
          put_scalar(sink, v);
        }
      },
      value.storage);
}

template <class Sink> void put_zeros(Sink& sink, uint64_t count) {
  static const uint8_t zeros[256] = {};
  while (count > 0) {
    const uint64_t n = std::min<uint64_t>(count, sizeof zeros);
    sink.put(zeros, n);
    count -= n;
  }
}

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error("GGUF alignment must be a power of two, got " + std::to_string(alignment));
  }
  if (alignment != kDefaultAlignment) metadata_.set("general.alignment", Value(alignment));
}

void Writer::add_tensor(std::string name, TensorType type, std::vector<uint64_t> dims, Filler fill) {
  for (const auto& t : tensors_) {
    if (t.name == name) throw Error("duplicate tensor name '" + name + "'");
  }
  if (dims.empty() || dims.size() > kMaxDims) {
    throw Error("tensor '" + name + "' must have 1 to " + std::to_string(kMaxDims) + " dimensions");
  }
  const uint64_t byte_size = tensor_byte_size(type, dims);
  const uint64_t offset = align_up(data_size_, alignment_);
  data_size_ = offset + byte_size;
  tensors_.push_back({std::move(name), type, std::move(dims), byte_size, offset, std::move(fill)});
}

void Writer::add_tensor(std::string name, TensorType type, std::vector<uint64_t> dims,
                        std::span<const uint8_t> bytes) {
  const uint64_t expected = tensor_byte_size(type, dims);
  if (bytes.size() != expected) {
    throw Error("tensor '" + name + "' needs " + std::to_string(expected) + " bytes, got " +
                std::to_string(bytes.size()));
  }
  add_tensor(std::move(name), type, std::move(dims),
             [bytes](std::span<uint8_t> out) {
               if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
             });
}

uint64_t Writer::tensor_data_bytes() const { return data_size_; }

template <class Sink> void Writer::emit(Sink& sink) const {
  put_scalar<Sink, uint32_t>(sink, kMagic);
  put_scalar<Sink, uint32_t>(sink, 3);
  put_scalar<Sink, uint64_t>(sink, tensors_.size());
  put_scalar<Sink, uint64_t>(sink, metadata_.size());
  for (const auto& [key, value] : metadata_.entries()) {
    put_string(sink, key);
    put_scalar<Sink, uint32_t>(sink, static_cast<uint32_t>(value.type()));
    put_value(sink, value);
  }
  for (const auto& t : tensors_) {
    put_string(sink, t.name);
    put_scalar<Sink, uint32_t>(sink, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) put_scalar<Sink, uint64_t>(sink, d);
    put_scalar<Sink, uint32_t>(sink, static_cast<uint32_t>(t.type));
    put_scalar<Sink, uint64_t>(sink, t.offset);
  }
  if (tensors_.empty()) return;
  put_zeros(sink, align_up(sink.position(), alignment_) - sink.position());
  const uint64_t data_start = sink.position();
  std::vector<uint8_t> buffer;
  for (const auto& t : tensors_) {
    put_zeros(sink, data_start + t.offset - sink.position());
    buffer.resize(t.byte_size);
    t.fill(std::span<uint8_t>(buffer.data(), buffer.size()));
    sink.put(buffer.data(), buffer.size());
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink{out};
  emit(sink);
  return out;
}

void Writer::write(const std::string& path) const {
  const std::string partial = path + ".partial";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(partial.c_str(), "wb"), &std::fclose);
  if (!f) throw Error("cannot create '" + partial + "': " + std::strerror(errno));
  try {
    FileSink sink{f.get(), partial};
    emit(sink);
    if (std::fclose(f.release()) != 0) throw Error("cannot write '" + partial + "': " + std::strerror(errno));
  } catch (...) {
    f.reset();
    std::remove(partial.c_str());
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::remove(partial.c_str());
    throw Error("cannot rename '" + partial + "' to '" + path + "': " + ec.message());
  }
}

}  // namespace m40::gguf

// Makes a seed corpus and a dictionary for fuzz_gguf_reader from real GGUF
// files. Real files are megabytes, mostly tensor data and tokenizer arrays,
// and a fuzzer mutating them spends its time far from the parser's interesting
// parts. So for each input FILE.gguf this writes, into OUT_DIR:
//
//   FILE.small.gguf   a valid small copy: every metadata key with arrays cut
//                     to a few items and strings to a few bytes, every tensor
//                     info (name, type, number of dimensions) with one block
//                     of the original data: the reader's whole success path;
//   FILE.small-v2.gguf  the same with version 2 in its header;
//   FILE.infos.gguf   the original header, metadata and tensor infos without
//                     the tensor data (a truncated file: the bounds checks),
//                     when that fits in MAX_BYTES.
//
// and appends to DICT every metadata key and tensor name, plain and with the
// 8-byte length prefix that precedes strings in a GGUF file.
//
//   make_seeds OUT_DIR MAX_BYTES DICT FILE.gguf...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/mapped_file.h"
#include "gguf/file.h"
#include "gguf/writer.h"

namespace {

namespace fs = std::filesystem;
using m40::gguf::Value;

constexpr size_t kMaxArrayItems = 4;
constexpr size_t kMaxStringBytes = 48;

Value shrink(const Value& v) {
  if (const auto* s = std::get_if<std::string>(&v.storage)) {
    return Value(s->substr(0, kMaxStringBytes));
  }
  if (const auto* a = std::get_if<m40::gguf::Array>(&v.storage)) {
    m40::gguf::Array small;
    small.element_type = a->element_type;
    for (size_t i = 0; i < a->items.size() && i < kMaxArrayItems; ++i) small.items.push_back(shrink(a->items[i]));
    return Value(std::move(small));
  }
  return v;
}

void write_bytes(const fs::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw m40::Error("cannot write " + path.string());
}

// A libFuzzer dictionary entry: "..." with \xNN escapes.
std::string dict_entry(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out + "\"";
}

std::string length_prefixed(const std::string& s) {
  std::string out(8, '\0');
  uint64_t n = s.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s OUT_DIR MAX_BYTES DICT FILE.gguf...\n", argv[0]);
    return 2;
  }
  const fs::path out_dir = argv[1];
  const uint64_t max_bytes = std::stoull(argv[2]);
  const fs::path dict_path = argv[3];
  fs::create_directories(out_dir);

  std::set<std::string> words;
  int seeds = 0;
  int failures = 0;
  for (int i = 4; i < argc; ++i) {
    const std::string path = argv[i];
    const std::string stem = fs::path(path).stem().string();
    try {
      const auto file = m40::gguf::File::open(path);
      m40::gguf::Writer writer(file.alignment());
      for (const auto& [key, value] : file.metadata().entries()) {
        words.insert(key);
        writer.metadata().set(key, shrink(value));
      }
      for (const auto& t : file.tensors()) {
        words.insert(t.name);
        const auto& traits = m40::gguf::tensor_type_traits(t.type);
        std::vector<uint64_t> dims(t.dims.size(), 1);
        dims[0] = traits.block_size;
        auto data = file.tensor_data(t);
        std::vector<uint8_t> block(traits.bytes_per_block, 0);
        std::copy_n(data.begin(), std::min<size_t>(block.size(), data.size()), block.begin());
        writer.add_tensor(t.name, t.type, dims, [block](std::span<uint8_t> out) {
          std::fill(out.begin(), out.end(), 0);
          std::copy_n(block.begin(), std::min(block.size(), out.size()), out.begin());
        });
      }
      std::vector<uint8_t> small = writer.to_bytes();
      if (small.size() > max_bytes) {
        std::fprintf(stderr, "make_seeds: %s: the small copy has %zu bytes, more than %llu\n", path.c_str(),
                     small.size(), static_cast<unsigned long long>(max_bytes));
      }
      write_bytes(out_dir / (stem + ".small.gguf"), small.data(), small.size());
      if (small.size() >= 8) {
        small[4] = 2;  // version 2: the same layout as version 3
        write_bytes(out_dir / (stem + ".small-v2.gguf"), small.data(), small.size());
        seeds += 2;
      }
      const uint64_t infos_end = std::min<uint64_t>(file.data_offset(), file.file_size());
      if (!file.tensors().empty() && infos_end <= max_bytes) {
        const auto bytes = m40::MappedFile(path).bytes();
        write_bytes(out_dir / (stem + ".infos.gguf"), bytes.data(), infos_end);
        ++seeds;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "make_seeds: %s: %s\n", path.c_str(), e.what());
      ++failures;
    }
  }

  std::ofstream dict(dict_path, std::ios::app);
  dict << "# metadata keys and tensor names of the seed files\n";
  for (const auto& w : words) {
    dict << dict_entry(w) << "\n" << dict_entry(length_prefixed(w)) << "\n";
  }
  if (!dict) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", dict_path.c_str());
    return 1;
  }
  std::printf("make_seeds: %d seeds from %d files (%d unreadable), %zu dictionary words\n", seeds, argc - 4,
              failures, words.size());
  return 0;
}

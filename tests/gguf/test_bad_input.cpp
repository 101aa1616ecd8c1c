// Corrupt and hostile files: each ends in a FormatError naming the problem and
// its byte offset; none crashes, hangs or allocates in proportion to a lie.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "gguf/file.h"
#include "gguf_bytes.h"
#include "test_paths.h"

using namespace m40::gguf;
using m40::test::GgufBytes;

namespace {

// Parses and expects a FormatError whose message contains `fragment`, at `offset`.
void expect_format_error(const std::vector<uint8_t>& bytes, const std::string& fragment, uint64_t offset) {
  try {
    File::parse(bytes);
    FAIL() << "parsed a file that should fail with '" << fragment << "'";
  } catch (const m40::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(e.offset(), offset) << e.what();
    EXPECT_NE(std::string(e.what()).find("byte offset " + std::to_string(offset)), std::string::npos);
  }
}

GgufBytes one_tensor_file(uint32_t type, std::vector<uint64_t> dims, uint64_t offset, size_t data_bytes) {
  GgufBytes b;
  b.header(3, 1, 0);
  b.tensor("t", std::move(dims), type, offset);
  b.pad().fill(data_bytes, 0x3c);
  return b;
}

std::vector<uint8_t> read_whole(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST(GgufBadInput, EmptyAndTinyFiles) {
  expect_format_error({}, "truncated while reading magic", 0);
  expect_format_error({'G', 'G'}, "truncated while reading magic", 0);
  expect_format_error({'G', 'G', 'U', 'F', 3, 0}, "truncated while reading version", 4);
}

TEST(GgufBadInput, WrongMagicAndVersion) {
  GgufBytes b;
  b.put<uint32_t>(0x46554746).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(0);
  expect_format_error(b.bytes, "not a GGUF file", 0);
  GgufBytes v1;
  v1.header(1, 0, 0);
  expect_format_error(v1.bytes, "version 1", 4);
  GgufBytes v9;
  v9.header(9, 0, 0);
  expect_format_error(v9.bytes, "unsupported GGUF version 9", 4);
}

TEST(GgufBadInput, AbsurdCountsAreRefusedBeforeAllocating) {
  GgufBytes tensors;
  tensors.header(3, ~0ull, 0);
  expect_format_error(tensors.bytes, "tensor count", 8);
  GgufBytes kvs;
  kvs.header(3, 0, 1ull << 40);
  expect_format_error(kvs.bytes, "metadata count", 16);

  GgufBytes string_len;
  string_len.header(3, 0, 1).put<uint64_t>(~0ull >> 1).fill(16, 'x');
  expect_format_error(string_len.bytes, "string length", 24);

  GgufBytes array_len;
  array_len.header(3, 0, 1).str("a").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1ull << 61);
  expect_format_error(array_len.bytes, "cannot fit", 24 + 9 + 4 + 4);
}

TEST(GgufBadInput, DeeplyNestedArraysAreRefused) {
  GgufBytes b;
  b.header(3, 0, 1).str("deep").put<uint32_t>(9);
  for (int i = 0; i < 100; ++i) b.put<uint32_t>(9).put<uint64_t>(1);
  b.put<uint32_t>(0).put<uint64_t>(0);
  try {
    File::parse(b.bytes);
    FAIL();
  } catch (const m40::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper"), std::string::npos) << e.what();
  }
}

TEST(GgufBadInput, BadMetadataValues) {
  GgufBytes type;
  type.header(3, 0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
  expect_format_error(type.bytes, "unknown value type 13", 24 + 9);
  GgufBytes boolean;
  boolean.header(3, 0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2);
  expect_format_error(boolean.bytes, "neither 0 nor 1", 24 + 9 + 4);
  GgufBytes dup;
  dup.header(3, 0, 2).str("k").put<uint32_t>(0).put<uint8_t>(1).str("k").put<uint32_t>(0).put<uint8_t>(2);
  expect_format_error(dup.bytes, "duplicate metadata key 'k'", 24 + 9 + 4 + 1);
  GgufBytes align;
  align.header(3, 0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(24);
  expect_format_error(align.bytes, "power-of-two", 24 + 8 + 17 + 4);
}

TEST(GgufBadInput, BadTensorInfos) {
  const uint64_t info = 24;  // tensor infos start right after a header with no metadata
  expect_format_error(one_tensor_file(77, {32}, 0, 64).bytes, "unknown type id 77", info + 9 + 4 + 8);
  expect_format_error(one_tensor_file(4, {32}, 0, 64).bytes, "unknown type id 4", info + 9 + 4 + 8);
  expect_format_error(one_tensor_file(12, {100}, 0, 256).bytes, "not a multiple of the Q4_K block size", info + 9);
  expect_format_error(one_tensor_file(0, {32}, 16, 256).bytes, "not a multiple of the alignment", info + 9 + 4 + 8 + 4);
  expect_format_error(one_tensor_file(0, {1ull << 62, 1ull << 62}, 0, 8).bytes, "overflows", info + 9);
  expect_format_error(one_tensor_file(0, {~0ull}, 0, 8).bytes, "too large", info + 9 + 4);
  expect_format_error(one_tensor_file(0, {}, 0, 8).bytes, "has 0 dimensions", info + 9);
  expect_format_error(one_tensor_file(0, {1, 1, 1, 1, 1}, 0, 8).bytes, "has 5 dimensions", info + 9);
  expect_format_error(one_tensor_file(0, {64}, 0, 100).bytes, "lies outside the file", info);
  expect_format_error(one_tensor_file(0, {8}, 1ull << 40, 100).bytes, "lies outside the file", info);
}

TEST(GgufBadInput, OverlappingTensorsAndDuplicateNames) {
  GgufBytes overlap;
  overlap.header(3, 2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad().fill(128, 1);
  expect_format_error(overlap.bytes, "'b' data overlaps tensor 'a'", 24 + 33);
  GgufBytes dup;
  dup.header(3, 2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad().fill(64, 1);
  expect_format_error(dup.bytes, "duplicate tensor name 'a'", 24 + 33);
}

TEST(GgufBadInput, FileEndingBeforeTheDataSection) {
  GgufBytes b;
  b.header(3, 1, 0).tensor("a", {8}, 0, 0);
  expect_format_error(b.bytes, "before the tensor data section", b.bytes.size());
}

// Every shared model, truncated at many points: a clean error each time.
TEST(GgufBadInput, TruncatedSharedModelsFailCleanly) {
  auto root = m40::test::shared_dir() / "models";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "shared models not found";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().string());
    const auto bytes = read_whole(entry.path());
    const File whole = File::parse(bytes);
    // The header and tensor table end where the data section begins (or at the
    // end of a vocabulary-only file); every cut inside them, and every cut that
    // removes tensor bytes, must fail.
    uint64_t last_tensor_end = 0;
    for (const auto& t : whole.tensors()) last_tensor_end = std::max(last_tensor_end, whole.data_offset() + t.offset + t.byte_size);
    const uint64_t table_end = whole.tensors().empty() ? bytes.size() : whole.data_offset();
    std::vector<uint64_t> cuts = {0, 3, 4, 7, 8, 16, 23, 24, 25, 100, table_end / 3, table_end / 2, table_end - 1};
    if (!whole.tensors().empty()) {
      cuts.push_back(table_end + 1);
      cuts.push_back((table_end + last_tensor_end) / 2);
      cuts.push_back(last_tensor_end - 1);
    }
    for (uint64_t cut : cuts) {
      if (cut >= bytes.size()) continue;
      std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
      EXPECT_THROW(File::parse(truncated), m40::FormatError) << "cut at " << cut;
    }
  }
}

// Random byte flips in the header and tensor table: either a clean error or a
// file that still parses; never a crash (ASan/UBSan builds check the rest).
TEST(GgufBadInput, FlippedBytesInHeaderAndTensorTableFailCleanly) {
  auto root = m40::test::shared_dir() / "models";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "shared models not found";
  std::mt19937_64 rng(42);
  int errors = 0, trials = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().string());
    const auto bytes = read_whole(entry.path());
    const File whole = File::parse(bytes);
    const uint64_t table_end = whole.tensors().empty() ? bytes.size() : whole.data_offset();
    // Always corrupt the fixed header fields, then random places in the table.
    std::vector<uint64_t> targets = {0, 4, 5, 8, 15, 16, 23, 24, 31};
    if (!whole.tensors().empty()) {
      const auto& last = whole.tensors().back();
      targets.push_back(last.info_offset + 8 + last.name.size());        // n_dims
      targets.push_back(last.info_offset + 8 + last.name.size() + 4 + 7);  // top byte of dims[0]
    }
    // Large vocabularies take milliseconds per parse: fewer flips there.
    const int flips = bytes.size() > (1u << 20) ? 30 : 150;
    for (int i = 0; i < flips; ++i) targets.push_back(rng() % table_end);
    for (uint64_t at : targets) {
      auto corrupt = bytes;
      corrupt[at] ^= static_cast<uint8_t>(1 + rng() % 255);
      ++trials;
      try {
        File f = File::parse(corrupt);
        for (const auto& t : f.tensors()) (void)f.tensor_data(t);
      } catch (const m40::FormatError&) {
        ++errors;
      }
    }
  }
  EXPECT_GT(errors, trials / 10);  // most structural flips must be caught
}

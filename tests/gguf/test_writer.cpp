// Writer round trips: write -> read -> identical metadata, tensors and bytes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "gguf/file.h"
#include "gguf/writer.h"
#include "test_paths.h"

using namespace m40::gguf;

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST(GgufWriter, RoundTripsEveryValueTypeAndTensorLayout) {
  Writer w;
  Metadata& m = w.metadata();
  m.set("u8", Value(uint8_t{250}));
  m.set("i8", Value(int8_t{-7}));
  m.set("u16", Value(uint16_t{65535}));
  m.set("i16", Value(int16_t{-1}));
  m.set("u32", Value(uint32_t{123456}));
  m.set("i32", Value(int32_t{-123456}));
  m.set("f32", Value(3.25f));
  m.set("bool", Value(false));
  m.set("str", Value("ünïcode ✓"));
  m.set("u64", Value(uint64_t{1} << 63));
  m.set("i64", Value(int64_t{-42}));
  m.set("f64", Value(1e-300));
  Array inner{ValueType::FLOAT32, {Value(1.f), Value(2.f)}};
  m.set("nested", Value(Array{ValueType::ARRAY, {Value(inner), Value(Array{ValueType::FLOAT32, {}})}}));
  m.set("strings", Value(Array{ValueType::STRING, {Value("a"), Value(""), Value("ccc")}}));

  auto q8 = random_bytes(34 * 4, 1);     // 4 Q8_0 blocks: 64 x 2
  auto q4k = random_bytes(144 * 3, 2);   // 3 Q4_K blocks: 256 x 3
  auto f16 = random_bytes(2 * 7, 3);     // an odd-sized F16 vector: padding after it
  auto f32 = random_bytes(4 * 5 * 3 * 2, 4);
  w.add_tensor("q8", TensorType::Q8_0, {64, 2}, q8);
  w.add_tensor("f16", TensorType::F16, {7}, f16);
  w.add_tensor("q4k", TensorType::Q4_K, {256, 3}, q4k);
  w.add_tensor("f32", TensorType::F32, {5, 3, 2}, f32);

  std::vector<uint8_t> bytes = w.to_bytes();
  File f = File::parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().entries(), m.entries());
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[1].name, "f16");
  EXPECT_EQ(f.tensor("f32").dims, (std::vector<uint64_t>{5, 3, 2}));
  auto same = [&](const char* name, const std::vector<uint8_t>& expected) {
    auto got = f.tensor_data(f.tensor(name));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin(), expected.end())) << name;
  };
  same("q8", q8);
  same("f16", f16);
  same("q4k", q4k);
  same("f32", f32);

  // The file written to disk is the same image, and no partial file remains.
  auto path = std::filesystem::temp_directory_path() / "m40_writer_roundtrip.gguf";
  w.write(path.string());
  EXPECT_EQ(read_whole(path.string()), bytes);
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
  std::filesystem::remove(path);
}

TEST(GgufWriter, CustomAlignmentIsRecordedAndHonoured) {
  Writer w(128);
  auto a = random_bytes(10, 5);
  w.add_tensor("a", TensorType::I8, {10}, a);
  auto b = random_bytes(3, 6);  // borrowed until to_bytes(): must outlive it
  w.add_tensor("b", TensorType::I8, {3}, b);
  auto bytes = w.to_bytes();
  File f = File::parse(bytes);
  EXPECT_EQ(f.alignment(), 128u);
  EXPECT_EQ(f.data_offset() % 128, 0u);
  EXPECT_EQ(f.tensor("b").offset, 128u);
}

TEST(GgufWriter, RefusesBadTensors) {
  Writer w;
  EXPECT_THROW(w.add_tensor("x", TensorType::Q4_K, {100}, [](std::span<uint8_t>) {}), m40::Error);
  std::vector<uint8_t> wrong(10);
  EXPECT_THROW(w.add_tensor("y", TensorType::F32, {4}, wrong), m40::Error);
  w.add_tensor("z", TensorType::F32, {4}, [](std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 1); });
  EXPECT_THROW(w.add_tensor("z", TensorType::F32, {4}, [](std::span<uint8_t>) {}), m40::Error);
  EXPECT_THROW(Writer(48), m40::Error);
}

TEST(GgufWriter, AFailedWriteLeavesNothingBehind) {
  Writer w;
  w.add_tensor("boom", TensorType::F32, {8}, [](std::span<uint8_t>) { throw m40::Error("generator failed"); });
  auto path = std::filesystem::temp_directory_path() / "m40_writer_fail.gguf";
  EXPECT_THROW(w.write(path.string()), m40::Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
  EXPECT_THROW(w.write("/nonexistent-dir/x.gguf"), m40::Error);
}

// Rewriting every shared model through the writer reproduces the file byte
// for byte: same key order, same tensor order, same padding as llama.cpp.
TEST(GgufWriter, RewritesSharedModelsByteForByte) {
  auto root = m40::test::shared_dir() / "models";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "shared models not found";
  int count = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().string());
    File original = File::open(entry.path().string());
    if (original.version() != 3) continue;
    Writer w(original.alignment());
    for (const auto& [key, value] : original.metadata().entries()) w.metadata().set(key, value);
    for (const auto& t : original.tensors()) w.add_tensor(t.name, t.type, t.dims, original.tensor_data(t));
    auto bytes = w.to_bytes();
    auto expected = read_whole(entry.path().string());
    EXPECT_EQ(bytes.size(), expected.size());
    EXPECT_TRUE(bytes == expected);
    ++count;
  }
  EXPECT_GE(count, 20);
}

// An empty tensor takes no bytes and shares its offset with the next one, as
// llama.cpp's writer lays it out; the reader must accept that.
TEST(GgufWriter, EmptyTensorsRoundTrip) {
  Writer w;
  std::vector<uint8_t> none;
  auto data = random_bytes(16, 9);
  w.add_tensor("empty", TensorType::F32, {0, 3}, none);
  w.add_tensor("after", TensorType::F32, {4}, data);
  auto bytes = w.to_bytes();
  File f = File::parse(bytes);
  EXPECT_EQ(f.tensor("empty").byte_size, 0u);
  EXPECT_EQ(f.tensor("empty").rows(), 0u);
  EXPECT_EQ(f.tensor("empty").offset, f.tensor("after").offset);
  auto got = f.tensor_data(f.tensor("after"));
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin(), data.end()));
}

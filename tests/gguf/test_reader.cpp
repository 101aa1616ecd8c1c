// Reading real files from ../shared and hand-built files of every value type.
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/file.h"
#include "gguf_bytes.h"
#include "test_paths.h"

using namespace m40::gguf;
using m40::test::GgufBytes;

TEST(GgufReader, ReadsEveryValueTypeOfAHandBuiltVersion2File) {
  GgufBytes b;
  b.header(2, 1, 15);
  b.str("u8").put<uint32_t>(0).put<uint8_t>(200);
  b.str("i8").put<uint32_t>(1).put<int8_t>(-100);
  b.str("u16").put<uint32_t>(2).put<uint16_t>(60000);
  b.str("i16").put<uint32_t>(3).put<int16_t>(-30000);
  b.str("u32").put<uint32_t>(4).put<uint32_t>(4000000000u);
  b.str("i32").put<uint32_t>(5).put<int32_t>(-2000000000);
  b.str("f32").put<uint32_t>(6).put<float>(1.5f);
  b.str("bool").put<uint32_t>(7).put<uint8_t>(1);
  b.str("str").put<uint32_t>(8).str("héllo");
  b.str("u64").put<uint32_t>(10).put<uint64_t>(1ull << 60);
  b.str("i64").put<uint32_t>(11).put<int64_t>(-(1ll << 60));
  b.str("f64").put<uint32_t>(12).put<double>(-2.25);
  b.str("arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(3).put<uint32_t>(7).put<uint32_t>(8).put<uint32_t>(9);
  b.str("strs").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("");
  // An array of arrays: [[1, 2], []] of int16.
  b.str("nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(2);
  b.put<uint32_t>(3).put<uint64_t>(2).put<int16_t>(1).put<int16_t>(2);
  b.put<uint32_t>(3).put<uint64_t>(0);
  b.tensor("w", {32, 2}, 0 /*F32*/, 0);
  b.pad();
  for (int i = 0; i < 64; ++i) b.put<float>(static_cast<float>(i) * 0.5f);

  File f = File::parse(b.bytes);
  EXPECT_EQ(f.version(), 2u);
  const Metadata& m = f.metadata();
  EXPECT_EQ(m.size(), 15u);
  EXPECT_EQ(m.get<uint8_t>("u8"), 200);
  EXPECT_EQ(m.get<int8_t>("i8"), -100);
  EXPECT_EQ(m.get<uint16_t>("u16"), 60000);
  EXPECT_EQ(m.get<int16_t>("i16"), -30000);
  EXPECT_EQ(m.get<uint32_t>("u32"), 4000000000u);
  EXPECT_EQ(m.get<int32_t>("i32"), -2000000000);
  EXPECT_EQ(m.get<float>("f32"), 1.5f);
  EXPECT_TRUE(m.get<bool>("bool"));
  EXPECT_EQ(m.get<std::string>("str"), "héllo");
  EXPECT_EQ(m.get<uint64_t>("u64"), 1ull << 60);
  EXPECT_EQ(m.get<int64_t>("i64"), -(1ll << 60));
  EXPECT_EQ(m.get<double>("f64"), -2.25);
  EXPECT_EQ(m.get_array<uint32_t>("arr"), (std::vector<uint32_t>{7, 8, 9}));
  EXPECT_EQ(m.get_array<std::string>("strs"), (std::vector<std::string>{"a", ""}));
  const Array& nested = m.get_array_value("nested");
  ASSERT_EQ(nested.element_type, ValueType::ARRAY);
  ASSERT_EQ(nested.items.size(), 2u);
  const auto& first = std::get<Array>(nested.items[0].storage);
  EXPECT_EQ(first.element_type, ValueType::INT16);
  EXPECT_EQ(first.items, (std::vector<Value>{Value(int16_t{1}), Value(int16_t{2})}));
  EXPECT_TRUE(std::get<Array>(nested.items[1].storage).items.empty());

  ASSERT_EQ(f.tensors().size(), 1u);
  const TensorInfo& w = f.tensor("w");
  EXPECT_EQ(w.dims, (std::vector<uint64_t>{32, 2}));
  EXPECT_EQ(w.type, TensorType::F32);
  EXPECT_EQ(w.element_count, 64u);
  EXPECT_EQ(w.byte_size, 256u);
  EXPECT_EQ(w.rows(), 2u);
  auto data = f.tensor_data(w);
  ASSERT_EQ(data.size(), 256u);
  float last;
  std::memcpy(&last, data.data() + 252, 4);
  EXPECT_EQ(last, 31.5f);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
  EXPECT_THROW(f.tensor("absent"), m40::Error);
}

TEST(GgufReader, HonoursGeneralAlignment) {
  GgufBytes b;
  b.header(3, 2, 1);
  b.str("general.alignment").put<uint32_t>(4).put<uint32_t>(64);
  b.tensor("a", {32}, 8 /*Q8_0*/, 0);
  b.tensor("b", {4}, 1 /*F16*/, 64);
  b.pad(64).fill(34, 0x11).fill(30, 0).fill(8, 0x22);
  File f = File::parse(b.bytes);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensor_data(f.tensor("b"))[0], 0x22);
  EXPECT_EQ(f.tensor("a").byte_size, 34u);
}

TEST(GgufReader, ReadsTheSharedTinyStoriesModel) {
  auto path = m40::test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found at " << path;
  File f = File::open(path.string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.file_size(), 749728u);
  const Metadata& m = f.metadata();
  // Values from ../shared/models/README.md.
  EXPECT_EQ(m.get<std::string>("general.architecture"), "llama");
  EXPECT_EQ(m.get<uint32_t>("llama.block_count"), 2u);
  EXPECT_EQ(m.get<uint32_t>("llama.embedding_length"), 128u);
  EXPECT_EQ(m.get<uint32_t>("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(m.get<uint32_t>("general.file_type"), 7u);
  EXPECT_EQ(m.get<std::string>("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(m.get_array_value("tokenizer.ggml.tokens").items.size(), 2048u);
  EXPECT_EQ(m.get<uint32_t>("tokenizer.ggml.bos_token_id"), 1u);
  ASSERT_EQ(f.tensors().size(), 20u);
  int q8 = 0, f32 = 0;
  for (const auto& t : f.tensors()) {
    q8 += t.type == TensorType::Q8_0;
    f32 += t.type == TensorType::F32;
    EXPECT_LE(f.data_offset() + t.offset + t.byte_size, f.file_size()) << t.name;
  }
  EXPECT_EQ(q8, 15);
  EXPECT_EQ(f32, 5);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  const TensorInfo& embd = f.tensor("token_embd.weight");
  EXPECT_EQ(embd.dims, (std::vector<uint64_t>{128, 2048}));
  EXPECT_EQ(embd.byte_size, 2048u * 4 * 34);
}

TEST(GgufReader, TrustsPerTensorTypesOverTheFileType) {
  auto path = m40::test::shared_model("TinyStories-656K-Q2_K.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  File f = File::open(path.string());
  int iq4 = 0;
  for (const auto& t : f.tensors()) iq4 += t.type == TensorType::IQ4_NL;
  EXPECT_EQ(iq4, 14);
  EXPECT_EQ(f.tensor("token_embd.weight").type, TensorType::Q8_0);
}

TEST(GgufReader, ReadsEverySharedFile) {
  auto root = m40::test::shared_dir() / "models";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "shared models not found";
  int count = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().string());
    File f = File::open(entry.path().string());
    EXPECT_TRUE(f.metadata().contains("general.architecture"));
    for (const auto& t : f.tensors()) EXPECT_EQ(f.tensor_data(t).size(), t.byte_size);
    ++count;
  }
  EXPECT_GE(count, 20);
}

TEST(GgufReader, OpeningAMissingFileNamesThePath) {
  try {
    File::open("/nonexistent/model.gguf");
    FAIL();
  } catch (const m40::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

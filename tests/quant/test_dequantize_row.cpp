// dequantize_row over whole rows: plain float types, rows of several blocks,
// the one-value accessors agreeing with the block functions bit for bit, and
// clear errors for what it cannot do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "quant/block_types.h"
#include "quant/dequantize.h"
#include "quant/random_blocks.h"

namespace m40::quant {
namespace {

using gguf::TensorType;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(DequantizeRow, F32IsACopy) {
  const std::vector<float> src = {1.5f, -0.0f, 3e-42f, 65504.0f, -7.25f};
  std::vector<float> dst(src.size(), kNaN);
  dequantize_row(TensorType::F32, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(same_bits(dst[i], src[i])) << i;
}

TEST(DequantizeRow, F16) {
  const std::vector<uint16_t> src = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000, 0x3555};
  const std::vector<float> want = {1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f, -0.0f, 0.333251953125f};
  std::vector<float> dst(src.size(), kNaN);
  dequantize_row(TensorType::F16, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(same_bits(dst[i], want[i])) << i;
}

TEST(DequantizeRow, BF16) {
  const std::vector<uint16_t> src = {0x3f80, 0xc000, 0x4049, 0x0001, 0xff80};
  const std::vector<float> want = {1.0f, -2.0f, 3.140625f, std::ldexp(1.0f, -133),
                                   -std::numeric_limits<float>::infinity()};
  std::vector<float> dst(src.size(), kNaN);
  dequantize_row(TensorType::BF16, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(same_bits(dst[i], want[i])) << i;
}

TEST(DequantizeRow, EachBlockOfARowLandsAtItsOffset) {
  // Three Q8_0 blocks with scales 1, 2 and 4 and quants j - 16.
  BlockQ8_0 blocks[3];
  const uint16_t scales[3] = {0x3c00, 0x4000, 0x4400};
  for (int b = 0; b < 3; ++b) {
    blocks[b].d = scales[b];
    for (int j = 0; j < 32; ++j) blocks[b].qs[j] = static_cast<int8_t>(j - 16);
  }
  std::vector<float> dst(96, kNaN);
  dequantize_row(TensorType::Q8_0, blocks, dst.data(), 96);
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < 32; ++j) {
      EXPECT_EQ(dst[32 * b + j], static_cast<float>((1 << b) * (j - 16))) << b << " " << j;
    }
  }
}

// For every format: a row of several random blocks, decoded by the row
// function, equals the one-value accessor at every position, bit for bit.
// This is the property the GPU kernels (one value per thread) rely on.
TEST(DequantizeRow, RowOfRandomBlocksMatchesValueAccessor) {
  for (const TensorType type : test::block_types()) {
    SCOPED_TRACE(std::string(gguf::tensor_type_name(type)));
    constexpr int64_t kBlocks = 37;
    const std::vector<uint8_t> bytes = test::random_valid_blocks(type, kBlocks, 1234);
    visit_block_type(type, [&](auto tag) {
      using Block = typename decltype(tag)::type;
      const int64_t n = kBlocks * Block::kValues;
      std::vector<float> row(static_cast<size_t>(n), kNaN);
      dequantize_row(type, bytes.data(), row.data(), n);
      const auto* blocks = reinterpret_cast<const Block*>(bytes.data());
      int mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float alone = dequantize_value(blocks[i / Block::kValues], static_cast<int>(i % Block::kValues));
        ASSERT_TRUE(std::isfinite(row[i])) << "value " << i;
        if (!same_bits(row[i], alone) && ++mismatches < 5) {
          ADD_FAILURE() << "value " << i << ": row " << row[i] << ", alone " << alone;
        }
      }
      EXPECT_EQ(mismatches, 0);
    });
  }
}

TEST(DequantizeRow, EmptyRowWritesNothing) {
  float sentinel = 42.0f;
  dequantize_row(TensorType::Q4_K, nullptr, &sentinel, 0);
  EXPECT_EQ(sentinel, 42.0f);
}

TEST(DequantizeRow, KnowsWhatItSupports) {
  for (const TensorType type : test::block_types()) EXPECT_TRUE(can_dequantize(type));
  EXPECT_TRUE(can_dequantize(TensorType::F32));
  EXPECT_TRUE(can_dequantize(TensorType::F16));
  EXPECT_TRUE(can_dequantize(TensorType::BF16));
  EXPECT_FALSE(can_dequantize(TensorType::Q8_1));
  EXPECT_FALSE(can_dequantize(TensorType::Q8_K));
  EXPECT_FALSE(can_dequantize(TensorType::IQ2_XXS));
  EXPECT_FALSE(can_dequantize(TensorType::I32));
  EXPECT_FALSE(can_dequantize(TensorType::MXFP4));
}

std::string error_of(TensorType type, int64_t n) {
  std::vector<uint8_t> src(4096);
  std::vector<float> dst(static_cast<size_t>(n));
  try {
    dequantize_row(type, src.data(), dst.data(), n);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DequantizeRow, UnsupportedTypeIsAnErrorNamingIt) {
  EXPECT_NE(error_of(TensorType::IQ2_XXS, 256).find("IQ2_XXS"), std::string::npos);
  EXPECT_NE(error_of(TensorType::Q8_1, 32).find("Q8_1"), std::string::npos);
  EXPECT_NE(error_of(TensorType::I32, 4).find("I32"), std::string::npos);
  EXPECT_NE(error_of(static_cast<TensorType>(99), 4).find("99"), std::string::npos);
}

TEST(DequantizeRow, PartialBlockIsAnError) {
  const std::string message = error_of(TensorType::Q4_K, 300);
  EXPECT_NE(message.find("Q4_K"), std::string::npos) << message;
  EXPECT_NE(message.find("256"), std::string::npos) << message;
  EXPECT_NE(error_of(TensorType::Q8_0, 33).find("Q8_0"), std::string::npos);
}

}  // namespace
}  // namespace m40::quant

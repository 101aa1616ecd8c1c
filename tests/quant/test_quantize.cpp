// quantize_row -> dequantize_row round trips on random gaussian rows of many
// blocks: bounded error per type, finite scales, and the edges (all-zero
// sub-blocks, one-signed data, very small and very large magnitudes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/tensor_type.h"
#include "quant/block_types.h"
#include "quant/dequantize.h"
#include "quant/fp16.h"
#include "quant/quantize.h"

namespace m40::quant {
namespace {

using gguf::TensorType;

std::vector<float> gaussian_row(int64_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> row(static_cast<size_t>(n));
  for (auto& x : row) {
    do x = normal(rng); while (x == 0.0f);
  }
  return row;
}

std::vector<uint8_t> quantized(TensorType type, const std::vector<float>& row) {
  const auto& traits = gguf::tensor_type_traits(type);
  const auto n = static_cast<int64_t>(row.size());
  std::vector<uint8_t> bytes(static_cast<size_t>(n / traits.block_size * traits.bytes_per_block));
  quantize_row(type, row.data(), bytes.data(), n);
  return bytes;
}

std::vector<float> round_trip(TensorType type, const std::vector<float>& row) {
  const std::vector<uint8_t> bytes = quantized(type, row);
  std::vector<float> back(row.size(), std::nanf(""));
  dequantize_row(type, bytes.data(), back.data(), static_cast<int64_t>(row.size()));
  return back;
}

struct ErrorStats {
  double relative_rms = 0;  // rms(error) / rms(x)
  double max_abs = 0;
  bool all_finite = true;
};

ErrorStats error_stats(const std::vector<float>& x, const std::vector<float>& y) {
  double error_sq = 0, x_sq = 0;
  ErrorStats stats;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(y[i])) stats.all_finite = false;
    const double e = static_cast<double>(y[i]) - x[i];
    error_sq += e * e;
    x_sq += static_cast<double>(x[i]) * x[i];
    stats.max_abs = std::max(stats.max_abs, std::fabs(e));
  }
  stats.relative_rms = std::sqrt(error_sq / x_sq);
  return stats;
}

// Every fp16 scale field of every block is finite.
void expect_finite_scales(TensorType type, const std::vector<uint8_t>& bytes) {
  visit_block_type(type, [&](auto tag) {
    using Block = typename decltype(tag)::type;
    const auto* blocks = reinterpret_cast<const Block*>(bytes.data());
    for (size_t b = 0; b < bytes.size() / sizeof(Block); ++b) {
      ASSERT_TRUE(std::isfinite(half_to_float(blocks[b].d))) << "block " << b;
      if constexpr (requires { blocks[b].dmin; }) {
        ASSERT_TRUE(std::isfinite(half_to_float(blocks[b].dmin))) << "block " << b;
      }
    }
  });
}

struct Bound {
  TensorType type;
  double relative_rms;  // measured about 0.75 of this on gaussian rows
};

// Relative rms error bounds on gaussian rows. For scale, round-to-nearest
// with a uniform quantizer of b bits over +-3 sigma gives about 3.5 / 2^b.
const Bound kBounds[] = {
    {TensorType::F16, 3e-4},  {TensorType::BF16, 2.2e-3}, {TensorType::Q8_0, 0.007},
    {TensorType::Q4_0, 0.11}, {TensorType::Q4_K, 0.10},   {TensorType::Q5_K, 0.05},
    {TensorType::Q6_K, 0.025},
};

class RoundTrip : public ::testing::TestWithParam<Bound> {};

TEST_P(RoundTrip, GaussianRowsOfManyBlocks) {
  const Bound bound = GetParam();
  for (const float sigma : {1.0f, 0.02f, 30.0f}) {
    SCOPED_TRACE("sigma " + std::to_string(sigma));
    const std::vector<float> row = gaussian_row(256 * 40, sigma, 99);
    const std::vector<uint8_t> bytes = quantized(bound.type, row);
    expect_finite_scales(bound.type, bytes);
    const ErrorStats stats = error_stats(row, round_trip(bound.type, row));
    EXPECT_TRUE(stats.all_finite);
    EXPECT_LT(stats.relative_rms, bound.relative_rms);
    EXPECT_GT(stats.relative_rms, 0.0);  // it is a lossy format, not a copy
    std::printf("  %-5s sigma %-6g relative rms error %.5f\n", std::string(gguf::tensor_type_name(bound.type)).c_str(),
                static_cast<double>(sigma), stats.relative_rms);
  }
}

TEST_P(RoundTrip, OneSignedRows) {
  const Bound bound = GetParam();
  std::vector<float> positive = gaussian_row(256 * 8, 1.0f, 5);
  for (auto& x : positive) x = std::fabs(x) + 0.5f;
  std::vector<float> negative = positive;
  for (auto& x : negative) x = -x;
  // One-signed data has less spread relative to its rms: the same bound holds easily.
  EXPECT_LT(error_stats(positive, round_trip(bound.type, positive)).relative_rms, bound.relative_rms);
  EXPECT_LT(error_stats(negative, round_trip(bound.type, negative)).relative_rms, bound.relative_rms);
}

TEST_P(RoundTrip, ZeroSubBlocksStayZero) {
  const Bound bound = GetParam();
  std::vector<float> row = gaussian_row(512, 1.0f, 11);
  std::fill(row.begin(), row.begin() + 256, 0.0f);  // one whole zero super-block
  std::fill(row.begin() + 256 + 64, row.begin() + 256 + 96, 0.0f);  // one zero sub-block
  const std::vector<float> back = round_trip(bound.type, row);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(back[i], 0.0f) << i;
  for (int i = 256 + 64; i < 256 + 96; ++i) ASSERT_EQ(back[i], 0.0f) << i;
  for (const float y : back) ASSERT_TRUE(std::isfinite(y));
}

INSTANTIATE_TEST_SUITE_P(Types, RoundTrip, ::testing::ValuesIn(kBounds),
                         [](const auto& param_info) { return std::string(gguf::tensor_type_name(param_info.param.type)); });

// Tighter, per-value bounds where the format makes them simple.
TEST(RoundTripBound, Q8_0ErrorIsAtMostHalfAStep) {
  const std::vector<float> row = gaussian_row(32 * 100, 1.0f, 3);
  const std::vector<uint8_t> bytes = quantized(TensorType::Q8_0, row);
  const std::vector<float> back = round_trip(TensorType::Q8_0, row);
  const auto* blocks = reinterpret_cast<const BlockQ8_0*>(bytes.data());
  for (size_t i = 0; i < row.size(); ++i) {
    const float step = half_to_float(blocks[i / 32].d);
    ASSERT_LE(std::fabs(back[i] - row[i]), 0.5f * step * 1.0001f) << i;
  }
}

TEST(RoundTripBound, Q4_0ErrorIsAtMostOneStep) {
  const std::vector<float> row = gaussian_row(32 * 100, 1.0f, 4);
  const std::vector<uint8_t> bytes = quantized(TensorType::Q4_0, row);
  const std::vector<float> back = round_trip(TensorType::Q4_0, row);
  const auto* blocks = reinterpret_cast<const BlockQ4_0*>(bytes.data());
  for (size_t i = 0; i < row.size(); ++i) {
    const float step = std::fabs(half_to_float(blocks[i / 32].d));
    // Half a step, except on the clamped side of the extreme value: one step.
    ASSERT_LE(std::fabs(back[i] - row[i]), step * 1.001f) << i;
  }
}

TEST(RoundTripBound, F16AndBF16RoundEachValue) {
  const std::vector<float> row = gaussian_row(1000, 3.0f, 8);
  const std::vector<float> half_back = round_trip(TensorType::F16, row);
  const std::vector<float> bf16_back = round_trip(TensorType::BF16, row);
  for (size_t i = 0; i < row.size(); ++i) {
    ASSERT_EQ(half_back[i], half_to_float(float_to_half(row[i])));
    ASSERT_EQ(bf16_back[i], bf16_to_float(float_to_bf16(row[i])));
  }
}

TEST(RoundTripBound, HugeValuesKeepFiniteScales) {
  std::vector<float> row = gaussian_row(512, 1e6f, 2);  // beyond fp16 range
  for (const TensorType type : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_K, TensorType::Q5_K,
                                TensorType::Q6_K}) {
    SCOPED_TRACE(std::string(gguf::tensor_type_name(type)));
    expect_finite_scales(type, quantized(type, row));
    for (const float y : round_trip(type, row)) ASSERT_TRUE(std::isfinite(y));
  }
}

TEST(QuantizeRow, F32IsACopy) {
  const std::vector<float> row = gaussian_row(100, 1.0f, 1);
  EXPECT_EQ(round_trip(TensorType::F32, row), row);
}

TEST(QuantizeRow, KnowsWhatItSupports) {
  for (const TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0,
                                TensorType::Q4_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    EXPECT_TRUE(can_quantize(type)) << gguf::tensor_type_name(type);
  }
  EXPECT_FALSE(can_quantize(TensorType::Q2_K));
  EXPECT_FALSE(can_quantize(TensorType::IQ4_NL));
  EXPECT_FALSE(can_quantize(TensorType::Q8_1));
}

TEST(QuantizeRow, UnsupportedTypeIsAnErrorNamingIt) {
  std::vector<float> row(256, 1.0f);
  std::vector<uint8_t> out(1024);
  try {
    quantize_row(TensorType::Q3_K, row.data(), out.data(), 256);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q3_K"), std::string::npos) << e.what();
  }
}

TEST(QuantizeRow, PartialBlockIsAnError) {
  std::vector<float> row(300, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_THROW(quantize_row(TensorType::Q6_K, row.data(), out.data(), 300), Error);
  EXPECT_THROW(quantize_row(TensorType::Q8_0, row.data(), out.data(), 40), Error);
}

}  // namespace
}  // namespace m40::quant

// quantize_row -> dequantize_row round trips on random gaussian rows of many
// blocks: bounded error per type (rms over a row, and per value against its
// block's stored step), finite scales, and the edges (all-zero sub-blocks,
// one-signed data, very small and very large magnitudes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "gguf/tensor_type.h"
#include "quant/block_types.h"
#include "quant/dequantize.h"
#include "quant/fp16.h"
#include "quant/quantize.h"
#include "quant/random_blocks.h"

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
      if constexpr (requires { blocks[b].m; }) {
        ASSERT_TRUE(std::isfinite(half_to_float(blocks[b].m))) << "block " << b;
      }
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
    {TensorType::F16, 3e-4},   {TensorType::BF16, 2.2e-3}, {TensorType::Q8_0, 0.007},
    {TensorType::Q4_0, 0.11},  {TensorType::Q4_1, 0.10},   {TensorType::Q5_0, 0.055},
    {TensorType::Q5_1, 0.05},  {TensorType::IQ4_NL, 0.105}, {TensorType::Q2_K, 0.45},
    {TensorType::Q3_K, 0.20},  {TensorType::Q4_K, 0.10},   {TensorType::Q5_K, 0.05},
    {TensorType::Q6_K, 0.025}, {TensorType::IQ4_XS, 0.105},
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

template <class Block>
const Block& block_of_value(const std::vector<uint8_t>& bytes, size_t i) {
  return reinterpret_cast<const Block*>(bytes.data())[i / Block::kValues];
}

// The largest error the quantizer may leave at value i, from its block's
// stored scales: half a step where every value lies between two levels; one
// step where the far side of a symmetric format clamps (the extreme maps to
// the lowest level, the other sign may reach one past the highest); and for
// the IQ4 levels, which reach -127 but only +113, 14 level units.
float allowed_error(TensorType type, const std::vector<uint8_t>& bytes, size_t i) {
  const int sub16 = static_cast<int>(i % 256) / 16;
  const int sub32 = static_cast<int>(i % 256) / 32;
  switch (type) {
    case TensorType::Q4_1: return 0.5f * half_to_float(block_of_value<BlockQ4_1>(bytes, i).d);
    case TensorType::Q5_1: return 0.5f * half_to_float(block_of_value<BlockQ5_1>(bytes, i).d);
    case TensorType::Q5_0: return std::fabs(half_to_float(block_of_value<BlockQ5_0>(bytes, i).d));
    case TensorType::IQ4_NL: return 14.0f * std::fabs(half_to_float(block_of_value<BlockIQ4_NL>(bytes, i).d));
    case TensorType::Q2_K: {
      const auto& b = block_of_value<BlockQ2_K>(bytes, i);
      return 0.5f * half_to_float(b.d) * static_cast<float>(b.scales[sub16] & 0xF);
    }
    case TensorType::Q3_K: {
      const auto& b = block_of_value<BlockQ3_K>(bytes, i);
      return std::fabs(half_to_float(b.d) * static_cast<float>(q3_k_scale(b.scales, sub16)));
    }
    case TensorType::IQ4_XS: {
      const auto& b = block_of_value<BlockIQ4_XS>(bytes, i);
      return 14.0f * std::fabs(half_to_float(b.d) * static_cast<float>(iq4_xs_scale(b, sub32)));
    }
    default: throw Error("no per-value bound for " + std::string(gguf::tensor_type_name(type)));
  }
}

class PerValueBound : public ::testing::TestWithParam<TensorType> {};

TEST_P(PerValueBound, EveryValueIsWithinItsBlocksStep) {
  const TensorType type = GetParam();
  std::vector<float> shifted = gaussian_row(256 * 20, 1.0f, 21);
  for (auto& x : shifted) x = std::fabs(x) + 3.0f;  // far from zero: offsets matter
  for (const auto& [what, row] : std::vector<std::pair<std::string, std::vector<float>>>{
           {"sigma 1", gaussian_row(256 * 20, 1.0f, 6)},
           {"sigma 0.02", gaussian_row(256 * 20, 0.02f, 7)},
           {"shifted", shifted}}) {
    SCOPED_TRACE(what);
    const std::vector<uint8_t> bytes = quantized(type, row);
    const std::vector<float> back = round_trip(type, row);
    for (size_t i = 0; i < row.size(); ++i) {
      const float allowed = allowed_error(type, bytes, i);
      ASSERT_GT(allowed, 0.0f) << i;  // no sub-block of nonzero values has a zero step
      ASSERT_LE(std::fabs(back[i] - row[i]), allowed * 1.001f + 1e-6f * std::fabs(row[i])) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, PerValueBound,
                         ::testing::Values(TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::IQ4_NL,
                                           TensorType::Q2_K, TensorType::Q3_K, TensorType::IQ4_XS),
                         [](const auto& param_info) { return std::string(gguf::tensor_type_name(param_info.param)); });

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
  for (const TensorType type : test::block_types()) {
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
  for (const TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    EXPECT_TRUE(can_quantize(type)) << gguf::tensor_type_name(type);
  }
  for (const TensorType type : test::block_types()) EXPECT_TRUE(can_quantize(type)) << gguf::tensor_type_name(type);
  EXPECT_FALSE(can_quantize(TensorType::Q8_1));
  EXPECT_FALSE(can_quantize(TensorType::Q8_K));
  EXPECT_FALSE(can_quantize(TensorType::IQ2_XXS));
}

TEST(QuantizeRow, UnsupportedTypeIsAnErrorNamingIt) {
  std::vector<float> row(256, 1.0f);
  std::vector<uint8_t> out(1024);
  try {
    quantize_row(TensorType::IQ2_XXS, row.data(), out.data(), 256);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
  }
}

TEST(QuantizeRow, PartialBlockIsAnError) {
  std::vector<float> row(300, 1.0f);
  std::vector<uint8_t> out(1024);
  for (const TensorType type : test::block_types()) {
    SCOPED_TRACE(std::string(gguf::tensor_type_name(type)));
    const auto block_size = static_cast<int64_t>(gguf::tensor_type_traits(type).block_size);
    EXPECT_THROW(quantize_row(type, row.data(), out.data(), block_size + 16), Error);
    EXPECT_THROW(quantize_row(type, row.data(), out.data(), 8), Error);
  }
}

}  // namespace
}  // namespace m40::quant

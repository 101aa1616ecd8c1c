// fp16 and bf16 conversions: exact widening, round-to-nearest-even narrowing,
// and the edges (zeros, subnormals, overflow, inf, NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "quant/fp16.h"

namespace m40::quant {
namespace {

// What a half means, straight from IEEE 754 binary16.
double half_meaning(uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign != 0 ? -magnitude : magnitude;
}

bool is_half_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

TEST(HalfToFloat, KnownValues) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(half_to_float(0x8001), -std::ldexp(1.0f, -24));
}

TEST(HalfToFloat, SignedZeros) {
  EXPECT_EQ(half_to_float(0x0000), 0.0f);
  EXPECT_FALSE(std::signbit(half_to_float(0x0000)));
  EXPECT_EQ(half_to_float(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
}

TEST(HalfToFloat, InfinityAndNaN) {
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(half_to_float(0xffff)));
}

TEST(HalfToFloat, EveryHalfMeansWhatIEEESays) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float got = half_to_float(half);
    const double want = half_meaning(half);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << std::hex << h;
      EXPECT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    }
  }
}

TEST(FloatToHalf, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto half = static_cast<uint16_t>(h);
    if (is_half_nan(half)) {
      EXPECT_TRUE(is_half_nan(float_to_half(half_to_float(half)))) << std::hex << h;
    } else {
      EXPECT_EQ(float_to_half(half_to_float(half)), half) << std::hex << h;
    }
  }
}

TEST(FloatToHalf, TiesGoToEven) {
  const float ulp_at_one = std::ldexp(1.0f, -10);
  EXPECT_EQ(float_to_half(1.0f + ulp_at_one / 2), 0x3c00);          // tie, 1.0 is even
  EXPECT_EQ(float_to_half(1.0f + 3 * ulp_at_one / 2), 0x3c02);      // tie, up to even
  EXPECT_EQ(float_to_half(1.0f + ulp_at_one / 2 + std::ldexp(1.0f, -20)), 0x3c01);  // above the tie
  EXPECT_EQ(float_to_half(1.0f + ulp_at_one / 2 - std::ldexp(1.0f, -20)), 0x3c00);  // below the tie
}

TEST(FloatToHalf, OverflowToInfinity) {
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);  // just below the tie with 65536
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);    // tie rounds to even: infinity
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(FloatToHalf, NaNStaysNaN) {
  EXPECT_TRUE(is_half_nan(float_to_half(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_half_nan(float_to_half(-std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload lies only in the low 13 bits must not become infinity.
  uint32_t low_payload_nan = 0x7f800001u;
  float value;
  std::memcpy(&value, &low_payload_nan, sizeof value);
  EXPECT_TRUE(is_half_nan(float_to_half(value)));
}

TEST(FloatToHalf, SubnormalsAndUnderflow) {
  const float unit = std::ldexp(1.0f, -24);  // smallest half subnormal
  EXPECT_EQ(float_to_half(unit), 0x0001);
  EXPECT_EQ(float_to_half(unit / 2), 0x0000);                      // tie with zero: even
  EXPECT_EQ(float_to_half(unit / 2 * 1.0000001f), 0x0001);         // just above the tie
  EXPECT_EQ(float_to_half(-unit / 2), 0x8000);
  EXPECT_EQ(float_to_half(3 * unit / 2), 0x0002);                  // tie between 1 and 2: even
  EXPECT_EQ(float_to_half(5 * unit / 2), 0x0002);                  // tie between 2 and 3: even
  EXPECT_EQ(float_to_half(std::ldexp(1023.5f, -24)), 0x0400);      // rounds up into the normals
  EXPECT_EQ(float_to_half(1e-30f), 0x0000);
  EXPECT_EQ(float_to_half(-1e-30f), 0x8000);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
}

// Random floats over the whole half range against a search over the ordered
// non-negative halves: the nearest one, ties to the even bit pattern.
TEST(FloatToHalf, RandomFloatsRoundToTheNearestHalf) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> exponent(-26, 16);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int trial = 0; trial < 200000; ++trial) {
    const float x = std::ldexp(mantissa(rng), exponent(rng));
    if (x >= 65520.0f) continue;
    uint16_t low = 0;  // largest half <= x
    uint16_t high = 0x7bff;
    while (low < high) {
      const auto mid = static_cast<uint16_t>((low + high + 1) / 2);
      if (half_to_float(mid) <= x) low = mid; else high = static_cast<uint16_t>(mid - 1);
    }
    uint16_t want = low;
    if (half_to_float(low) != x) {
      const double below = x - static_cast<double>(half_to_float(low));
      const double above = static_cast<double>(half_meaning(static_cast<uint16_t>(low + 1))) - x;
      if (above < below || (above == below && (low & 1) != 0)) want = static_cast<uint16_t>(low + 1);
    }
    ASSERT_EQ(float_to_half(x), want) << x;
    ASSERT_EQ(float_to_half(-x), want | 0x8000) << -x;
  }
}

TEST(Bf16, WidensByShifting) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
}

TEST(Bf16, NarrowsToNearestEven) {
  const float ulp_at_one = std::ldexp(1.0f, -7);
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + ulp_at_one / 2), 0x3f80);      // tie, 1.0 is even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * ulp_at_one / 2), 0x3f82);  // tie, up to even
  EXPECT_EQ(float_to_bf16(1.0f + ulp_at_one / 2 + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  const uint16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  uint32_t low_payload_nan = 0x7f800001u;  // payload only in the dropped bits
  float value;
  std::memcpy(&value, &low_payload_nan, sizeof value);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(value))));
}

TEST(Bf16, EveryBf16RoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bf16 = static_cast<uint16_t>(b);
    const float value = bf16_to_float(bf16);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(value))));
    } else {
      EXPECT_EQ(float_to_bf16(value), bf16) << std::hex << b;
    }
  }
}

}  // namespace
}  // namespace m40::quant

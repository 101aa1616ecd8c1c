// Each block format on a hand-built block. The expected values are worked out
// here from the format's definition (bit positions, scale packing, formula),
// independently of blocks.h; scales are powers of two, so every expected value
// is exact and the comparison is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "quant/blocks.h"
#include "quant/dequantize.h"

namespace m40::quant {
namespace {

constexpr uint16_t kHalfQuarter = 0x3400;  // 0.25
constexpr uint16_t kHalfHalf = 0x3800;     // 0.5
constexpr uint16_t kHalfOne = 0x3c00;      // 1.0
constexpr uint16_t kHalfTwo = 0x4000;      // 2.0
constexpr uint16_t kHalfMinusOne = 0xbc00; // -1.0

// Deterministic bytes with every bit pattern mixed in.
uint8_t pattern(int k) { return static_cast<uint8_t>(k * 37 + 11); }

// The 4-bit field of value i in a 32-value group stored low nibbles first.
int nibble(const uint8_t* qs, int i) { return i < 16 ? qs[i] % 16 : qs[i - 16] / 16; }

// Checks the whole-row path and the one-value accessor against `expected`.
template <class Block>
void expect_values(const Block& block, const std::vector<float>& expected) {
  ASSERT_EQ(static_cast<int>(expected.size()), Block::kValues);
  std::vector<float> row(Block::kValues, std::numeric_limits<float>::quiet_NaN());
  dequantize_row(Block::kType, &block, row.data(), Block::kValues);
  for (int i = 0; i < Block::kValues; ++i) {
    EXPECT_EQ(row[i], expected[i]) << "value " << i;
    EXPECT_EQ(dequantize_value(block, i), expected[i]) << "value " << i << " alone";
  }
}

TEST(DequantizeBlock, Q4_0) {
  BlockQ4_0 b{};
  b.d = kHalfTwo;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = 2.0f * static_cast<float>(j - 8);
    want[j + 16] = 2.0f * static_cast<float>(7 - j);
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q4_1) {
  BlockQ4_1 b{};
  b.d = kHalfHalf;
  b.m = kHalfMinusOne;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((15 - j) | (j << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = 0.5f * static_cast<float>(15 - j) - 1.0f;
    want[j + 16] = 0.5f * static_cast<float>(j) - 1.0f;
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q5_0) {
  BlockQ5_0 b{};
  b.d = kHalfOne;
  const uint8_t high[4] = {0x0f, 0xf0, 0x33, 0xcc};
  for (int k = 0; k < 4; ++k) b.qh[k] = high[k];
  for (int j = 0; j < 16; ++j) b.qs[j] = pattern(j);
  std::vector<float> want(32);
  for (int i = 0; i < 32; ++i) {
    const int fifth = (high[i / 8] >> (i % 8)) & 1;  // bit i of the little-endian word
    want[i] = static_cast<float>(nibble(b.qs, i) + 16 * fifth - 16);
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q5_1) {
  BlockQ5_1 b{};
  b.d = kHalfQuarter;
  b.m = kHalfTwo;
  const uint8_t high[4] = {0xa5, 0x5a, 0x01, 0x80};
  for (int k = 0; k < 4; ++k) b.qh[k] = high[k];
  for (int j = 0; j < 16; ++j) b.qs[j] = pattern(j + 3);
  std::vector<float> want(32);
  for (int i = 0; i < 32; ++i) {
    const int fifth = (high[i / 8] >> (i % 8)) & 1;
    want[i] = 0.25f * static_cast<float>(nibble(b.qs, i) + 16 * fifth) + 2.0f;
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q8_0) {
  BlockQ8_0 b{};
  b.d = kHalfQuarter;
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  std::vector<float> want(32);
  for (int j = 0; j < 32; ++j) want[j] = 0.25f * static_cast<float>(j * 8 - 128);
  expect_values(b, want);
}

const int kIQ4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

TEST(DequantizeBlock, IQ4_NL) {
  BlockIQ4_NL b{};
  b.d = kHalfTwo;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = 2.0f * static_cast<float>(kIQ4Levels[j]);
    want[j + 16] = 2.0f * static_cast<float>(kIQ4Levels[15 - j]);
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q2_K) {
  BlockQ2_K b{};
  b.d = kHalfHalf;
  b.dmin = kHalfQuarter;
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<uint8_t>(s | ((15 - s) << 4));
  for (int k = 0; k < 64; ++k) b.qs[k] = pattern(k);
  std::vector<float> want(256);
  // Value 128n + 32j + l is bits 2j, 2j+1 of qs[32n + l]; 16-value sub-blocks.
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int i = 128 * n + 32 * j + l;
        const int q = (b.qs[32 * n + l] >> (2 * j)) & 3;
        const int scale = b.scales[i / 16] % 16;
        const int offset = b.scales[i / 16] / 16;
        want[i] = 0.5f * static_cast<float>(scale * q) - 0.25f * static_cast<float>(offset);
      }
    }
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q3_K) {
  BlockQ3_K b{};
  b.d = kHalfHalf;
  int scale[16];
  for (int s = 0; s < 16; ++s) scale[s] = 4 * s - 32 + s % 3;  // -32 .. 31
  // Pack the 6-bit values scale + 32: low nibbles in bytes 0..7 (sub-blocks
  // 8..15 in the high nibbles), the top two bits in bytes 8..11.
  for (int s = 0; s < 16; ++s) {
    const int stored = scale[s] + 32;
    if (s < 8) {
      b.scales[s] = static_cast<uint8_t>(b.scales[s] | (stored & 15));
    } else {
      b.scales[s - 8] = static_cast<uint8_t>(b.scales[s - 8] | ((stored & 15) << 4));
    }
    b.scales[8 + s % 4] = static_cast<uint8_t>(b.scales[8 + s % 4] | ((stored >> 4) << (2 * (s / 4))));
  }
  for (int k = 0; k < 64; ++k) b.qs[k] = pattern(k);
  for (int k = 0; k < 32; ++k) b.hmask[k] = pattern(k + 100);
  std::vector<float> want(256);
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int i = 128 * n + 32 * j + l;
        const int low = (b.qs[32 * n + l] >> (2 * j)) & 3;
        const bool high_bit = ((b.hmask[l] >> (4 * n + j)) & 1) != 0;
        const int q = high_bit ? low : low - 4;
        want[i] = 0.5f * static_cast<float>(scale[i / 16] * q);
      }
    }
  }
  expect_values(b, want);
}

// The 12 scale bytes of Q4_K and Q5_K for eight 6-bit scales and offsets.
void pack_scales_and_mins(const int* scale, const int* min, uint8_t* out) {
  for (int s = 0; s < 12; ++s) out[s] = 0;
  for (int s = 0; s < 4; ++s) {
    out[s] = static_cast<uint8_t>(scale[s]);
    out[s + 4] = static_cast<uint8_t>(min[s]);
  }
  for (int s = 4; s < 8; ++s) {
    out[s + 4] = static_cast<uint8_t>((scale[s] & 15) | ((min[s] & 15) << 4));
    out[s - 4] = static_cast<uint8_t>(out[s - 4] | ((scale[s] >> 4) << 6));
    out[s] = static_cast<uint8_t>(out[s] | ((min[s] >> 4) << 6));
  }
}

const int kSubScales[8] = {1, 63, 17, 40, 33, 62, 5, 48};
const int kSubMins[8] = {0, 7, 63, 21, 50, 16, 61, 34};

TEST(DequantizeBlock, Q4_K) {
  BlockQ4_K b{};
  b.d = kHalfHalf;
  b.dmin = kHalfQuarter;
  pack_scales_and_mins(kSubScales, kSubMins, b.scales);
  for (int k = 0; k < 128; ++k) b.qs[k] = pattern(k);
  std::vector<float> want(256);
  // Value 64c + l: low nibble of qs[32c + l] for l < 32, else high nibble of qs[32c + l - 32].
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 64; ++l) {
      const int i = 64 * c + l;
      const int q = l < 32 ? b.qs[32 * c + l] % 16 : b.qs[32 * c + l - 32] / 16;
      const int s = i / 32;
      want[i] = 0.5f * static_cast<float>(kSubScales[s] * q) - 0.25f * static_cast<float>(kSubMins[s]);
    }
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q5_K) {
  BlockQ5_K b{};
  b.d = kHalfQuarter;
  b.dmin = kHalfHalf;
  pack_scales_and_mins(kSubScales, kSubMins, b.scales);
  for (int k = 0; k < 128; ++k) b.qs[k] = pattern(k + 7);
  for (int k = 0; k < 32; ++k) b.qh[k] = pattern(k + 200);
  std::vector<float> want(256);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 64; ++l) {
      const int i = 64 * c + l;
      const int s = i / 32;
      const int low = l < 32 ? b.qs[32 * c + l] % 16 : b.qs[32 * c + l - 32] / 16;
      const int fifth = (b.qh[i % 32] >> s) & 1;
      want[i] = 0.25f * static_cast<float>(kSubScales[s] * (low + 16 * fifth)) -
                0.5f * static_cast<float>(kSubMins[s]);
    }
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, Q6_K) {
  BlockQ6_K b{};
  b.d = kHalfQuarter;
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s * 17 - 128);  // -128 .. 127
  for (int k = 0; k < 128; ++k) b.ql[k] = pattern(k);
  for (int k = 0; k < 64; ++k) b.qh[k] = pattern(k + 128);
  std::vector<float> want(256);
  // Value 128n + 32g + l: low 4 bits from ql[64n + l + 32 (g odd)], the low
  // nibble for g < 2 and the high one otherwise; top 2 bits at 2g of qh[32n + l].
  for (int n = 0; n < 2; ++n) {
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int i = 128 * n + 32 * g + l;
        const uint8_t low_byte = b.ql[64 * n + l + (g % 2 == 1 ? 32 : 0)];
        const int low = g < 2 ? low_byte % 16 : low_byte / 16;
        const int high = (b.qh[32 * n + l] >> (2 * g)) & 3;
        const int q = low + 16 * high - 32;
        want[i] = 0.25f * static_cast<float>(b.scales[i / 16] * q);
      }
    }
  }
  expect_values(b, want);
}

TEST(DequantizeBlock, IQ4_XS) {
  BlockIQ4_XS b{};
  b.d = kHalfHalf;
  const int stored_scale[8] = {0, 63, 31, 32, 7, 56, 19, 44};  // scale = stored - 32
  b.scales_h = 0;
  for (int s = 0; s < 8; ++s) {
    b.scales_l[s / 2] = static_cast<uint8_t>(b.scales_l[s / 2] | ((stored_scale[s] & 15) << (4 * (s % 2))));
    b.scales_h = static_cast<uint16_t>(b.scales_h | ((stored_scale[s] >> 4) << (2 * s)));
  }
  for (int k = 0; k < 128; ++k) b.qs[k] = pattern(k + 1);
  std::vector<float> want(256);
  for (int s = 0; s < 8; ++s) {
    for (int j = 0; j < 32; ++j) {
      const int level = kIQ4Levels[nibble(b.qs + 16 * s, j)];
      want[32 * s + j] = 0.5f * static_cast<float>((stored_scale[s] - 32) * level);
    }
  }
  expect_values(b, want);
}

// A scale whose fp16 is subnormal still dequantizes exactly.
TEST(DequantizeBlock, SubnormalScale) {
  BlockQ8_0 b{};
  b.d = 0x0001;  // 2^-24
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j - 16);
  std::vector<float> want(32);
  for (int j = 0; j < 32; ++j) want[j] = std::ldexp(static_cast<float>(j - 16), -24);
  expect_values(b, want);
}

}  // namespace
}  // namespace m40::quant

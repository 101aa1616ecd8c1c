// Inside m40_quant: one block of each format of blocks.h from 32 or 256
// floats, and the rounding helpers the per-family files share. quantize_row
// (quantize.cpp) is the public entry; quantize_block32.cpp holds the formats of
// 32 values, quantize_k.cpp the 256-value super-block formats.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::quant::detail {

// round_to_int, reciprocal_or_zero and finite_half live in blocks.h: the
// Q8_0 quantizer there runs on the host and the device alike (the KV cache).

inline int clamp_int(int value, int low, int high) { return std::min(std::max(value, low), high); }

// The smallest integer >= x, clamped to low..high.
inline int ceil_clamped(float x, int low, int high) {
  return static_cast<int>(std::ceil(std::clamp(x, static_cast<float>(low), static_cast<float>(high))));
}

// The fp16 bits of a scale rounded away from zero: |half| >= |scale| (up to
// the largest half), so that a step stored as fp16 still spans the values it
// was computed from.
inline uint16_t covering_half(float scale) {
  const uint16_t half = finite_half(scale);
  if ((half & 0x7fffu) < 0x7bffu && std::fabs(half_to_float(half)) < std::fabs(scale)) {
    return static_cast<uint16_t>(half + 1);  // one unit further from zero, either sign
  }
  return half;
}

// The fp16 bits of the largest half <= value (down to the lowest half), so that
// an offset stored as fp16 stays at or below the block minimum.
inline uint16_t half_at_most(float value) {
  const uint16_t half = finite_half(value);
  if (half_to_float(half) <= value) return half;
  if ((half & 0x7fffu) == 0) return 0x8001u;  // below zero: the smallest negative half
  if ((half & 0x8000u) == 0) return static_cast<uint16_t>(half - 1);
  return (half & 0x7fffu) < 0x7bffu ? static_cast<uint16_t>(half + 1) : half;
}

// The value of largest magnitude, with its sign (the positive one on ties).
inline float signed_extreme(const float* x, int n) {
  float low = x[0];
  float high = x[0];
  for (int j = 1; j < n; ++j) {
    low = std::min(low, x[j]);
    high = std::max(high, x[j]);
  }
  return -low > high ? low : high;
}

// Halfway points between neighbouring IQ4 levels.
inline constexpr std::array<float, 15> kIQ4Midpoints = [] {
  std::array<float, 15> midpoints{};
  for (int k = 0; k < 15; ++k) {
    midpoints[k] = 0.5f * static_cast<float>(kIQ4NonLinearLevels[k] + kIQ4NonLinearLevels[k + 1]);
  }
  return midpoints;
}();

// The index of the IQ4 level nearest t (t in level units): the number of
// midpoints below it, without branches.
inline int nearest_iq4_index(float t) {
  int index = 0;
  for (const float midpoint : kIQ4Midpoints) index += t > midpoint ? 1 : 0;
  return index;
}

// 32 quants of 4 bits (or the low 4 bits of wider ones) as Q4_0 stores them:
// value j in the low nibble of qs[j], value j + 16 in the high nibble.
inline void pack_nibbles_of_32(const uint8_t* quants, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((quants[j] & 0xF) | ((quants[j + 16] & 0xF) << 4));
}

void quantize_block(const float* x, BlockQ4_0& b);
void quantize_block(const float* x, BlockQ4_1& b);
void quantize_block(const float* x, BlockQ5_0& b);
void quantize_block(const float* x, BlockQ5_1& b);
void quantize_block(const float* x, BlockQ8_0& b);
void quantize_block(const float* x, BlockIQ4_NL& b);
void quantize_block(const float* x, BlockQ2_K& b);
void quantize_block(const float* x, BlockQ3_K& b);
void quantize_block(const float* x, BlockQ4_K& b);
void quantize_block(const float* x, BlockQ5_K& b);
void quantize_block(const float* x, BlockQ6_K& b);
void quantize_block(const float* x, BlockIQ4_XS& b);

}  // namespace m40::quant::detail

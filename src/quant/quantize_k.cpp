// The 256-value super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS.
// An fp16 super-scale (and super-offset) per block and small integer scales
// per sub-block; every quant is computed against the stored scales, since
// that is what dequantizes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/quantize_block.h"

namespace m40::quant::detail {

namespace {

// --- Signed sub-block scales (Q3_K, IQ4_XS): x ~= d * scale * level.

// Per sub-block the step that maps its extreme value to -outer_level; then a
// super-scale d and 6-bit scales (|scale| <= 31) with |d * scale| at least
// that step, so that no value of a sub-block lies beyond its outer levels.
template <int kSubBlocks, int kSubSize>
void fit_signed_sub_scales(const float* M40_RESTRICT x, float outer_level, uint16_t& d_bits, int* scales) {
  float wanted[kSubBlocks];
  float max_magnitude = 0.0f;
  for (int s = 0; s < kSubBlocks; ++s) {
    wanted[s] = signed_extreme(x + kSubSize * s, kSubSize) / -outer_level;
    max_magnitude = std::max(max_magnitude, std::fabs(wanted[s]));
  }
  d_bits = covering_half(max_magnitude / 31.0f);
  const float inverse_d = reciprocal_or_zero(half_to_float(d_bits));
  for (int s = 0; s < kSubBlocks; ++s) {
    const int magnitude = ceil_clamped(std::fabs(wanted[s]) * inverse_d, 0, 31);
    scales[s] = wanted[s] < 0.0f ? -magnitude : magnitude;
  }
}

// --- Q4_K and Q5_K: 8 sub-blocks of 32 with a 6-bit scale and 6-bit offset.

void pack_k_quant_scales(const int* scale, const int* min, uint8_t* packed) {
  for (int s = 0; s < 4; ++s) {
    packed[s] = static_cast<uint8_t>(scale[s] | ((scale[s + 4] >> 4) << 6));
    packed[s + 4] = static_cast<uint8_t>(min[s] | ((min[s + 4] >> 4) << 6));
    packed[s + 8] = static_cast<uint8_t>((scale[s + 4] & 0xF) | ((min[s + 4] & 0xF) << 4));
  }
}

// Fills d, dmin, scales of a Q4_K/Q5_K block and its 256 unsigned quants in
// 0..max_quant, so that x ~= d * scale * q - dmin * offset per sub-block.
template <class Block>
void quantize_scaled_sub_blocks(const float* M40_RESTRICT x, int max_quant, Block& b, uint8_t* quants) {
  float range_step[8];  // step that spans the sub-block from its offset to its max
  float offset[8];      // >= 0: the sub-block's minimum is -offset (or 0)
  for (int s = 0; s < 8; ++s) {
    float low = 0.0f;  // the offset is subtracted, so the range always covers 0
    float high = x[32 * s];
    for (int l = 0; l < 32; ++l) {
      low = std::min(low, x[32 * s + l]);
      high = std::max(high, x[32 * s + l]);
    }
    range_step[s] = (high - low) / static_cast<float>(max_quant);
    offset[s] = -low;
  }
  const float max_step = *std::max_element(range_step, range_step + 8);
  const float max_offset = *std::max_element(offset, offset + 8);
  b.d = finite_half(max_step / 63.0f);
  b.dmin = finite_half(max_offset / 63.0f);
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);

  int scale[8];
  int min[8];
  for (int s = 0; s < 8; ++s) {
    scale[s] = clamp_int(round_to_int(range_step[s] * reciprocal_or_zero(d)), 0, 63);
    min[s] = clamp_int(round_to_int(offset[s] * reciprocal_or_zero(dmin)), 0, 63);
  }
  pack_k_quant_scales(scale, min, b.scales);

  for (int s = 0; s < 8; ++s) {
    // The same float products that dequantization forms.
    const float step = d * static_cast<float>(scale[s]);
    const float sub_offset = dmin * static_cast<float>(min[s]);
    const float inverse = reciprocal_or_zero(step);
    for (int l = 0; l < 32; ++l) {
      quants[32 * s + l] =
          static_cast<uint8_t>(clamp_int(round_to_int((x[32 * s + l] + sub_offset) * inverse), 0, max_quant));
    }
  }
}

}  // namespace

// --- Q2_K: 16 sub-blocks of 16, 4-bit scale and 4-bit offset, quants 0..3.
// The offsets are rounded up (so each covers its sub-block's minimum), then
// the steps up to span from that offset to the maximum: every value lies
// within half a step of a level.
void quantize_block(const float* M40_RESTRICT x, BlockQ2_K& b) {
  float offset[16];  // >= 0: the sub-block's minimum is -offset (or 0)
  float high[16];
  for (int s = 0; s < 16; ++s) {
    float low = 0.0f;
    high[s] = x[16 * s];
    for (int l = 0; l < 16; ++l) {
      low = std::min(low, x[16 * s + l]);
      high[s] = std::max(high[s], x[16 * s + l]);
    }
    offset[s] = -low;
  }
  b.dmin = covering_half(*std::max_element(offset, offset + 16) / 15.0f);
  const float dmin = half_to_float(b.dmin);
  int min[16];
  float sub_offset[16];  // the offset as dequantization forms it
  float wanted_step[16];
  for (int s = 0; s < 16; ++s) {
    min[s] = ceil_clamped(offset[s] * reciprocal_or_zero(dmin), 0, 15);
    sub_offset[s] = mul_unfused(dmin, to_float(min[s]));
    wanted_step[s] = (high[s] + sub_offset[s]) / 3.0f;
  }
  b.d = covering_half(*std::max_element(wanted_step, wanted_step + 16) / 15.0f);
  const float d = half_to_float(b.d);

  uint8_t quants[256];
  for (int s = 0; s < 16; ++s) {
    const int scale = ceil_clamped(wanted_step[s] * reciprocal_or_zero(d), 0, 15);
    b.scales[s] = static_cast<uint8_t>(scale | (min[s] << 4));
    const float inverse = reciprocal_or_zero(d * to_float(scale));
    for (int l = 0; l < 16; ++l) {
      const int q = round_to_int((x[16 * s + l] + sub_offset[s]) * inverse);
      quants[16 * s + l] = static_cast<uint8_t>(clamp_int(q, 0, 3));
    }
  }
  // Value i = 128n + 32j + l sits at bits 2j of qs[32n + l].
  std::memset(b.qs, 0, sizeof b.qs);
  for (int i = 0; i < 256; ++i) {
    b.qs[32 * (i >> 7) + (i & 31)] |= static_cast<uint8_t>(quants[i] << (2 * ((i >> 5) & 3)));
  }
}

// --- Q3_K: 16 sub-blocks of 16 with signed 6-bit scales, quants -4..3. The
// extreme value maps to -4; the other sign reaches +4 and clamps to 3.
void quantize_block(const float* M40_RESTRICT x, BlockQ3_K& b) {
  int scales[16];
  fit_signed_sub_scales<16, 16>(x, 4.0f, b.d, scales);
  const float d = half_to_float(b.d);

  std::memset(b.scales, 0, sizeof b.scales);
  std::memset(b.qs, 0, sizeof b.qs);
  std::memset(b.hmask, 0, sizeof b.hmask);
  for (int s = 0; s < 16; ++s) {
    const int stored = scales[s] + 32;  // q3_k_scale's packing: low nibble, then top 2 bits
    b.scales[s & 7] |= static_cast<uint8_t>((stored & 0xF) << (4 * (s >> 3)));
    b.scales[8 + (s & 3)] |= static_cast<uint8_t>((stored >> 4) << (2 * (s >> 2)));
    const float inverse = reciprocal_or_zero(d * to_float(scales[s]));
    for (int l = 0; l < 16; ++l) {
      const int i = 16 * s + l;
      // q + 4 in 0..7: its low 2 bits, and a high bit that is set for q >= 0.
      const int biased = clamp_int(round_to_int(x[i] * inverse), -4, 3) + 4;
      const int half = i >> 7;
      const int pair = (i >> 5) & 3;
      b.qs[32 * half + (i & 31)] |= static_cast<uint8_t>((biased & 3) << (2 * pair));
      b.hmask[i & 31] |= static_cast<uint8_t>((biased >> 2) << (4 * half + pair));
    }
  }
}

void quantize_block(const float* M40_RESTRICT x, BlockQ4_K& b) {
  uint8_t quants[256];
  quantize_scaled_sub_blocks(x, 15, b, quants);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      b.qs[32 * c + l] = static_cast<uint8_t>(quants[64 * c + l] | (quants[64 * c + 32 + l] << 4));
    }
  }
}

void quantize_block(const float* M40_RESTRICT x, BlockQ5_K& b) {
  uint8_t quants[256];
  quantize_scaled_sub_blocks(x, 31, b, quants);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int first = quants[64 * c + l];
      const int second = quants[64 * c + 32 + l];
      b.qs[32 * c + l] = static_cast<uint8_t>((first & 0xF) | ((second & 0xF) << 4));
      b.qh[l] = static_cast<uint8_t>(b.qh[l] | ((first >> 4) << (2 * c)) | ((second >> 4) << (2 * c + 1)));
    }
  }
}

// --- Q6_K: 16 sub-blocks of 16 with signed 8-bit scales, quants -32..31.
void quantize_block(const float* M40_RESTRICT x, BlockQ6_K& b) {
  // Per sub-block, the step that maps its extreme value to -32 (as Q4_0 does).
  float sub_step[16];
  float max_step = 0.0f;
  for (int s = 0; s < 16; ++s) {
    sub_step[s] = signed_extreme(x + 16 * s, 16) / -32.0f;
    max_step = std::max(max_step, std::fabs(sub_step[s]));
  }
  b.d = finite_half(max_step / 127.0f);
  const float d = half_to_float(b.d);

  uint8_t quants[256];  // stored +32
  for (int s = 0; s < 16; ++s) {
    const int scale = clamp_int(round_to_int(sub_step[s] * reciprocal_or_zero(d)), -128, 127);
    b.scales[s] = static_cast<int8_t>(scale);
    const float inverse = reciprocal_or_zero(d * static_cast<float>(scale));
    for (int l = 0; l < 16; ++l) {
      quants[16 * s + l] = static_cast<uint8_t>(clamp_int(round_to_int(x[16 * s + l] * inverse), -32, 31) + 32);
    }
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = quants + 128 * half;
    for (int l = 0; l < 32; ++l) {
      b.ql[64 * half + l] = static_cast<uint8_t>((q[l] & 0xF) | ((q[l + 64] & 0xF) << 4));
      b.ql[64 * half + l + 32] = static_cast<uint8_t>((q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4));
      b.qh[32 * half + l] = static_cast<uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) |
                                                 ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
    }
  }
}

// --- IQ4_XS: IQ4_NL's levels with a signed 6-bit scale per sub-block of 32;
// each sub-block's extreme value maps to the outermost level, -127.
void quantize_block(const float* M40_RESTRICT x, BlockIQ4_XS& b) {
  int scales[8];
  fit_signed_sub_scales<8, 32>(x, 127.0f, b.d, scales);
  const float d = half_to_float(b.d);

  b.scales_h = 0;
  std::memset(b.scales_l, 0, sizeof b.scales_l);
  for (int s = 0; s < 8; ++s) {
    const int stored = scales[s] + 32;  // iq4_xs_scale's packing
    b.scales_l[s >> 1] |= static_cast<uint8_t>((stored & 0xF) << (4 * (s & 1)));
    b.scales_h = static_cast<uint16_t>(b.scales_h | ((stored >> 4) << (2 * s)));
    const float inverse = reciprocal_or_zero(d * to_float(scales[s]));
    uint8_t quants[32];
    for (int l = 0; l < 32; ++l) quants[l] = static_cast<uint8_t>(nearest_iq4_index(x[32 * s + l] * inverse));
    pack_nibbles_of_32(quants, b.qs + 16 * s);
  }
}

}  // namespace m40::quant::detail

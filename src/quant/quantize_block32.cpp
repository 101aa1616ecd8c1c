// The formats of 32 values with one fp16 scale (and offset) per block: Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL. Every quant is computed against the
// stored (fp16-rounded) scale, since that is what dequantizes.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "quant/quantize_block.h"

namespace m40::quant::detail {

namespace {

// Q4_0 and Q5_0: x ~= d * (q - zero), q in 0..2 * zero - 1. The extreme value
// maps to q = 0; the other sign reaches at most 2 * zero (d is rounded away
// from zero) and clamps one below, so no value is off by more than a step.
void quantize_symmetric(const float* M40_RESTRICT x, int zero, uint16_t& d_bits, uint8_t* quants) {
  d_bits = covering_half(signed_extreme(x, 32) / static_cast<float>(-zero));
  const float inverse = reciprocal_or_zero(half_to_float(d_bits));
  for (int j = 0; j < 32; ++j) {
    quants[j] = static_cast<uint8_t>(clamp_int(round_to_int(x[j] * inverse) + zero, 0, 2 * zero - 1));
  }
}

// Q4_1 and Q5_1: x ~= d * q + m, q in 0..max_quant. The offset m is rounded
// down and the step d up, so every value lies within half a step of a level.
template <class Block>
void quantize_with_offset(const float* M40_RESTRICT x, int max_quant, Block& b, uint8_t* quants) {
  const float low = *std::min_element(x, x + 32);
  const float high = *std::max_element(x, x + 32);
  b.m = half_at_most(low);
  const float m = half_to_float(b.m);
  b.d = covering_half((high - m) / static_cast<float>(max_quant));
  const float inverse = reciprocal_or_zero(half_to_float(b.d));
  for (int j = 0; j < 32; ++j) {
    quants[j] = static_cast<uint8_t>(clamp_int(round_to_int((x[j] - m) * inverse), 0, max_quant));
  }
}

// Bit 4 of quant i into bit i of the little-endian word qh (Q5_0, Q5_1).
void pack_fifth_bits(const uint8_t* quants, uint8_t* qh) {
  uint32_t word = 0;
  for (int i = 0; i < 32; ++i) word |= static_cast<uint32_t>(quants[i] >> 4) << i;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(word >> (8 * k));
}

}  // namespace

// Shared with the CUDA KV cache (blocks.h).
void quantize_block(const float* M40_RESTRICT x, BlockQ8_0& b) { quantize_block_q8_0(x, b); }

void quantize_block(const float* M40_RESTRICT x, BlockQ4_0& b) {
  uint8_t quants[32];
  quantize_symmetric(x, 8, b.d, quants);
  pack_nibbles_of_32(quants, b.qs);
}

void quantize_block(const float* M40_RESTRICT x, BlockQ5_0& b) {
  uint8_t quants[32];
  quantize_symmetric(x, 16, b.d, quants);
  pack_nibbles_of_32(quants, b.qs);
  pack_fifth_bits(quants, b.qh);
}

void quantize_block(const float* M40_RESTRICT x, BlockQ4_1& b) {
  uint8_t quants[32];
  quantize_with_offset(x, 15, b, quants);
  pack_nibbles_of_32(quants, b.qs);
}

void quantize_block(const float* M40_RESTRICT x, BlockQ5_1& b) {
  uint8_t quants[32];
  quantize_with_offset(x, 31, b, quants);
  pack_nibbles_of_32(quants, b.qs);
  pack_fifth_bits(quants, b.qh);
}

// The extreme value maps to the outermost level, -127, and every value to its
// nearest level; the scale is rounded up so none lies beyond +-127.
void quantize_block(const float* M40_RESTRICT x, BlockIQ4_NL& b) {
  b.d = covering_half(signed_extreme(x, 32) / -127.0f);
  const float inverse = reciprocal_or_zero(half_to_float(b.d));
  uint8_t quants[32];
  for (int j = 0; j < 32; ++j) quants[j] = static_cast<uint8_t>(nearest_iq4_index(x[j] * inverse));
  pack_nibbles_of_32(quants, b.qs);
}

}  // namespace m40::quant::detail

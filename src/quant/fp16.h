// IEEE half (fp16) and bfloat16 conversions done with integer operations, so
// that they compile and give bit-identical results on the host and on any GPU
// (sm_52 has no fp16 arithmetic, CUDA 11.8 no bf16 type for it).
// Halves and bf16 values travel as their raw bits in a uint16_t.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant/host_device.h"

namespace m40::quant {

M40_HOST_DEVICE inline uint32_t float_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

M40_HOST_DEVICE inline float float_from_bits(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// Exact: every half is representable as a float. Written with bit masks, not
// branches, so that the host compiler vectorizes rows of halves.
M40_HOST_DEVICE inline float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t magnitude = half & 0x7fffu;
  const uint32_t exponent = magnitude >> 10;
  const uint32_t if_inf_or_nan = 0u - static_cast<uint32_t>(exponent == 0x1fu);  // all ones or zero
  const uint32_t if_subnormal = 0u - static_cast<uint32_t>(exponent == 0u);
  // Normal, inf, NaN: moving exponent and mantissa up by 13 bits leaves the
  // exponent biased by 15; adding 112 rebiases to 127, and another 112 takes
  // inf and NaN (exponent 31) to 255, keeping the NaN payload.
  const uint32_t widened = (magnitude << 13) + (112u << 23) + (if_inf_or_nan & (112u << 23));
  // Zero and subnormal: mantissa * 2^-24, exact in float arithmetic.
  const uint32_t subnormal =
      float_bits(static_cast<float>(static_cast<int32_t>(magnitude)) * 5.9604644775390625e-8f);
  return float_from_bits(sign | (subnormal & if_subnormal) | (widened & ~if_subnormal));
}

// Rounds to nearest, ties to even. Overflow gives inf; NaN stays a (quiet) NaN.
M40_HOST_DEVICE inline uint16_t float_to_half(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet bit set, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) {  // >= 65520 rounds past 65504: inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x38800000u) {  // normal half range [2^-14, 65520)
    // Round at bit 13; a carry out of the mantissa correctly bumps the exponent.
    const uint32_t rounded = magnitude + 0x0fffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - ((127u - 15u) << 23)) >> 13));
  }
  // Half subnormal: count units of 2^-24, rounding to nearest even.
  const uint32_t exponent = magnitude >> 23;
  if (exponent < 102u) return static_cast<uint16_t>(sign);  // below 2^-25: zero
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t units = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (remainder > halfway || (remainder == halfway && (units & 1u) != 0)) ++units;
  return static_cast<uint16_t>(sign | units);  // 0x400 after a carry is 2^-14
}

// bf16 is the top half of a float.
M40_HOST_DEVICE inline float bf16_to_float(uint16_t bf16) {
  return float_from_bits(static_cast<uint32_t>(bf16) << 16);
}

// Rounds to nearest, ties to even. NaN stays a (quiet) NaN.
M40_HOST_DEVICE inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace m40::quant

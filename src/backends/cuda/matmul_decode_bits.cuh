// The building blocks of the weight decoders (matmul_decode.cuh): loads
// through the read-only path (16-, 8-, 4- and 2-byte, and 16 or 8 bytes at
// only 2-byte aligned addresses), small integers and FP16 bits to floats
// without conversion instructions, and the K-quants' packed scales.
//
// C++17, compiled by nvcc 11.8 for sm_52 (and on the host by
// tests/backends/cuda_on_host).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/half_widen.cuh"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::cuda::mm {

// ---------------------------------------------------------------------------
// Loads through the read-only (texture) path.

__device__ __forceinline__ uint4 load_16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint32_t load_4(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint32_t load_2(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// 16 bytes at an address that is only 2-byte aligned (the 18-, 34- and 210-byte
// blocks), as four little-endian words: four aligned 4-byte loads, one
// 2-byte load and funnel shifts. Reads no byte outside p[-2..15] (the last
// block of a tensor ends at p[15]: compute-sanitizer found the 4-byte load
// that used to read p[16..17]).
__device__ __forceinline__ uint4 load_16_align2(const uint8_t* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(address & ~uintptr_t{3});
  const uint32_t shift = static_cast<uint32_t>(address & 2u) * 8u;  // 0 or 16
  const uint32_t w0 = load_4(base), w1 = load_4(base + 4), w2 = load_4(base + 8), w3 = load_4(base + 12);
  const uint32_t w4 = load_2(base + (shift != 0 ? 16 : 12));  // p[14..15]; only used when misaligned
  return make_uint4(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift),
                    __funnelshift_r(w2, w3, shift), __funnelshift_r(w3, w4, shift));
}

// 8 bytes at an address that is only 2-byte aligned, as two little-endian
// words; reads no byte outside p[-2..7].
__device__ __forceinline__ uint2 load_8_align2(const uint8_t* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(address & ~uintptr_t{3});
  const uint32_t shift = static_cast<uint32_t>(address & 2u) * 8u;  // 0 or 16
  const uint32_t w0 = load_4(base), w1 = load_4(base + 4);
  const uint32_t w2 = load_2(base + (shift != 0 ? 8 : 4));  // p[6..7]; only used when misaligned
  return make_uint2(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift));
}

// ---------------------------------------------------------------------------
// Small integers to floats, exactly: 0x4B000000 | v is the float 2^23 + v for
// v < 2^23, so one byte permute (or logic op) and one add replace a
// quarter-rate conversion instruction.

inline constexpr float kTwo23 = 8388608.0f;

// Byte k (0..3) of `word` as the float 2^23 + byte.
template <int k>
__device__ __forceinline__ float magic_byte(uint32_t word) {
  static_assert(k >= 0 && k < 4, "a word has four bytes");
  // Result bytes: [byte k of word, 0, 0, 0x4B]; selector nibbles index the
  // eight bytes of (word, 0x0000004B).
  return __uint_as_float(__byte_perm(word, 0x4Bu, 0x4550u | k));
}

// The four bytes of `word` minus `bias` each, as exact small integers in
// floats (bias includes the 2^23 of the trick): the quants of the factored
// decoders below.
__device__ __forceinline__ void bytes_to_ints(uint32_t word, float bias, float* q) {
  q[0] = magic_byte<0>(word) - bias;
  q[1] = magic_byte<1>(word) - bias;
  q[2] = magic_byte<2>(word) - bias;
  q[3] = magic_byte<3>(word) - bias;
}

// scale * (byte - bias) for the four bytes of `word`, in order: w[0..3].
__device__ __forceinline__ void bytes_to_floats(uint32_t word, float bias, float scale, float* w) {
  bytes_to_ints(word, bias, w);
  w[0] *= scale, w[1] *= scale, w[2] *= scale, w[3] *= scale;
}

// 1/2 + byte / 256 for the four bytes of `word` (each below 128), in order:
// one byte permute each builds the float [0, 0, byte, 0x3F] (exponent 0x7E,
// the byte in the top mantissa bits). The fraction quants of the factored
// decoders below: dot(1/2 + q / 256, x) - sum(x) / 2 = dot(q, x) / 256 saves
// the subtraction the 2^23 trick needs, for about 7 of the 24 bits of the
// unit's dot product (still exact products, FP32 sums).
__device__ __forceinline__ void bytes_to_fractions(uint32_t word, float* m) {
  m[0] = __uint_as_float(__byte_perm(word, 0x3F000000u, 0x7054u));
  m[1] = __uint_as_float(__byte_perm(word, 0x3F000000u, 0x7154u));
  m[2] = __uint_as_float(__byte_perm(word, 0x3F000000u, 0x7254u));
  m[3] = __uint_as_float(__byte_perm(word, 0x3F000000u, 0x7354u));
}

// fma(scale, byte, -offset) for the four bytes of `word` (the K-quant formula).
__device__ __forceinline__ void bytes_to_floats_offset(uint32_t word, float scale, float offset, float* w) {
  w[0] = fmaf(scale, magic_byte<0>(word) - kTwo23, -offset);
  w[1] = fmaf(scale, magic_byte<1>(word) - kTwo23, -offset);
  w[2] = fmaf(scale, magic_byte<2>(word) - kTwo23, -offset);
  w[3] = fmaf(scale, magic_byte<3>(word) - kTwo23, -offset);
}

// Nibbles: the low (high = false) or high nibbles of the four bytes of
// `word`, as four bytes 0..15.
__device__ __forceinline__ uint32_t nibbles(uint32_t word, bool high) {
  return (high ? word >> 4 : word) & 0x0F0F0F0Fu;
}

// IQ4_NL / IQ4_XS levels for four nibble bytes (0..15 each), as four bytes
// holding level + 128 (so that the unsigned byte trick applies): two byte
// permutes look the index up in the halves of the table, a mask picks one.
__device__ __forceinline__ uint32_t iq4_levels_biased(uint32_t nibble_bytes) {
  // blocks.h's packed table with every byte flipped by 0x80 (level + 128).
  constexpr uint64_t kLow = quant::kIQ4LevelsLow ^ 0x8080808080808080ull;
  constexpr uint64_t kHigh = quant::kIQ4LevelsHigh ^ 0x8080808080808080ull;
  const uint32_t index = nibble_bytes & 0x07070707u;
  const uint32_t packed = index | (index >> 4);  // byte 0: i0 | i1 << 4, byte 2: i2 | i3 << 4
  const uint32_t selector = (packed & 0xFFu) | ((packed >> 8) & 0xFF00u);
  const uint32_t low = __byte_perm(static_cast<uint32_t>(kLow), static_cast<uint32_t>(kLow >> 32), selector);
  const uint32_t high = __byte_perm(static_cast<uint32_t>(kHigh), static_cast<uint32_t>(kHigh >> 32), selector);
  const uint32_t use_high = ((nibble_bytes >> 3) & 0x01010101u) * 0xFFu;
  return (high & use_high) | (low & ~use_high);
}

// `word` with its bits moved from bit kFrom to bit kTo of each field (a left
// or a right shift, chosen at compile time; the caller masks the result).
template <int kFrom, int kTo>
__device__ __forceinline__ uint32_t move_bits(uint32_t word) {
  if constexpr (kTo >= kFrom) {
    return word << (kTo - kFrom);
  } else {
    return word >> (kFrom - kTo);
  }
}

// Word i (0..3) of a uint4.
template <int i>
__device__ __forceinline__ uint32_t word_of(const uint4& v) {
  static_assert(i >= 0 && i < 4, "a uint4 has four words");
  if constexpr (i == 0) return v.x;
  if constexpr (i == 1) return v.y;
  if constexpr (i == 2) return v.z;
  return v.w;
}

// quant::k_quant_scale_min for the scale bytes held in registers: words 1..3
// of the 16-byte Q4_K/Q5_K header (word 0 is d and dmin) are scales[0..3],
// scales[4..7] and scales[8..11]. Sub-block s uses byte s % 4 of each.
__device__ __forceinline__ quant::ScaleMin k_scale_min(const uint4& header, int s) {
  const uint32_t shift = 8u * static_cast<uint32_t>(s & 3);
  const uint32_t b1 = (header.y >> shift) & 0xFFu;  // scales[s % 4]
  const uint32_t b2 = (header.z >> shift) & 0xFFu;  // scales[s % 4 + 4]
  const uint32_t b3 = (header.w >> shift) & 0xFFu;  // scales[s % 4 + 8]
  if (s < 4) return {static_cast<int>(b1 & 63), static_cast<int>(b2 & 63)};
  return {static_cast<int>((b3 & 0xF) | ((b1 >> 6) << 4)), static_cast<int>((b3 >> 4) | ((b2 >> 6) << 4))};
}

// A small non-negative integer (below 2^23) as a float, exactly: a logic op
// and an add instead of a quarter-rate conversion.
__device__ __forceinline__ float small_uint_to_float(uint32_t v) { return __uint_as_float(0x4B000000u | v) - kTwo23; }

// {d * scale, dmin * min} of sub-block s: value = scale * q - offset.
__device__ __forceinline__ float2 k_unit_scale(const uint4& header, int s) {
  const quant::ScaleMin sm = k_scale_min(header, s);
  return {widen_half(header.x) * small_uint_to_float(static_cast<uint32_t>(sm.scale)),
          widen_half(header.x >> 16) * small_uint_to_float(static_cast<uint32_t>(sm.min))};
}

}  // namespace m40::cuda::mm

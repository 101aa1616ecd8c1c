// Weight decoders for the matmul kernels: per storage type, how one thread
// loads a "unit" of a row (8 or 16 consecutive values; for the wide decoders
// at the end, 16 to 64 scattered ones) with the widest loads
// the layout allows, and turns it into FP32 registers, 8 values (a "piece") at
// a time. The matvec kernel gives each lane units along a row; the gemm kernel
// decodes 16 consecutive values per thread into its shared-memory tile.
//
// The block structs, the value formulas and the scale packing are those of
// quant/blocks.h; this file only changes how the bytes reach registers (16-byte
// and aligned 4-byte loads instead of byte loads) and how small integers become
// floats (exact bit tricks instead of conversion instructions). The K-quants'
// scale*q - offset is one fused multiply-add here, so a value may differ from
// quant::dequantize_value in its last bit; every other format decodes to the
// same bits. The matmul tests compare every type against the CPU.
//
// C++17, compiled by nvcc 11.8 for sm_52: no fp16 arithmetic, no dp4a.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

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

// An IEEE half to float with the conversion instruction that every GPU has
// (sm_52 lacks fp16 arithmetic, not the conversion). Exact, so equal to
// quant::half_to_float for every input; one instruction instead of a dozen.
__device__ __forceinline__ float widen_half(uint32_t bits) {
#ifdef __CUDA_ARCH__
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(static_cast<unsigned short>(bits & 0xFFFFu)));
  return value;
#else
  // A host build of this header (tests/backends/cuda_on_host): the CPU twin.
  return quant::half_to_float(static_cast<uint16_t>(bits & 0xFFFFu));
#endif
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

// ---------------------------------------------------------------------------
// Decoders. A row is a sequence of blocks of kBlockBytes bytes (for the float
// types: a unit's bytes), each holding kUnitsPerBlock units of kUnit (8 or
// 16) consecutive values. Unit u of a row is unit u % kUnitsPerBlock of block
// u / kUnitsPerBlock and holds columns kUnit * u .. kUnit * (u + 1) - 1 (the
// wide decoders: the same columns in another order, piece_offset below).
//   Raw                              the unit's bytes in registers
//   load(block, unit)                issue the loads (block: its first byte;
//                                    unit: the unit within the block)
//   decode<piece>(raw, unit, w)      values 8 piece .. 8 piece + 7 of the unit
// Callers keep a pointer to the block and step it by whole blocks, so the
// address math per unit is an add.
//
// The block formats are also "factored" (kFactored): value = scale * q -
// offset for the whole unit, with q a small integer. The matvec kernel then
// takes dot(q, x) over the unit and applies the scale (and the offset times
// sum(x), shared by all rows) once per unit, instead of decoding every value.
//   quants<piece>(raw, unit, q)      q of values 8 piece .. 8 piece + 7:
//                                    the signed quant, exact (Q8_0, IQ4_NL,
//                                    IQ4_XS), or with kFractionQuants 1/2 +
//                                    q / F for the unsigned stored quant,
//                                    shifted so that q < 128: F = 256, or
//                                    the decoder's kFractionScale (256 >> k
//                                    for quants stored as q << k)
//   kScaleGroups                     scales per unit: group g is pieces
//                                    g * n .. g * n + n - 1 (n = pieces per
//                                    group); 1 but for the wide K-quants
//   unit_scale(raw, unit, group)     {scale, offset}: value = scale * q -
//                                    offset (offset 0 for the signed ones)
//   piece_offset(unit, piece)        (optional) the column of value 8 piece
//                                    relative to the unit's first column
//                                    kUnit * unit, when a unit's values are
//                                    not consecutive columns
//
// The wide decoders (DecodeXxxWide, one and two tokens only) use every byte
// a lane loads (Q3_K: half of each high-bit byte): the 16-value units of Q4_K and Q4_0 use one nibble of each
// byte they load, Q6_K a quarter of its high-bit bytes, and Q4_K loads its
// 16-byte header once per 16 weights. Their units cover scattered columns
// (piece_offset) so that neighbouring lanes still read x from the same
// 128-byte lines. They cut the decode loop's instructions per weight by a
// fifth to a third (docs/cuda-kernels.md).

struct DecodeF32 {
  static constexpr bool kFactored = false;
  static constexpr int kUnit = 8;
  static constexpr int kUnitsPerBlock = 1;
  static constexpr int kBlockBytes = 32;
  struct Raw {
    float4 a, b;
  };
  __device__ static Raw load(const uint8_t* block, int) {
    const float4* p = reinterpret_cast<const float4*>(block);
    return {__ldg(p), __ldg(p + 1)};
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int, float* w) {
    w[0] = raw.a.x, w[1] = raw.a.y, w[2] = raw.a.z, w[3] = raw.a.w;
    w[4] = raw.b.x, w[5] = raw.b.y, w[6] = raw.b.z, w[7] = raw.b.w;
  }
};

struct DecodeF16 {
  static constexpr bool kFactored = false;
  static constexpr int kUnit = 8;
  static constexpr int kUnitsPerBlock = 1;
  static constexpr int kBlockBytes = 16;
  using Raw = uint4;
  __device__ static Raw load(const uint8_t* block, int) { return load_16(block); }
  template <int piece>
  __device__ static void decode(const Raw& raw, int, float* w) {
    w[0] = widen_half(raw.x), w[1] = widen_half(raw.x >> 16);
    w[2] = widen_half(raw.y), w[3] = widen_half(raw.y >> 16);
    w[4] = widen_half(raw.z), w[5] = widen_half(raw.z >> 16);
    w[6] = widen_half(raw.w), w[7] = widen_half(raw.w >> 16);
  }
};

struct DecodeBF16 {
  static constexpr bool kFactored = false;
  static constexpr int kUnit = 8;
  static constexpr int kUnitsPerBlock = 1;
  static constexpr int kBlockBytes = 16;
  using Raw = uint4;
  __device__ static Raw load(const uint8_t* block, int) { return load_16(block); }
  template <int piece>
  __device__ static void decode(const Raw& raw, int, float* w) {
    // quant::bf16_to_float: the bf16 bits are the top half of the float.
    w[0] = __uint_as_float(raw.x << 16), w[1] = __uint_as_float(raw.x & 0xFFFF0000u);
    w[2] = __uint_as_float(raw.y << 16), w[3] = __uint_as_float(raw.y & 0xFFFF0000u);
    w[4] = __uint_as_float(raw.z << 16), w[5] = __uint_as_float(raw.z & 0xFFFF0000u);
    w[6] = __uint_as_float(raw.w << 16), w[7] = __uint_as_float(raw.w & 0xFFFF0000u);
  }
};

// Q8_0: unit h is half a block, qs[16h .. 16h + 15]; value = d * q.
struct DecodeQ8_0 {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ8_0;
  static constexpr int kUnitsPerBlock = 2;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 qs;
    float d;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    return {load_16_align2(block + offsetof(Block, qs) + 16 * unit), widen_half(load_2(block))};
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    quants<piece>(raw, unit, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] *= raw.d;
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = false;
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int, float* q) {
    // q + 128 as an unsigned byte, so the float trick applies; bias 2^23 + 128.
    bytes_to_ints(word_of<2 * piece>(raw.qs) ^ 0x80808080u, kTwo23 + 128.0f, q);
    bytes_to_ints(word_of<2 * piece + 1>(raw.qs) ^ 0x80808080u, kTwo23 + 128.0f, q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, 0.0f}; }
};

// Q4_0 and IQ4_NL: unit h is the 16 low (h = 0) or high (h = 1) nibbles of a
// block's qs: values 16h .. 16h + 15.
struct DecodeQ4_0 {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ4_0;
  static constexpr int kUnitsPerBlock = 2;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 qs;
    float d;
  };
  __device__ static Raw load(const uint8_t* block, int) {
    return {load_16_align2(block + offsetof(Block, qs)), widen_half(load_2(block))};
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    const bool high = (unit & 1) != 0;
    bytes_to_floats(nibbles(word_of<2 * piece>(raw.qs), high), kTwo23 + 8.0f, raw.d, w);  // (q - 8) * d
    bytes_to_floats(nibbles(word_of<2 * piece + 1>(raw.qs), high), kTwo23 + 8.0f, raw.d, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    const bool high = (unit & 1) != 0;
    bytes_to_fractions(nibbles(word_of<2 * piece>(raw.qs), high), q);
    bytes_to_fractions(nibbles(word_of<2 * piece + 1>(raw.qs), high), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, 8.0f * raw.d}; }  // d * (q - 8)
};

struct DecodeIQ4_NL {
  static constexpr int kUnit = 16;
  using Block = quant::BlockIQ4_NL;
  static constexpr int kUnitsPerBlock = 2;
  static constexpr int kBlockBytes = sizeof(Block);
  using Raw = DecodeQ4_0::Raw;
  __device__ static Raw load(const uint8_t* block, int) {
    return {load_16_align2(block + offsetof(Block, qs)), widen_half(load_2(block))};
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    quants<piece>(raw, unit, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] *= raw.d;
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = false;  // levels are signed bytes
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    const bool high = (unit & 1) != 0;
    bytes_to_ints(iq4_levels_biased(nibbles(word_of<2 * piece>(raw.qs), high)), kTwo23 + 128.0f, q);
    bytes_to_ints(iq4_levels_biased(nibbles(word_of<2 * piece + 1>(raw.qs), high)), kTwo23 + 128.0f, q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, 0.0f}; }
};

// Q4_K: a unit is 16 values of sub-block s (unit in block = 2 s + h):
// nibble s % 2 of qs[32 * (s / 2) + 16h .. + 15]. value = scale * q - offset.
struct DecodeQ4_K {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ4_K;
  static constexpr int kUnitsPerBlock = 16;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 header;  // d, dmin, scales[12]
    uint4 qs;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int s = unit >> 1;
    return {load_16(block), load_16(block + offsetof(Block, qs) + 32 * (s >> 1) + 16 * (unit & 1))};
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    const int s = unit >> 1;
    const float2 scale_offset = k_unit_scale(raw.header, s);
    const float scale = scale_offset.x, offset = scale_offset.y;
    const bool high = (s & 1) != 0;
    bytes_to_floats_offset(nibbles(word_of<2 * piece>(raw.qs), high), scale, offset, w);
    bytes_to_floats_offset(nibbles(word_of<2 * piece + 1>(raw.qs), high), scale, offset, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    const bool high = ((unit >> 1) & 1) != 0;
    bytes_to_fractions(nibbles(word_of<2 * piece>(raw.qs), high), q);
    bytes_to_fractions(nibbles(word_of<2 * piece + 1>(raw.qs), high), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int unit, int) { return k_unit_scale(raw.header, unit >> 1); }
};

// Q5_K: as Q4_K, with the fifth bit s of qh[16h + l].
struct DecodeQ5_K {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ5_K;
  static constexpr int kUnitsPerBlock = 16;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 header;
    uint4 qh;
    uint4 qs;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int s = unit >> 1;
    const int h = unit & 1;
    return {load_16(block), load_16(block + offsetof(Block, qh) + 16 * h),
            load_16(block + offsetof(Block, qs) + 32 * (s >> 1) + 16 * h)};
  }
  template <int piece>
  __device__ static uint32_t quant_bytes(const Raw& raw, int s, int word) {
    const uint32_t qs = word == 0 ? word_of<2 * piece>(raw.qs) : word_of<2 * piece + 1>(raw.qs);
    const uint32_t qh = word == 0 ? word_of<2 * piece>(raw.qh) : word_of<2 * piece + 1>(raw.qh);
    return nibbles(qs, (s & 1) != 0) | (((qh >> s) & 0x01010101u) << 4);
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    const int s = unit >> 1;
    const float2 scale_offset = k_unit_scale(raw.header, s);
    const float scale = scale_offset.x, offset = scale_offset.y;
    bytes_to_floats_offset(quant_bytes<piece>(raw, s, 0), scale, offset, w);
    bytes_to_floats_offset(quant_bytes<piece>(raw, s, 1), scale, offset, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    const int s = unit >> 1;
    bytes_to_fractions(quant_bytes<piece>(raw, s, 0), q);
    bytes_to_fractions(quant_bytes<piece>(raw, s, 1), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int unit, int) { return k_unit_scale(raw.header, unit >> 1); }
};

// Q6_K: unit sb is sub-block sb (16 values, i = 16 sb + j): with n = sb / 8,
// g = (sb / 2) % 4, l0 = 16 (sb % 2), the low bits are nibble g / 2 of
// ql[64n + 32 (g % 2) + l0 + j], the high bits are bits 2g of qh[32n + l0 + j].
// value = d * scales[sb] * (q - 32).
struct DecodeQ6_K {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ6_K;
  static constexpr int kUnitsPerBlock = 16;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 ql;
    uint4 qh;
    float scale;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int sb = unit;
    const int n = sb >> 3, g = (sb >> 1) & 3, l0 = 16 * (sb & 1);
    const float d = widen_half(load_2(block + offsetof(Block, d)));
    const int8_t sc = static_cast<int8_t>(__ldg(block + offsetof(Block, scales) + sb));
    return {load_16_align2(block + offsetof(Block, ql) + 64 * n + 32 * (g & 1) + l0),
            load_16_align2(block + offsetof(Block, qh) + 32 * n + l0), d * static_cast<float>(sc)};
  }
  template <int piece>
  __device__ static uint32_t quant_bytes(const Raw& raw, int g, int word) {
    const uint32_t ql = word == 0 ? word_of<2 * piece>(raw.ql) : word_of<2 * piece + 1>(raw.ql);
    const uint32_t qh = word == 0 ? word_of<2 * piece>(raw.qh) : word_of<2 * piece + 1>(raw.qh);
    return nibbles(ql, g >= 2) | (((qh >> (2 * g)) & 0x03030303u) << 4);
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    const int g = (unit >> 1) & 3;
    bytes_to_floats(quant_bytes<piece>(raw, g, 0), kTwo23 + 32.0f, raw.scale, w);  // (q - 32) * scale
    bytes_to_floats(quant_bytes<piece>(raw, g, 1), kTwo23 + 32.0f, raw.scale, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    const int g = (unit >> 1) & 3;
    bytes_to_fractions(quant_bytes<piece>(raw, g, 0), q);
    bytes_to_fractions(quant_bytes<piece>(raw, g, 1), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.scale, 32.0f * raw.scale}; }  // (q - 32)
};

// ---------------------------------------------------------------------------
// The other block formats (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_XS): the
// formats of many models made to fit a 24 GB card (Q3_K_M, Q2_K, IQ4_XS
// files of 13B-70B models, and older Q4_1/Q5 files). Units of 16
// consecutive values as above. Their fraction quants put the quant's bits
// at the top of the byte's 7 (q << k, kFractionScale = 256 >> k): with 2-
// or 3-bit quants, q / 256 would keep only a few bits beside the 1/2.

// Bits 4k .. 4k + 3 of `bits` as bit `to` of bytes 0..3 (the fifth bits of
// Q5_0/Q5_1): multiplying by 1 + 2^7 + 2^14 + 2^21 moves bit j to bit 8j
// (the other copies land on bits that the mask clears).
template <int to>
__device__ __forceinline__ uint32_t spread_nibble_bits(uint32_t bits, int k) {
  return (((bits >> (4 * k)) & 0xFu) * 0x00204081u & 0x01010101u) << to;
}

// Q4_1: unit h is the low (h = 0) or high (h = 1) nibbles of qs: values 16h
// .. 16h + 15; value = d * q + m.
struct DecodeQ4_1 {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ4_1;
  static constexpr int kUnitsPerBlock = 2;
  static constexpr int kBlockBytes = sizeof(Block);
  static_assert(sizeof(Block) % 4 == 0 && offsetof(Block, qs) % 4 == 0, "4-byte loads");
  struct Raw {
    uint4 qs;
    float d, m;
  };
  __device__ static Raw load(const uint8_t* block, int) {
    const uint8_t* qs = block + offsetof(Block, qs);
    const uint32_t dm = load_4(block);
    return {make_uint4(load_4(qs), load_4(qs + 4), load_4(qs + 8), load_4(qs + 12)), widen_half(dm),
            widen_half(dm >> 16)};
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    bytes_to_floats_offset(nibbles(word_of<2 * piece>(raw.qs), unit == 1), raw.d, -raw.m, w);
    bytes_to_floats_offset(nibbles(word_of<2 * piece + 1>(raw.qs), unit == 1), raw.d, -raw.m, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr float kFractionScale = 32.0f;  // q << 3
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    bytes_to_fractions(nibbles(word_of<2 * piece>(raw.qs), unit == 1) << 3, q);
    bytes_to_fractions(nibbles(word_of<2 * piece + 1>(raw.qs), unit == 1) << 3, q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, -raw.m}; }
};

// Q5_0 and Q5_1: as Q4_1, the fifth bit of value i in bit i of qh (unit h
// uses qh's half h); Q5_0: value = d * (q - 16), Q5_1: d * q + m.
template <class BlockType>
struct DecodeQ5 {
  static constexpr bool kHasMin = std::is_same_v<BlockType, quant::BlockQ5_1>;
  static constexpr int kUnit = 16;
  using Block = BlockType;
  static constexpr int kUnitsPerBlock = 2;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 qs;
    uint32_t high;  // the unit's 16 fifth bits
    float d, m;     // Q5_0: m = -16 d
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const float d = widen_half(load_2(block));
    float m = -16.0f * d;
    if constexpr (kHasMin) m = widen_half(load_2(block + offsetof(Block, m)));
    return {load_16_align2(block + offsetof(Block, qs)), load_2(block + offsetof(Block, qh) + 2 * unit), d, m};
  }
  // The quants of values 8 piece + 4 word .. + 3, their bits at bit `shift`.
  template <int piece, int word, int shift>
  __device__ static uint32_t quant_bytes(const Raw& raw, int unit) {
    const uint32_t low = nibbles(word_of<2 * piece + word>(raw.qs), unit == 1) << shift;
    return low | spread_nibble_bits<4 + shift>(raw.high, 2 * piece + word);
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    bytes_to_floats_offset(quant_bytes<piece, 0, 0>(raw, unit), raw.d, -raw.m, w);
    bytes_to_floats_offset(quant_bytes<piece, 1, 0>(raw, unit), raw.d, -raw.m, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr float kFractionScale = 64.0f;  // q << 2
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    bytes_to_fractions(quant_bytes<piece, 0, 2>(raw, unit), q);
    bytes_to_fractions(quant_bytes<piece, 1, 2>(raw, unit), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, -raw.m}; }
};
using DecodeQ5_0 = DecodeQ5<quant::BlockQ5_0>;
using DecodeQ5_1 = DecodeQ5<quant::BlockQ5_1>;

// Q2_K: unit s is sub-block s (values 16s .. 16s + 15): bits 2g of qs[32n +
// 16h .. + 15] with n = s / 8, g = (s / 2) % 4, h = s % 2; value = d *
// (scales[s] & 15) * q - dmin * (scales[s] >> 4).
struct DecodeQ2_K {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ2_K;
  static constexpr int kUnitsPerBlock = 16;
  static constexpr int kBlockBytes = sizeof(Block);
  static_assert(sizeof(Block) % 4 == 0 && offsetof(Block, qs) % 4 == 0 && offsetof(Block, d) % 4 == 0,
                "4-byte loads");
  struct Raw {
    uint4 qs;
    float scale, offset;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const uint8_t* qs = block + offsetof(Block, qs) + 32 * (unit >> 3) + 16 * (unit & 1);
    const uint32_t d_dmin = load_4(block + offsetof(Block, d));
    const uint32_t packed = __ldg(block + offsetof(Block, scales) + unit);
    return {make_uint4(load_4(qs), load_4(qs + 4), load_4(qs + 8), load_4(qs + 12)),
            widen_half(d_dmin) * small_uint_to_float(packed & 0xFu),
            widen_half(d_dmin >> 16) * small_uint_to_float(packed >> 4)};
  }
  template <int piece, int word>
  __device__ static uint32_t quant_bytes(const Raw& raw, int unit) {
    return (word_of<2 * piece + word>(raw.qs) >> (2 * ((unit >> 1) & 3))) & 0x03030303u;
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    bytes_to_floats_offset(quant_bytes<piece, 0>(raw, unit), raw.scale, raw.offset, w);
    bytes_to_floats_offset(quant_bytes<piece, 1>(raw, unit), raw.scale, raw.offset, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr float kFractionScale = 8.0f;  // q << 5
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    bytes_to_fractions(quant_bytes<piece, 0>(raw, unit) << 5, q);
    bytes_to_fractions(quant_bytes<piece, 1>(raw, unit) << 5, q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.scale, raw.offset}; }
};

// Q3_K: unit s is sub-block s: with n = s / 8, g = (s / 2) % 4, l0 = 16 (s %
// 2), the low bits are bits 2g of qs[32n + l0 + j] and the third bit is bit
// 4n + g of hmask[l0 + j]; value = d * scale_s * (q - 4).
struct DecodeQ3_K {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ3_K;
  static constexpr int kUnitsPerBlock = 16;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 qs;
    uint4 hmask;
    float scale;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int l0 = 16 * (unit & 1);
    const uint8_t* scales = block + offsetof(Block, scales);
    // quant::q3_k_scale from the two bytes that hold sub-block s's bits.
    const uint32_t low = __ldg(scales + (unit & 7)) >> (4 * (unit >> 3));
    const uint32_t high = __ldg(scales + 8 + (unit & 3)) >> (2 * (unit >> 2));
    const int scale = static_cast<int>((low & 0xFu) | ((high & 3u) << 4)) - 32;
    return {load_16_align2(block + offsetof(Block, qs) + 32 * (unit >> 3) + l0),
            load_16_align2(block + offsetof(Block, hmask) + l0),
            widen_half(load_2(block + offsetof(Block, d))) * static_cast<float>(scale)};
  }
  // The quants (0..7, q - 4 is the value's) of values 8 piece + 4 word ..
  // + 3, their bits at bit `shift`.
  template <int piece, int word, int shift>
  __device__ static uint32_t quant_bytes(const Raw& raw, int unit) {
    const uint32_t low = (word_of<2 * piece + word>(raw.qs) >> (2 * ((unit >> 1) & 3))) & 0x03030303u;
    const uint32_t third = (word_of<2 * piece + word>(raw.hmask) >> (4 * (unit >> 3) + ((unit >> 1) & 3))) & 0x01010101u;
    return (low | (third << 2)) << shift;
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    bytes_to_floats(quant_bytes<piece, 0, 0>(raw, unit), kTwo23 + 4.0f, raw.scale, w);  // (q - 4) * scale
    bytes_to_floats(quant_bytes<piece, 1, 0>(raw, unit), kTwo23 + 4.0f, raw.scale, w + 4);
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr float kFractionScale = 16.0f;  // q << 4
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    bytes_to_fractions(quant_bytes<piece, 0, 4>(raw, unit), q);
    bytes_to_fractions(quant_bytes<piece, 1, 4>(raw, unit), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.scale, 4.0f * raw.scale}; }
};

// d * (ls - 32) of IQ4_XS sub-block s (quant::iq4_xs_scale).
__device__ __forceinline__ float iq4_xs_sub_block_scale(const uint8_t* block, int s) {
  using Block = quant::BlockIQ4_XS;
  const uint32_t d_high = load_4(block);  // d, scales_h
  const uint32_t low = __ldg(block + offsetof(Block, scales_l) + (s >> 1)) >> (4 * (s & 1));
  const uint32_t high = d_high >> (16 + 2 * s);
  const int ls = static_cast<int>((low & 0xFu) | ((high & 3u) << 4)) - 32;
  return widen_half(d_high) * static_cast<float>(ls);
}

// IQ4_XS: unit u is the low (u even) or high nibbles of qs[16s .. 16s + 15],
// s = u / 2: values 32s + 16 (u % 2) + j; value = d * (ls - 32) * level.
struct DecodeIQ4_XS {
  static constexpr int kUnit = 16;
  using Block = quant::BlockIQ4_XS;
  static constexpr int kUnitsPerBlock = 16;
  static constexpr int kBlockBytes = sizeof(Block);
  static_assert(sizeof(Block) % 8 == 0 && offsetof(Block, qs) % 8 == 0, "8-byte loads");
  struct Raw {
    uint4 qs;
    float scale;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int s = unit >> 1;
    const uint2* qs = reinterpret_cast<const uint2*>(block + offsetof(Block, qs) + 16 * s);
    const uint2 a = __ldg(qs), b = __ldg(qs + 1);
    return {make_uint4(a.x, a.y, b.x, b.y), iq4_xs_sub_block_scale(block, s)};
  }
  template <int piece>
  __device__ static void decode(const Raw& raw, int unit, float* w) {
    quants<piece>(raw, unit, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] *= raw.scale;
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = false;  // levels are signed
  static constexpr int kScaleGroups = 1;
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    const bool high = (unit & 1) != 0;
    bytes_to_ints(iq4_levels_biased(nibbles(word_of<2 * piece>(raw.qs), high)), kTwo23 + 128.0f, q);
    bytes_to_ints(iq4_levels_biased(nibbles(word_of<2 * piece + 1>(raw.qs), high)), kTwo23 + 128.0f, q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.scale, 0.0f}; }
};

// {d * scale, dmin * min} of sub-block 2 (unit / 2) + group of Q4_K or Q5_K
// (the wide units: unit 0..7, two sub-blocks each): k_scale_min four
// sub-blocks at a time in the bytes of a word, masks chosen by the unit
// (lane-constant) selecting the packing of sub-blocks 0..3 or 4..7, and a
// byte permute with the 2^23 trick turning byte s % 4 into a float without a
// conversion instruction.
__device__ __forceinline__ float2 k_wide_unit_scale(const uint4& header, int unit, int group) {
  const bool low_half = unit < 4;                          // sub-blocks 0..3
  const uint32_t own = low_half ? 0x3F3F3F3Fu : 0u;        // scales[s], scales[s + 4]: 6 bits
  const uint32_t packed = low_half ? 0u : 0x0F0F0F0Fu;     // nibbles of scales[s + 4] (s >= 4)
  const uint32_t top = low_half ? 0u : 0x30303030u;        // top 2 bits of scales[s - 4], scales[s]
  const uint32_t scales = (header.y & own) | (header.w & packed) | ((header.y >> 2) & top);
  const uint32_t mins = (header.z & own) | ((header.w >> 4) & packed) | ((header.z >> 2) & top);
  const uint32_t selector = 0x4550u | static_cast<uint32_t>((2 * (unit >> 1) + group) & 3);
  const float d = widen_half(header.x), dmin = widen_half(header.x >> 16);
  // d * (2^23 + v) - d * 2^23 = d * v, rounded once as d * v is.
  return {fmaf(d, __uint_as_float(__byte_perm(scales, 0x4Bu, selector)), -d * kTwo23),
          fmaf(dmin, __uint_as_float(__byte_perm(mins, 0x4Bu, selector)), -dmin * kTwo23)};
}

// Q4_0 and IQ4_NL, wide: unit h (0, 1) is the 8 bytes qs[8h .. 8h + 7]
// with both nibbles: values 8h .. 8h + 7 (low nibbles) and 16 + 8h .. 23 +
// 8h (high). The two lanes of a block still read x within one 128-byte line.
struct DecodeQ4_0Wide {
  static constexpr int kUnit = 16;
  using Block = quant::BlockQ4_0;
  static constexpr int kUnitsPerBlock = 2;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint2 qs;
    float d;
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    return {load_8_align2(block + offsetof(Block, qs) + 8 * unit), widen_half(load_2(block))};
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 1;
  __device__ static int piece_offset(int unit, int piece) { return 16 * piece - 8 * unit; }
  template <int piece>
  __device__ static void quants(const Raw& raw, int, float* q) {
    bytes_to_fractions(nibbles(raw.qs.x, piece == 1), q);
    bytes_to_fractions(nibbles(raw.qs.y, piece == 1), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, 8.0f * raw.d}; }  // d * (q - 8)
};

struct DecodeIQ4_NLWide {
  static constexpr int kUnit = 16;
  using Block = quant::BlockIQ4_NL;
  static constexpr int kUnitsPerBlock = 2;
  static constexpr int kBlockBytes = sizeof(Block);
  static_assert(sizeof(Block) == sizeof(quant::BlockQ4_0) && offsetof(Block, qs) == offsetof(quant::BlockQ4_0, qs),
                "IQ4_NL blocks are laid out as Q4_0's");
  using Raw = DecodeQ4_0Wide::Raw;
  __device__ static Raw load(const uint8_t* block, int unit) { return DecodeQ4_0Wide::load(block, unit); }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = false;  // levels are signed
  static constexpr int kScaleGroups = 1;
  __device__ static int piece_offset(int unit, int piece) { return DecodeQ4_0Wide::piece_offset(unit, piece); }
  // The 16 levels as floats in shared memory: a level is one shared load
  // by its index (16 distinct words in 16 banks: no conflicts), instead of
  // two byte permutes, a select and the 2^23 subtraction. The kernel fills
  // the table (fill_table) before its first load.
  static constexpr bool kSharedTable = true;
  __device__ static float* table() {
    __shared__ float levels[16];
    return levels;
  }
  __device__ static void fill_table() {
    if (threadIdx.x < 16) table()[threadIdx.x] = static_cast<float>(quant::iq4_level(static_cast<int>(threadIdx.x)));
  }
  template <int piece>
  __device__ static void quants(const Raw& raw, int, float* q) {
    const float* levels = table();
    // Each nibble times 4: the byte offset of its level.
    const uint32_t offsets[2] = {(piece == 1 ? raw.qs.x >> 2 : raw.qs.x << 2) & 0x3C3C3C3Cu,
                                 (piece == 1 ? raw.qs.y >> 2 : raw.qs.y << 2) & 0x3C3C3C3Cu};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t offset = __byte_perm(offsets[j / 4], 0u, 0x4440u | static_cast<uint32_t>(j % 4));
      q[j] = *reinterpret_cast<const float*>(reinterpret_cast<const char*>(levels) + offset);
    }
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, 0.0f}; }
};

// IQ4_XS, wide: IQ4_NL's wide units within each 32-value sub-block: unit u
// (0..15), s = u / 2, h = u % 2, is the 8 bytes qs[16s + 8h .. + 7] with
// both nibbles (values 32s + 8h + j and 32s + 16 + 8h + j), one scale, the
// levels from the same shared-memory table.
struct DecodeIQ4_XSWide {
  static constexpr int kUnit = 16;
  using Block = quant::BlockIQ4_XS;
  static constexpr int kUnitsPerBlock = 16;
  static constexpr int kBlockBytes = sizeof(Block);
  using Raw = DecodeIQ4_NLWide::Raw;  // d: the sub-block's scale
  __device__ static Raw load(const uint8_t* block, int unit) {
    return {__ldg(reinterpret_cast<const uint2*>(block + offsetof(Block, qs) + 8 * unit)),
            iq4_xs_sub_block_scale(block, unit >> 1)};
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = false;
  static constexpr int kScaleGroups = 1;
  __device__ static int piece_offset(int unit, int piece) { return DecodeQ4_0Wide::piece_offset(unit & 1, piece); }
  static constexpr bool kSharedTable = true;
  __device__ static void fill_table() { DecodeIQ4_NLWide::fill_table(); }
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    DecodeIQ4_NLWide::quants<piece>(raw, unit, q);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int) { return {raw.d, 0.0f}; }
};

// Q4_K, wide: unit u (0..7), with c = u / 2 and h = u % 2, is the 16 bytes
// qs[32c + 16h .. + 15] with both nibbles: values 64c + 16h + j of sub-block
// 2c (low nibbles) and 64c + 32 + 16h + j of sub-block 2c + 1 (high), j =
// 0..15. One header per 32 weights, and the two lanes of a 32-byte chunk read
// x within one 128-byte line.
struct DecodeQ4_KWide {
  static constexpr int kUnit = 32;
  using Block = quant::BlockQ4_K;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr int kBlockBytes = sizeof(Block);
  using Raw = DecodeQ4_K::Raw;
  __device__ static Raw load(const uint8_t* block, int unit) {
    return {load_16(block), load_16(block + offsetof(Block, qs) + 16 * unit)};
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 2;
  // Piece p: values j = 8 (p % 2) .. + 7 of sub-block 2c + p / 2; the unit's
  // first column is 64c + 32h.
  __device__ static int piece_offset(int unit, int piece) {
    return 32 * (piece >> 1) - 16 * (unit & 1) + 8 * (piece & 1);
  }
  template <int piece>
  __device__ static void quants(const Raw& raw, int, float* q) {
    constexpr bool kHigh = piece >= 2;
    bytes_to_fractions(nibbles(word_of<2 * (piece % 2)>(raw.qs), kHigh), q);
    bytes_to_fractions(nibbles(word_of<2 * (piece % 2) + 1>(raw.qs), kHigh), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int unit, int group) {
    return k_wide_unit_scale(raw.header, unit, group);
  }
};

// Q5_K, wide: as DecodeQ4_KWide, with the fifth bits of its 16 values per
// sub-block in qh[16h .. 16h + 15] (bits 2c and 2c + 1).
struct DecodeQ5_KWide {
  static constexpr int kUnit = 32;
  using Block = quant::BlockQ5_K;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr int kBlockBytes = sizeof(Block);
  using Raw = DecodeQ5_K::Raw;
  __device__ static Raw load(const uint8_t* block, int unit) {
    return {load_16(block), load_16(block + offsetof(Block, qh) + 16 * (unit & 1)),
            load_16(block + offsetof(Block, qs) + 16 * unit)};
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 2;
  __device__ static int piece_offset(int unit, int piece) { return DecodeQ4_KWide::piece_offset(unit, piece); }
  template <int piece>
  __device__ static void quants(const Raw& raw, int unit, float* q) {
    constexpr bool kHigh = piece >= 2;
    const uint32_t bit = static_cast<uint32_t>(2 * (unit >> 1) + (kHigh ? 1 : 0));  // the sub-block
    constexpr int kWord = 2 * (piece % 2);
    const uint32_t fifth0 = ((word_of<kWord>(raw.qh) >> bit) & 0x01010101u) << 4;
    const uint32_t fifth1 = ((word_of<kWord + 1>(raw.qh) >> bit) & 0x01010101u) << 4;
    bytes_to_fractions(nibbles(word_of<kWord>(raw.qs), kHigh) | fifth0, q);
    bytes_to_fractions(nibbles(word_of<kWord + 1>(raw.qs), kHigh) | fifth1, q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int unit, int group) {
    return k_wide_unit_scale(raw.header, unit, group);
  }
};

// Q6_K, wide: unit u (0..3), with n = u / 2 and h = u % 2, is the 64 values
// 128n + 32g + 16h + j (g = 0..3, j = 0..15): sub-blocks 8n + 2g + h. Their
// low bits fill the 32 bytes ql[64n + 16h ..] and ql[64n + 32 + 16h ..]
// (g = 0, 1 in the low nibbles, 2, 3 in the high ones), their high bits the
// 16 bytes qh[32n + 16h ..]: every byte loaded is used.
struct DecodeQ6_KWide {
  static constexpr int kUnit = 64;
  using Block = quant::BlockQ6_K;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 ql[2];  // ql[64n + 16h ..], ql[64n + 32 + 16h ..]
    uint4 qh;     // qh[32n + 16h ..]
    float scale[4];  // d * scales[8n + 2g + h], g = 0..3
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int n = unit >> 1, h = unit & 1;
    const uint8_t* ql = block + offsetof(Block, ql) + 64 * n + 16 * h;
    const uint8_t* scales = block + offsetof(Block, scales) + 8 * n + h;
    const float d = widen_half(load_2(block + offsetof(Block, d)));
    Raw raw{{load_16_align2(ql), load_16_align2(ql + 32)},
            load_16_align2(block + offsetof(Block, qh) + 32 * n + 16 * h),
            {}};
#pragma unroll
    for (int g = 0; g < 4; ++g) raw.scale[g] = d * static_cast<float>(static_cast<int8_t>(__ldg(scales + 2 * g)));
    return raw;
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr int kScaleGroups = 4;
  // Piece p: g = p / 2, values j = 8 (p % 2) .. + 7.
  __device__ static int piece_offset(int unit, int piece) {
    return 32 * (piece >> 1) - 48 * (unit & 1) + 8 * (piece & 1);
  }
  template <int piece>
  __device__ static void quants(const Raw& raw, int, float* q) {
    constexpr int kGroup = piece / 2;
    constexpr int kWord = 2 * (piece % 2);
    const uint4& ql = raw.ql[kGroup % 2];
    const uint32_t low0 = nibbles(word_of<kWord>(ql), kGroup >= 2);
    const uint32_t low1 = nibbles(word_of<kWord + 1>(ql), kGroup >= 2);
    bytes_to_fractions(low0 | (((word_of<kWord>(raw.qh) >> (2 * kGroup)) & 0x03030303u) << 4), q);
    bytes_to_fractions(low1 | (((word_of<kWord + 1>(raw.qh) >> (2 * kGroup)) & 0x03030303u) << 4), q + 4);
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int group) {
    return {raw.scale[group], 32.0f * raw.scale[group]};  // (q - 32) * scale
  }
};

// Q3_K, wide: unit u (0..3), with n = u / 2 and h = u % 2, is the 64 values
// 128n + 32g + 16h + j (g = 0..3, j = 0..15): sub-blocks 8n + 2g + h. Their
// low bits are bits 2g of qs[32n + 16h ..], their third bits bits 4n + g of
// hmask[16h ..]: the 16 qs bytes are used whole, the hmask bytes half.
struct DecodeQ3_KWide {
  static constexpr int kUnit = 64;
  using Block = quant::BlockQ3_K;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 qs;
    uint4 hmask;     // shifted right by 4n: bit g is sub-block group g's
    float scale[4];  // d * scale of sub-block 8n + 2g + h, g = 0..3
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int n = unit >> 1, h = unit & 1;
    const uint8_t* scales = block + offsetof(Block, scales);
    Raw raw{load_16_align2(block + offsetof(Block, qs) + 32 * n + 16 * h),
            load_16_align2(block + offsetof(Block, hmask) + 16 * h),
            {}};
    const uint32_t shift = 4u * static_cast<uint32_t>(n);
    raw.hmask = make_uint4(raw.hmask.x >> shift, raw.hmask.y >> shift, raw.hmask.z >> shift, raw.hmask.w >> shift);
    const float d = widen_half(load_2(block + offsetof(Block, d)));
    // quant::q3_k_scale of s = 8n + 2g + h: low nibble n of scales[2g + h],
    // top bits 2 (2n + g / 2) of scales[8 + 2 (g % 2) + h].
    const uint32_t top[2] = {__ldg(scales + 8 + h), __ldg(scales + 10 + h)};
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint32_t low = (__ldg(scales + 2 * g + h) >> shift) & 0xFu;
      const uint32_t high = (top[g & 1] >> (shift + 2u * static_cast<uint32_t>(g >> 1))) & 3u;
      raw.scale[g] = d * static_cast<float>(static_cast<int>(low | (high << 4)) - 32);
    }
    return raw;
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr float kFractionScale = 16.0f;  // q << 4
  static constexpr int kScaleGroups = 4;
  __device__ static int piece_offset(int unit, int piece) { return DecodeQ6_KWide::piece_offset(unit, piece); }
  // Piece p: g = p / 2, values j = 8 (p % 2) .. + 7; q (0..7) at bits 4..6.
  template <int piece>
  __device__ static void quants(const Raw& raw, int, float* q) {
    constexpr int kGroup = piece / 2;
    constexpr int kWord = 2 * (piece % 2);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t qs = k == 0 ? word_of<kWord>(raw.qs) : word_of<kWord + 1>(raw.qs);
      const uint32_t hm = k == 0 ? word_of<kWord>(raw.hmask) : word_of<kWord + 1>(raw.hmask);
      const uint32_t low = move_bits<2 * kGroup, 4>(qs) & 0x30303030u;
      bytes_to_fractions(low | (move_bits<kGroup, 6>(hm) & 0x40404040u), q + 4 * k);
    }
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int group) {
    return {raw.scale[group], 4.0f * raw.scale[group]};  // (q - 4) * scale
  }
};

// Q2_K, wide: unit u (0..3), with n = u / 2 and h = u % 2, is the 64 values
// 128n + 32g + 16h + j (g = 0..3): bits 2g of qs[32n + 16h ..], every bit
// used; sub-blocks 8n + 2g + h, whose scale bytes are scales[8n + h + 2g].
struct DecodeQ2_KWide {
  static constexpr int kUnit = 64;
  using Block = quant::BlockQ2_K;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr int kBlockBytes = sizeof(Block);
  struct Raw {
    uint4 qs;
    float scale[4], offset[4];  // sub-block 8n + 2g + h: d * scale, dmin * min
  };
  __device__ static Raw load(const uint8_t* block, int unit) {
    const int n = unit >> 1, h = unit & 1;
    const uint8_t* qs = block + offsetof(Block, qs) + 32 * n + 16 * h;
    const uint8_t* scales = block + offsetof(Block, scales) + 8 * n;
    Raw raw{make_uint4(load_4(qs), load_4(qs + 4), load_4(qs + 8), load_4(qs + 12)), {}, {}};
    const uint32_t packed[2] = {load_4(scales), load_4(scales + 4)};
    const uint32_t d_dmin = load_4(block + offsetof(Block, d));
    const float d = widen_half(d_dmin), dmin = widen_half(d_dmin >> 16);
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint32_t byte = (packed[g >> 1] >> (8 * (2 * (g & 1) + h))) & 0xFFu;
      raw.scale[g] = d * small_uint_to_float(byte & 0xFu);
      raw.offset[g] = dmin * small_uint_to_float(byte >> 4);
    }
    return raw;
  }
  static constexpr bool kFactored = true;
  static constexpr bool kFractionQuants = true;
  static constexpr float kFractionScale = 8.0f;  // q << 5
  static constexpr int kScaleGroups = 4;
  __device__ static int piece_offset(int unit, int piece) { return DecodeQ6_KWide::piece_offset(unit, piece); }
  // Piece p: g = p / 2, values j = 8 (p % 2) .. + 7; q (0..3) at bits 5..6.
  template <int piece>
  __device__ static void quants(const Raw& raw, int, float* q) {
    constexpr int kGroup = piece / 2;
    constexpr int kWord = 2 * (piece % 2);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t qs = k == 0 ? word_of<kWord>(raw.qs) : word_of<kWord + 1>(raw.qs);
      bytes_to_fractions(move_bits<2 * kGroup, 5>(qs) & 0x60606060u, q + 4 * k);
    }
  }
  __device__ static float2 unit_scale(const Raw& raw, int, int group) { return {raw.scale[group], raw.offset[group]}; }
};

// ---------------------------------------------------------------------------
// The optional parts of the decoder interface, with their defaults (used by
// the kernels and by tests/backends/cuda_on_host).

// Decoders that keep a table in shared memory (fill_table before use).
template <class Dec, class = void>
struct HasSharedTable : std::false_type {};
template <class Dec>
struct HasSharedTable<Dec, std::enable_if_t<Dec::kSharedTable>> : std::true_type {};

// Where value 8 piece of a unit lies, relative to the unit's first column.
template <class Dec, class = void>
struct HasPieceOffset : std::false_type {};
template <class Dec>
struct HasPieceOffset<Dec, std::void_t<decltype(Dec::piece_offset(0, 0))>> : std::true_type {};
template <class Dec>
__device__ __forceinline__ int piece_offset(int unit, int piece) {
  if constexpr (HasPieceOffset<Dec>::value) return Dec::piece_offset(unit, piece);
  return 8 * piece;
}

// The 1 / 256 of the fraction quants, or the decoder's kFractionScale.
template <class Dec, class = void>
struct FractionScale {
  static constexpr float value = 256.0f;
};
template <class Dec>
struct FractionScale<Dec, std::void_t<decltype(Dec::kFractionScale)>> {
  static constexpr float value = Dec::kFractionScale;
};

}  // namespace m40::cuda::mm

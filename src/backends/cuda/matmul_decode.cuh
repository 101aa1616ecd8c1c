// Weight decoders for the matmul kernels: per storage type, how one thread
// loads a "unit" of a row (8 or 16 consecutive values; for the wide decoders
// at the end, 16 to 64 scattered ones) with the widest loads
// the layout allows, and turns it into FP32 registers, 8 values (a "piece") at
// a time. The matvec kernel gives each lane units along a row; the gemm kernel
// decodes 16 consecutive values per thread into its shared-memory tile.
// This file: the decoder interface and the decoders of every type;
// matmul_decode_bits.cuh: the loads and bit tricks they are made of;
// matmul_decode_wide.cuh: the wide decoders of one and two tokens.
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

#include "backends/cuda/matmul_decode_bits.cuh"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::cuda::mm {

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

}  // namespace m40::cuda::mm

#include "backends/cuda/matmul_decode_wide.cuh"

namespace m40::cuda::mm {

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

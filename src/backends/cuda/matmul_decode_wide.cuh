// The wide decoders (matmul_decode.cuh has the decoder interface): units
// of 16 to 64 scattered values that use every byte a lane loads, for the
// matvec kernel at one and two tokens (matmul_matvec.cu). Included by
// matmul_decode.cuh after the decoders they build on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/matmul_decode_bits.cuh"
#include "quant/blocks.h"

namespace m40::cuda::mm {

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

}  // namespace m40::cuda::mm

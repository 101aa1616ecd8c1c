// The quantization block layouts of the GGUF/ggml formats and how each block
// turns back into floats. This is the one definition, included by the CPU code
// (g++, C++20) and the CUDA kernels (nvcc, C++17, down to CUDA 11.8 / sm_52),
// so both sides decode every block identically, bit for bit.
//
// Per format:
//   struct BlockXxx                          the bytes as stored in the file
//   dequantize_block(const BlockXxx&, y)     writes all kValues floats
//   dequantize_value(const BlockXxx&, i)     value i alone (one element per
//                                            GPU thread); equal to y[i]
//
// Halves are kept as raw uint16_t bits (see fp16.h): no __half type, no fp16
// arithmetic, which sm_52 lacks.
#pragma once

#include <cstdint>

#include "gguf/tensor_type.h"
#include "quant/fp16.h"
#include "quant/host_device.h"

namespace m40::quant {

// A product that the compiler may not fuse into a following add or subtract.
// nvcc turns a*b - c into one fma by default, which rounds once instead of
// twice; the host compiler does not (no -ffp-contract in strict C++ mode).
// Every product that feeds an addition in the formulas below goes through
// here, so the CPU and the GPU round alike.
M40_HOST_DEVICE inline float mul_unfused(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

M40_HOST_DEVICE inline float to_float(int value) { return static_cast<float>(value); }

// Nearest integer, ties to even, for |x| < 2^22: adding 1.5 * 2^23 pushes the
// fraction out of the mantissa. Unlike std::nearbyint it vectorizes with the
// baseline x86-64 instruction set, and nvcc cannot fold the two adds.
M40_HOST_DEVICE inline int round_to_int(float x) { return static_cast<int>((x + 12582912.0f) - 12582912.0f); }

// 1/x, IEEE-rounded on both sides (nvcc's default -prec-div), or 0 for 0.
M40_HOST_DEVICE inline float reciprocal_or_zero(float x) { return x != 0.0f ? 1.0f / x : 0.0f; }

// The fp16 bits of a scale, kept finite: the largest half instead of inf.
M40_HOST_DEVICE inline uint16_t finite_half(float scale) {
  const uint16_t half = float_to_half(scale);
  return (half & 0x7fffu) >= 0x7c00u ? static_cast<uint16_t>((half & 0x8000u) | 0x7bffu) : half;
}

// ---------------------------------------------------------------------------
// The 32-value formats: one fp16 scale (and for the _1 formats an fp16 offset)
// per 32 values. The 4-bit ones keep value j in the low nibble of qs[j] and
// value j+16 in the high nibble.

struct BlockQ4_0 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q4_0;
  static constexpr int kValues = 32;
  uint16_t d;      // scale
  uint8_t qs[16];  // 4-bit quants, stored with +8
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");

struct BlockQ4_1 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q4_1;
  static constexpr int kValues = 32;
  uint16_t d;      // scale
  uint16_t m;      // offset (the block minimum)
  uint8_t qs[16];  // 4-bit quants, unsigned
};
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");

struct BlockQ5_0 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q5_0;
  static constexpr int kValues = 32;
  uint16_t d;      // scale
  uint8_t qh[4];   // fifth bits, little-endian: bit i belongs to value i
  uint8_t qs[16];  // low 4 bits; the 5-bit quant is stored with +16
};
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes");

struct BlockQ5_1 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q5_1;
  static constexpr int kValues = 32;
  uint16_t d;      // scale
  uint16_t m;      // offset
  uint8_t qh[4];   // fifth bits as in Q5_0
  uint8_t qs[16];  // low 4 bits, unsigned
};
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block is 24 bytes");

struct BlockQ8_0 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q8_0;
  static constexpr int kValues = 32;
  uint16_t d;     // scale
  int8_t qs[32];  // quants
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");

// IQ4_NL: 4-bit indices into a fixed non-linear table of 16 levels.
struct BlockIQ4_NL {
  static constexpr gguf::TensorType kType = gguf::TensorType::IQ4_NL;
  static constexpr int kValues = 32;
  uint16_t d;      // scale
  uint8_t qs[16];  // table indices, nibbles as in Q4_0
};
static_assert(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block is 18 bytes");

// ---------------------------------------------------------------------------
// The 256-value super-block formats: an fp16 super-scale (and super-offset)
// and small per-sub-block integer scales.

// 16 sub-blocks of 16 values. Value i (i = 128n + 32j + l) is bits 2j..2j+1
// of qs[32n + l]; its sub-block is i / 16.
struct BlockQ2_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q2_K;
  static constexpr int kValues = 256;
  uint8_t scales[16];  // low nibble: scale, high nibble: offset, per sub-block
  uint8_t qs[64];      // 2-bit quants
  uint16_t d;          // super-scale of the scales
  uint16_t dmin;       // super-scale of the offsets
};
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block is 84 bytes");

// As Q2_K plus a third bit: value i = 128n + 32j + l has its high bit in bit
// 4n + j of hmask[l]; a clear high bit means "subtract 4". 16 signed 6-bit
// scales (stored +32) are packed into 12 bytes: low nibbles in bytes 0..7
// (sub-blocks 0..7 low, 8..15 high nibble), top two bits in bytes 8..11.
struct BlockQ3_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q3_K;
  static constexpr int kValues = 256;
  uint8_t hmask[32];   // high bits of the quants
  uint8_t qs[64];      // low 2 bits of the quants
  uint8_t scales[12];  // 16 packed 6-bit scales
  uint16_t d;          // super-scale
};
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block is 110 bytes");

// 8 sub-blocks of 32 values, each with a 6-bit scale and a 6-bit offset packed
// into 12 bytes (see k_quant_scale_min). Value i = 64c + l is the low nibble of
// qs[32c + l] for l < 32 and the high nibble of qs[32c + l - 32] otherwise.
struct BlockQ4_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q4_K;
  static constexpr int kValues = 256;
  uint16_t d;          // super-scale of the scales
  uint16_t dmin;       // super-scale of the offsets
  uint8_t scales[12];  // 8 packed 6-bit scales and 8 packed 6-bit offsets
  uint8_t qs[128];     // 4-bit quants
};
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes");

// As Q4_K plus a fifth bit: bit s of qh[i % 32], s = i / 32 the sub-block.
struct BlockQ5_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q5_K;
  static constexpr int kValues = 256;
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];   // fifth bits
  uint8_t qs[128];  // low 4 bits
};
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes");

// 16 sub-blocks of 16 values with signed 8-bit scales; 6-bit quants stored +32.
// Value i = 128n + 32g + l: low 4 bits in ql[64n + l + 32(g & 1)] (low nibble
// for g < 2, high nibble otherwise), top 2 bits at bits 2g..2g+1 of
// qh[32n + l]; its sub-block is i / 16.
struct BlockQ6_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q6_K;
  static constexpr int kValues = 256;
  uint8_t ql[128];    // low 4 bits of the quants
  uint8_t qh[64];     // high 2 bits of the quants
  int8_t scales[16];  // per sub-block scales
  uint16_t d;         // super-scale
};
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes");

// IQ4_NL's table with a 6-bit scale (stored +32) per sub-block of 32 values:
// low 4 bits from scales_l (nibble s % 2 of byte s / 2), top 2 bits at bits
// 2s..2s+1 of scales_h. Nibbles within a sub-block as in IQ4_NL.
struct BlockIQ4_XS {
  static constexpr gguf::TensorType kType = gguf::TensorType::IQ4_XS;
  static constexpr int kValues = 256;
  uint16_t d;           // super-scale
  uint16_t scales_h;    // top 2 bits of the 8 sub-block scales
  uint8_t scales_l[4];  // low 4 bits of the 8 sub-block scales
  uint8_t qs[128];      // table indices
};
static_assert(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block is 136 bytes");

// ---------------------------------------------------------------------------
// Shared pieces of the formats.

// The 16 levels of IQ4_NL and IQ4_XS.
inline constexpr int8_t kIQ4NonLinearLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                   1,    13,   25,  38,  53,  69,  89,  113};
// The same table as two little-endian 64-bit words, for device code: a
// register select instead of a memory load, and no table object that device
// code could not see.
inline constexpr uint64_t kIQ4LevelsLow = 0xF6EADDCFBFAD9881ull;
inline constexpr uint64_t kIQ4LevelsHigh = 0x7159453526190D01ull;

constexpr bool iq4_packed_levels_match_table() {
  for (int i = 0; i < 16; ++i) {
    const uint64_t word = i < 8 ? kIQ4LevelsLow : kIQ4LevelsHigh;
    if (static_cast<int8_t>(static_cast<uint8_t>(word >> (8 * (i & 7)))) != kIQ4NonLinearLevels[i]) {
      return false;
    }
  }
  return true;
}
static_assert(iq4_packed_levels_match_table(), "packed IQ4 levels equal the table");

M40_HOST_DEVICE inline int iq4_level(int index) {
#ifdef __CUDA_ARCH__
  const uint64_t word = index < 8 ? kIQ4LevelsLow : kIQ4LevelsHigh;
  return static_cast<int8_t>(static_cast<uint8_t>(word >> (8 * (index & 7))));
#else
  return kIQ4NonLinearLevels[index];
#endif
}

// Nibble i of a 32-value group stored as in Q4_0: low nibbles first.
M40_HOST_DEVICE inline int nibble_of_32(const uint8_t* qs, int i) {
  return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4;
}

// The fifth-bit word of Q5_0/Q5_1, read bytewise (it is only 2-byte aligned).
M40_HOST_DEVICE inline uint32_t high_bits_word(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

struct ScaleMin {
  int scale;
  int min;
};

// The 6-bit scale and offset of sub-block s (0..7) of Q4_K and Q5_K:
// sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scale) and 4..7 (offset);
// sub-blocks 4..7 keep their low 4 bits in the nibbles of bytes 8..11 and
// their top 2 bits in the top bits of bytes 0..3 (scale) and 4..7 (offset).
M40_HOST_DEVICE inline ScaleMin k_quant_scale_min(const uint8_t* scales, int s) {
  if (s < 4) return {scales[s] & 63, scales[s + 4] & 63};
  return {(scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4),
          (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4)};
}

// The signed scale (-32..31) of sub-block s (0..15) of Q3_K.
M40_HOST_DEVICE inline int q3_k_scale(const uint8_t* scales, int s) {
  const int low = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
  const int high = (scales[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
  return (low | (high << 4)) - 32;
}

// The signed scale (-32..31) of sub-block s (0..7) of IQ4_XS.
M40_HOST_DEVICE inline int iq4_xs_scale(const BlockIQ4_XS& b, int s) {
  const int low = (b.scales_l[s >> 1] >> (4 * (s & 1))) & 0xF;
  const int high = (b.scales_h >> (2 * s)) & 3;
  return (low | (high << 4)) - 32;
}

// ---------------------------------------------------------------------------
// Q4_0: (q - 8) * d

M40_HOST_DEVICE inline float dequantize_value(const BlockQ4_0& b, int i) {
  return half_to_float(b.d) * to_float(nibble_of_32(b.qs, i) - 8);
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ4_0& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * to_float((b.qs[j] & 0xF) - 8);
    y[j + 16] = d * to_float((b.qs[j] >> 4) - 8);
  }
}

// Q4_1: q * d + m

M40_HOST_DEVICE inline float dequantize_value(const BlockQ4_1& b, int i) {
  return mul_unfused(half_to_float(b.d), to_float(nibble_of_32(b.qs, i))) + half_to_float(b.m);
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ4_1& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  const float m = half_to_float(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = mul_unfused(d, to_float(b.qs[j] & 0xF)) + m;
    y[j + 16] = mul_unfused(d, to_float(b.qs[j] >> 4)) + m;
  }
}

// Q5_0: (q - 16) * d, q = nibble | fifth bit << 4

M40_HOST_DEVICE inline int q5_quant(const uint8_t* qh, const uint8_t* qs, int i) {
  return nibble_of_32(qs, i) | static_cast<int>(((high_bits_word(qh) >> i) & 1u) << 4);
}

M40_HOST_DEVICE inline float dequantize_value(const BlockQ5_0& b, int i) {
  return half_to_float(b.d) * to_float(q5_quant(b.qh, b.qs, i) - 16);
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ5_0& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  const uint32_t high = high_bits_word(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int low_fifth = static_cast<int>(((high >> j) & 1u) << 4);
    const int high_fifth = static_cast<int>(((high >> (j + 16)) & 1u) << 4);
    y[j] = d * to_float(((b.qs[j] & 0xF) | low_fifth) - 16);
    y[j + 16] = d * to_float(((b.qs[j] >> 4) | high_fifth) - 16);
  }
}

// Q5_1: q * d + m

M40_HOST_DEVICE inline float dequantize_value(const BlockQ5_1& b, int i) {
  return mul_unfused(half_to_float(b.d), to_float(q5_quant(b.qh, b.qs, i))) + half_to_float(b.m);
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ5_1& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  const float m = half_to_float(b.m);
  const uint32_t high = high_bits_word(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int low_fifth = static_cast<int>(((high >> j) & 1u) << 4);
    const int high_fifth = static_cast<int>(((high >> (j + 16)) & 1u) << 4);
    y[j] = mul_unfused(d, to_float((b.qs[j] & 0xF) | low_fifth)) + m;
    y[j + 16] = mul_unfused(d, to_float((b.qs[j] >> 4) | high_fifth)) + m;
  }
}

// Q8_0: q * d

M40_HOST_DEVICE inline float dequantize_value(const BlockQ8_0& b, int i) {
  return half_to_float(b.d) * to_float(b.qs[i]);
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ8_0& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < 32; ++j) y[j] = d * to_float(b.qs[j]);
}

// The one Q8_0 quantizer, for the host (quantize_row, the CPU KV cache) and
// the device (the CUDA KV cache's append), bit for bit alike: d = amax / 127
// as fp16, q = round(x / d) against the stored d, clamped to -127..127. The
// product goes through mul_unfused so nvcc cannot fuse it into the rounding
// add.
M40_HOST_DEVICE inline void quantize_block_q8_0(const float* M40_RESTRICT x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = x[j] < 0.0f ? -x[j] : x[j];
    amax = a > amax ? a : amax;
  }
  b.d = finite_half(amax / 127.0f);
  const float inverse = reciprocal_or_zero(half_to_float(b.d));
  for (int j = 0; j < 32; ++j) {
    const int q = round_to_int(mul_unfused(x[j], inverse));
    b.qs[j] = static_cast<int8_t>(q < -127 ? -127 : q > 127 ? 127 : q);
  }
}

// IQ4_NL: level[q] * d

M40_HOST_DEVICE inline float dequantize_value(const BlockIQ4_NL& b, int i) {
  return half_to_float(b.d) * to_float(iq4_level(nibble_of_32(b.qs, i)));
}

M40_HOST_DEVICE inline void dequantize_block(const BlockIQ4_NL& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * to_float(iq4_level(b.qs[j] & 0xF));
    y[j + 16] = d * to_float(iq4_level(b.qs[j] >> 4));
  }
}

// Q2_K: (d * scale) * q - dmin * offset, scale and offset 4 bits each

M40_HOST_DEVICE inline float dequantize_value(const BlockQ2_K& b, int i) {
  const int sub = i >> 4;
  const int shift = 2 * ((i >> 5) & 3);
  const int q = (b.qs[32 * (i >> 7) + (i & 31)] >> shift) & 3;
  const float scale = half_to_float(b.d) * to_float(b.scales[sub] & 0xF);
  const float offset = mul_unfused(half_to_float(b.dmin), to_float(b.scales[sub] >> 4));
  return mul_unfused(scale, to_float(q)) - offset;
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ2_K& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  for (int sub = 0; sub < 16; ++sub) {
    const float scale = d * to_float(b.scales[sub] & 0xF);
    const float offset = mul_unfused(dmin, to_float(b.scales[sub] >> 4));
    const uint8_t* qs = b.qs + 32 * (sub >> 3) + 16 * (sub & 1);
    const int shift = 2 * ((sub >> 1) & 3);
    for (int l = 0; l < 16; ++l) {
      y[16 * sub + l] = mul_unfused(scale, to_float((qs[l] >> shift) & 3)) - offset;
    }
  }
}

// Q3_K: (d * scale) * (q - 4 * !high_bit)

M40_HOST_DEVICE inline float dequantize_value(const BlockQ3_K& b, int i) {
  const int half = i >> 7;
  const int pair = (i >> 5) & 3;
  const int l = i & 31;
  const int low = (b.qs[32 * half + l] >> (2 * pair)) & 3;
  const int high_bit = (b.hmask[l] >> (4 * half + pair)) & 1;
  const float scale = half_to_float(b.d) * to_float(q3_k_scale(b.scales, i >> 4));
  return scale * to_float(low - (high_bit != 0 ? 0 : 4));
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ3_K& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  for (int sub = 0; sub < 16; ++sub) {
    const float scale = d * to_float(q3_k_scale(b.scales, sub));
    const int half = sub >> 3;
    const int pair = (sub >> 1) & 3;
    const int first = 16 * (sub & 1);  // l of the sub-block's first value
    const uint8_t* qs = b.qs + 32 * half + first;
    const uint8_t* hmask = b.hmask + first;
    const int low_shift = 2 * pair;
    const int high_shift = 4 * half + pair;
    for (int l = 0; l < 16; ++l) {
      const int low = (qs[l] >> low_shift) & 3;
      const int high_bit = (hmask[l] >> high_shift) & 1;
      y[16 * sub + l] = scale * to_float(low - (high_bit != 0 ? 0 : 4));
    }
  }
}

// Q4_K: (d * scale) * q - dmin * offset, scale and offset 6 bits each

M40_HOST_DEVICE inline float dequantize_value(const BlockQ4_K& b, int i) {
  const ScaleMin sm = k_quant_scale_min(b.scales, i >> 5);
  const int l = i & 31;
  const uint8_t packed = b.qs[32 * (i >> 6) + l];
  const int q = (i & 32) != 0 ? packed >> 4 : packed & 0xF;
  const float scale = half_to_float(b.d) * to_float(sm.scale);
  const float offset = mul_unfused(half_to_float(b.dmin), to_float(sm.min));
  return mul_unfused(scale, to_float(q)) - offset;
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ4_K& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  for (int sub = 0; sub < 8; ++sub) {
    const ScaleMin sm = k_quant_scale_min(b.scales, sub);
    const float scale = d * to_float(sm.scale);
    const float offset = mul_unfused(dmin, to_float(sm.min));
    const uint8_t* qs = b.qs + 32 * (sub >> 1);
    const int shift = 4 * (sub & 1);
    for (int l = 0; l < 32; ++l) {
      y[32 * sub + l] = mul_unfused(scale, to_float((qs[l] >> shift) & 0xF)) - offset;
    }
  }
}

// Q5_K: as Q4_K with 5-bit quants

M40_HOST_DEVICE inline float dequantize_value(const BlockQ5_K& b, int i) {
  const int sub = i >> 5;
  const ScaleMin sm = k_quant_scale_min(b.scales, sub);
  const int l = i & 31;
  const uint8_t packed = b.qs[32 * (i >> 6) + l];
  const int low = (i & 32) != 0 ? packed >> 4 : packed & 0xF;
  const int q = low | (((b.qh[l] >> sub) & 1) << 4);
  const float scale = half_to_float(b.d) * to_float(sm.scale);
  const float offset = mul_unfused(half_to_float(b.dmin), to_float(sm.min));
  return mul_unfused(scale, to_float(q)) - offset;
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ5_K& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  for (int sub = 0; sub < 8; ++sub) {
    const ScaleMin sm = k_quant_scale_min(b.scales, sub);
    const float scale = d * to_float(sm.scale);
    const float offset = mul_unfused(dmin, to_float(sm.min));
    const uint8_t* qs = b.qs + 32 * (sub >> 1);
    const int shift = 4 * (sub & 1);
    for (int l = 0; l < 32; ++l) {
      const int q = ((qs[l] >> shift) & 0xF) | (((b.qh[l] >> sub) & 1) << 4);
      y[32 * sub + l] = mul_unfused(scale, to_float(q)) - offset;
    }
  }
}

// Q6_K: (d * scale) * (q - 32)

M40_HOST_DEVICE inline float dequantize_value(const BlockQ6_K& b, int i) {
  const int half = i >> 7;
  const int group = (i >> 5) & 3;
  const int l = i & 31;
  const int low = (b.ql[64 * half + 32 * (group & 1) + l] >> (4 * (group >> 1))) & 0xF;
  const int high = (b.qh[32 * half + l] >> (2 * group)) & 3;
  const float scale = half_to_float(b.d) * to_float(b.scales[i >> 4]);
  return scale * to_float((low | (high << 4)) - 32);
}

M40_HOST_DEVICE inline void dequantize_block(const BlockQ6_K& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  for (int sub = 0; sub < 16; ++sub) {
    const float scale = d * to_float(b.scales[sub]);
    const int half = sub >> 3;
    const int group = (sub >> 1) & 3;
    const int first = 16 * (sub & 1);  // l of the sub-block's first value
    const uint8_t* ql = b.ql + 64 * half + 32 * (group & 1) + first;
    const uint8_t* qh = b.qh + 32 * half + first;
    const int low_shift = 4 * (group >> 1);
    const int high_shift = 2 * group;
    for (int l = 0; l < 16; ++l) {
      const int q = ((ql[l] >> low_shift) & 0xF) | (((qh[l] >> high_shift) & 3) << 4);
      y[16 * sub + l] = scale * to_float(q - 32);
    }
  }
}

// IQ4_XS: (d * scale) * level[q]

M40_HOST_DEVICE inline float dequantize_value(const BlockIQ4_XS& b, int i) {
  const int sub = i >> 5;
  const float scale = half_to_float(b.d) * to_float(iq4_xs_scale(b, sub));
  return scale * to_float(iq4_level(nibble_of_32(b.qs + 16 * sub, i & 31)));
}

M40_HOST_DEVICE inline void dequantize_block(const BlockIQ4_XS& b, float* M40_RESTRICT y) {
  const float d = half_to_float(b.d);
  for (int sub = 0; sub < 8; ++sub) {
    const float scale = d * to_float(iq4_xs_scale(b, sub));
    const uint8_t* qs = b.qs + 16 * sub;
    for (int j = 0; j < 16; ++j) {
      y[32 * sub + j] = scale * to_float(iq4_level(qs[j] & 0xF));
      y[32 * sub + j + 16] = scale * to_float(iq4_level(qs[j] >> 4));
    }
  }
}

}  // namespace m40::quant

#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::quant {

namespace {

// Nearest integer, ties to even, for |x| < 2^22: adding 1.5 * 2^23 pushes the
// fraction out of the mantissa. Unlike std::nearbyint it vectorizes with the
// baseline x86-64 instruction set.
inline int round_to_int(float x) { return static_cast<int>((x + 12582912.0f) - 12582912.0f); }

inline int clamp_int(int value, int low, int high) { return std::min(std::max(value, low), high); }

inline float reciprocal_or_zero(float x) { return x != 0.0f ? 1.0f / x : 0.0f; }

// The fp16 bits of a scale, kept finite: the largest half instead of inf.
inline uint16_t finite_half(float scale) {
  const uint16_t half = float_to_half(scale);
  return (half & 0x7fffu) >= 0x7c00u ? static_cast<uint16_t>((half & 0x8000u) | 0x7bffu) : half;
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

// --- 32-value formats

void quantize_block(const float* M40_RESTRICT x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  b.d = finite_half(amax / 127.0f);
  // Quantize against the stored (rounded) scale: that is what dequantizes.
  const float inverse = reciprocal_or_zero(half_to_float(b.d));
  for (int j = 0; j < 32; ++j) {
    b.qs[j] = static_cast<int8_t>(clamp_int(round_to_int(x[j] * inverse), -127, 127));
  }
}

// The extreme value maps to -8 exactly; the other sign reaches +7 and clamps.
void quantize_block(const float* M40_RESTRICT x, BlockQ4_0& b) {
  b.d = finite_half(signed_extreme(x, 32) / -8.0f);
  const float inverse = reciprocal_or_zero(half_to_float(b.d));
  for (int j = 0; j < 16; ++j) {
    const int low = clamp_int(round_to_int(x[j] * inverse) + 8, 0, 15);
    const int high = clamp_int(round_to_int(x[j + 16] * inverse) + 8, 0, 15);
    b.qs[j] = static_cast<uint8_t>(low | (high << 4));
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

template <class Block>
void quantize_blocks(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<Block*>(dst);
  const int64_t count = n / Block::kValues;
  for (int64_t b = 0; b < count; ++b) quantize_block(src + b * Block::kValues, blocks[b]);
}

std::string type_name(gguf::TensorType type) {
  if (const auto traits = gguf::find_tensor_type(static_cast<uint32_t>(type))) {
    return std::string(traits->name);
  }
  return "type id " + std::to_string(static_cast<uint32_t>(type));
}

template <class Block>
void quantize_whole_blocks(gguf::TensorType type, const float* src, void* dst, int64_t n) {
  if (n % Block::kValues != 0) {
    throw Error("cannot quantize " + std::to_string(n) + " values to " + type_name(type) +
                ": not a multiple of its block size " + std::to_string(Block::kValues));
  }
  quantize_blocks<Block>(src, dst, n);
}

}  // namespace

bool can_quantize(gguf::TensorType type) {
  using gguf::TensorType;
  switch (type) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16:
    case TensorType::Q8_0:
    case TensorType::Q4_0:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
      return true;
    default:
      return false;
  }
}

void quantize_row(gguf::TensorType type, const float* src, void* dst, int64_t n) {
  using gguf::TensorType;
  if (n < 0) throw Error("quantize_row: negative value count " + std::to_string(n));
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::F16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(src[i]);
      return;
    }
    case TensorType::BF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(src[i]);
      return;
    }
    case TensorType::Q8_0: return quantize_whole_blocks<BlockQ8_0>(type, src, dst, n);
    case TensorType::Q4_0: return quantize_whole_blocks<BlockQ4_0>(type, src, dst, n);
    case TensorType::Q4_K: return quantize_whole_blocks<BlockQ4_K>(type, src, dst, n);
    case TensorType::Q5_K: return quantize_whole_blocks<BlockQ5_K>(type, src, dst, n);
    case TensorType::Q6_K: return quantize_whole_blocks<BlockQ6_K>(type, src, dst, n);
    default:
      throw Error("cannot quantize to tensor type " + type_name(type) +
                  ": m40-llm writes F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K");
  }
}

}  // namespace m40::quant

#include "quant/dequantize.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "quant/block_types.h"
#include "quant/fp16.h"

namespace m40::quant {

namespace {

template <class Block>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const Block*>(src);
  const int64_t count = n / Block::kValues;
  for (int64_t b = 0; b < count; ++b) dequantize_block(blocks[b], dst + b * Block::kValues);
}

void halves_to_floats(const uint16_t* M40_RESTRICT src, float* M40_RESTRICT dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void bf16s_to_floats(const uint16_t* M40_RESTRICT src, float* M40_RESTRICT dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

std::string type_name(gguf::TensorType type) {
  if (const auto traits = gguf::find_tensor_type(static_cast<uint32_t>(type))) {
    return std::string(traits->name);
  }
  return "type id " + std::to_string(static_cast<uint32_t>(type));
}

}  // namespace

bool can_dequantize(gguf::TensorType type) {
  using gguf::TensorType;
  if (type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16) return true;
  return visit_block_type(type, [](auto) {});
}

void dequantize_row(gguf::TensorType type, const void* src, float* dst, int64_t n) {
  using gguf::TensorType;
  if (n < 0) throw Error("dequantize_row: negative value count " + std::to_string(n));
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::F16:
      halves_to_floats(static_cast<const uint16_t*>(src), dst, n);
      return;
    case TensorType::BF16:
      bf16s_to_floats(static_cast<const uint16_t*>(src), dst, n);
      return;
    default:
      break;
  }
  const bool known = visit_block_type(type, [&](auto tag) {
    using Block = typename decltype(tag)::type;
    if (n % Block::kValues != 0) {
      throw Error("cannot dequantize " + std::to_string(n) + " values of " + type_name(type) +
                  ": not a multiple of its block size " + std::to_string(Block::kValues));
    }
    dequantize_blocks<Block>(src, dst, n);
  });
  if (!known) {
    throw Error("cannot dequantize tensor type " + type_name(type) +
                ": m40-llm supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                "Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS");
  }
}

}  // namespace m40::quant

#include "quant/quantize.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "quant/block_types.h"
#include "quant/fp16.h"
#include "quant/quantize_block.h"

namespace m40::quant {

namespace {

template <class Block>
void quantize_blocks(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<Block*>(dst);
  const int64_t count = n / Block::kValues;
  for (int64_t b = 0; b < count; ++b) detail::quantize_block(src + b * Block::kValues, blocks[b]);
}

std::string type_name(gguf::TensorType type) {
  if (const auto traits = gguf::find_tensor_type(static_cast<uint32_t>(type))) {
    return std::string(traits->name);
  }
  return "type id " + std::to_string(static_cast<uint32_t>(type));
}

}  // namespace

bool can_quantize(gguf::TensorType type) {
  using gguf::TensorType;
  if (type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16) return true;
  return visit_block_type(type, [](auto) {});
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
    default:
      break;
  }
  const bool known = visit_block_type(type, [&](auto tag) {
    using Block = typename decltype(tag)::type;
    if (n % Block::kValues != 0) {
      throw Error("cannot quantize " + std::to_string(n) + " values to " + type_name(type) +
                  ": not a multiple of its block size " + std::to_string(Block::kValues));
    }
    quantize_blocks<Block>(src, dst, n);
  });
  if (!known) {
    throw Error("cannot quantize to tensor type " + type_name(type) +
                ": m40-llm writes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                "IQ4_NL and IQ4_XS");
  }
}

}  // namespace m40::quant

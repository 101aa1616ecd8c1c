// Rows of random but valid quantized blocks: random quant bits and scale
// bytes, with every fp16 scale field set to a finite value (including some
// subnormal halves), so that every dequantized value is finite. Shared by the
// CPU tests and the GPU-vs-CPU tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gguf/tensor_type.h"
#include "quant/block_types.h"
#include "quant/fp16.h"

namespace m40::test {

inline uint16_t random_finite_half(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 19);
  if (pick(rng) == 0) {  // a subnormal half, either sign
    std::uniform_int_distribution<int> bits(1, 0x3ff);
    return static_cast<uint16_t>(bits(rng) | (pick(rng) < 10 ? 0x8000 : 0));
  }
  std::uniform_real_distribution<float> magnitude(1e-3f, 2.0f);
  const float value = pick(rng) < 10 ? magnitude(rng) : -magnitude(rng);
  return quant::float_to_half(value);
}

// `blocks` blocks of `type` (one of blocks.h's formats), as raw bytes.
inline std::vector<uint8_t> random_valid_blocks(gguf::TensorType type, int64_t blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes;
  quant::visit_block_type(type, [&](auto tag) {
    using Block = typename decltype(tag)::type;
    bytes.resize(static_cast<size_t>(blocks) * sizeof(Block));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : bytes) b = static_cast<uint8_t>(byte(rng));
    for (int64_t i = 0; i < blocks; ++i) {
      Block block;
      std::memcpy(&block, bytes.data() + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
      block.d = random_finite_half(rng);
      if constexpr (requires { block.m; }) block.m = random_finite_half(rng);
      if constexpr (requires { block.dmin; }) block.dmin = random_finite_half(rng);
      std::memcpy(bytes.data() + i * static_cast<int64_t>(sizeof(Block)), &block, sizeof(Block));
    }
  });
  return bytes;
}

// Every type that dequantize_row handles through blocks.h.
inline const std::vector<gguf::TensorType>& block_types() {
  using gguf::TensorType;
  static const std::vector<TensorType> types = {
      TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
      TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K,
      TensorType::Q5_K, TensorType::Q6_K, TensorType::IQ4_NL, TensorType::IQ4_XS};
  return types;
}

}  // namespace m40::test

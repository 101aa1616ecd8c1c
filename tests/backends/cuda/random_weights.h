// Random weight matrices in every GPU weight type (valid blocks, with their
// dequantized values) and random non-zero activations, for the tests that
// compare the GPU products with their CPU twins.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gguf/tensor_type.h"
#include "quant/dequantize.h"
#include "quant/fp16.h"
#include "quant/random_blocks.h"

namespace m40::test {

using gguf::TensorType;

inline std::vector<TensorType> all_types() {
  std::vector<TensorType> types = {TensorType::F32, TensorType::F16, TensorType::BF16};
  for (const TensorType t : block_types()) types.push_back(t);
  return types;
}

struct HostWeight {
  TensorType type = TensorType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized, rows x cols (for the error bound)
};

inline HostWeight random_weight(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  const auto& traits = gguf::tensor_type_traits(type);
  HostWeight w;
  w.type = type;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = static_cast<size_t>(cols / traits.block_size * traits.bytes_per_block);
  if (type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    w.bytes.resize(w.row_bytes * static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = value(rng);
      if (type == TensorType::F32) {
        std::memcpy(w.bytes.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = type == TensorType::F16 ? quant::float_to_half(v) : quant::float_to_bf16(v);
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
      }
    }
  } else {
    w.bytes = random_valid_blocks(type, rows * cols / traits.block_size, seed);
  }
  w.values.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    quant::dequantize_row(type, w.bytes.data() + static_cast<size_t>(r) * w.row_bytes, w.values.data() + r * cols,
                          cols);
  }
  return w;
}

// Uniform in +-[0.25, 1]: never zero, either sign.
inline std::vector<float> random_activations(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> magnitude(0.25f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> x(n);
  for (auto& v : x) v = negative(rng) ? -magnitude(rng) : magnitude(rng);
  return x;
}

}  // namespace m40::test

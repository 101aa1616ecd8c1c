// The ggml tensor type ids that GGUF files use, with the block geometry of
// each: how many values a block holds and how many bytes it takes. Enough to
// list, size and bounds-check any real file, whether or not m40-llm can compute
// with the type. C++17 so that CUDA code may include it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace m40::gguf {

enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3,
  // 4 and 5 were Q4_2 and Q4_3, removed from ggml.
  Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20,
  IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  // 31-33 were the Q4_0_4_4/4_8/8_8 repacks, removed from ggml.
  TQ1_0 = 34, TQ2_0 = 35,
  // 36-38 were the IQ4_NL_4_4/4_8/8_8 repacks, removed from ggml.
  MXFP4 = 39,
};

struct TensorTypeTraits {
  TensorType type;
  std::string_view name;    // as llama.cpp prints it
  uint32_t block_size;      // values per block
  uint32_t bytes_per_block;
};

// Traits of a type id from a file, or nothing for an unknown or removed id.
std::optional<TensorTypeTraits> find_tensor_type(uint32_t id);

// Traits of a known type (throws m40::Error for an id outside the table).
const TensorTypeTraits& tensor_type_traits(TensorType type);

inline std::string_view tensor_type_name(TensorType type) { return tensor_type_traits(type).name; }

// Parses a name such as "q4_k" or "Q8_0" (case-insensitive).
std::optional<TensorType> tensor_type_from_name(std::string_view name);

}  // namespace m40::gguf

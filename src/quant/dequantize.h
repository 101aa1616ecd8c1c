// Tensor data in any supported GGUF storage type -> FP32, on the CPU. The
// reference every GPU dequantization is compared with.
#pragma once

#include <cstdint>

#include "gguf/tensor_type.h"

namespace m40::quant {

// True for F32, F16, BF16 and every block format of blocks.h.
bool can_dequantize(gguf::TensorType type);

// Writes the n values stored at src (in `type`'s layout) to dst as floats.
// n must be a whole number of blocks. Throws m40::Error naming the type for a
// type that cannot be dequantized, or for an n that is not whole blocks.
void dequantize_row(gguf::TensorType type, const void* src, float* dst, int64_t n);

}  // namespace m40::quant

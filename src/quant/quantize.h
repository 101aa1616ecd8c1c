// FP32 -> GGUF storage types, on the CPU: plain round-to-nearest reference
// quantizers with a per-(sub-)block scale (and offset) search. They make valid
// blocks with finite scales and small error; they do not try to match
// llama.cpp's error-minimizing quantizers bit for bit. Fast enough to fill
// multi-gigabyte random models (the gen-model command). The per-format code
// is in quantize_block32.cpp (32-value blocks) and quantize_k.cpp (256-value
// super-blocks).
#pragma once

#include <cstdint>

#include "gguf/tensor_type.h"

namespace m40::quant {

// True for F32, F16, BF16 and every block format of blocks.h: Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS.
bool can_quantize(gguf::TensorType type);

// Stores the n floats of src at dst in `type`'s layout (n / block size blocks).
// Inputs must be finite. Throws m40::Error naming the type for a type that
// cannot be quantized, or for an n that is not a whole number of blocks.
void quantize_row(gguf::TensorType type, const float* src, void* dst, int64_t n);

}  // namespace m40::quant

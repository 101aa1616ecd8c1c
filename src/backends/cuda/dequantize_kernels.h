// Whole tensors in any supported GGUF storage type -> FP32, on the GPU, with
// the same block decoding as the CPU (quant/blocks.h): the results are equal
// bit for bit to quant::dequantize_row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gguf/tensor_type.h"

namespace m40::cuda {

// True for F32, F16, BF16 and every block format of quant/blocks.h.
bool can_dequantize_on_device(gguf::TensorType type);

// Enqueues on `stream` the conversion of the n values at device address d_src
// (in `type`'s layout) to floats at device address d_dst. n must be a whole
// number of blocks. Throws m40::Error naming the type for an unsupported type
// or a partial block, and for a failed launch.
void dequantize_on_device(gguf::TensorType type, const void* d_src, float* d_dst, int64_t n,
                          cudaStream_t stream);

}  // namespace m40::cuda

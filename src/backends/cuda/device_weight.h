// A weight matrix resident on the GPU in its GGUF storage type: `rows`
// output rows of `cols` values each, row r at data + r * row_bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf/tensor_type.h"

namespace m40::cuda {

struct DeviceWeight {
  gguf::TensorType type = gguf::TensorType::F32;
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_bytes = 0;
  const void* data = nullptr;  // device memory
};

}  // namespace m40::cuda

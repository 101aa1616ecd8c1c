// From a tensor type to its block struct in blocks.h, for code that serves
// every block format with one template (the CPU row loops, the CUDA launcher).
#pragma once

#include "gguf/tensor_type.h"
#include "quant/blocks.h"

namespace m40::quant {

template <class Block>
struct BlockTag {
  using type = Block;
};

// Calls visitor(BlockTag<Block>{}) with the block struct of `type` and returns
// true, or returns false when `type` is not one of the formats of blocks.h.
template <class Visitor>
bool visit_block_type(gguf::TensorType type, Visitor&& visitor) {
  using gguf::TensorType;
  switch (type) {
    case TensorType::Q4_0: visitor(BlockTag<BlockQ4_0>{}); return true;
    case TensorType::Q4_1: visitor(BlockTag<BlockQ4_1>{}); return true;
    case TensorType::Q5_0: visitor(BlockTag<BlockQ5_0>{}); return true;
    case TensorType::Q5_1: visitor(BlockTag<BlockQ5_1>{}); return true;
    case TensorType::Q8_0: visitor(BlockTag<BlockQ8_0>{}); return true;
    case TensorType::Q2_K: visitor(BlockTag<BlockQ2_K>{}); return true;
    case TensorType::Q3_K: visitor(BlockTag<BlockQ3_K>{}); return true;
    case TensorType::Q4_K: visitor(BlockTag<BlockQ4_K>{}); return true;
    case TensorType::Q5_K: visitor(BlockTag<BlockQ5_K>{}); return true;
    case TensorType::Q6_K: visitor(BlockTag<BlockQ6_K>{}); return true;
    case TensorType::IQ4_NL: visitor(BlockTag<BlockIQ4_NL>{}); return true;
    case TensorType::IQ4_XS: visitor(BlockTag<BlockIQ4_XS>{}); return true;
    default: return false;
  }
}

}  // namespace m40::quant

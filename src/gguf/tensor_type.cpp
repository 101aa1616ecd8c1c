#include "gguf/tensor_type.h"

#include <cctype>
#include <string>

#include "common/error.h"

namespace m40::gguf {

namespace {

// Block sizes and bytes per block as ggml defines them (ggml-common.h).
constexpr TensorTypeTraits kTraits[] = {
    {TensorType::F32, "F32", 1, 4},
    {TensorType::F16, "F16", 1, 2},
    {TensorType::Q4_0, "Q4_0", 32, 18},
    {TensorType::Q4_1, "Q4_1", 32, 20},
    {TensorType::Q5_0, "Q5_0", 32, 22},
    {TensorType::Q5_1, "Q5_1", 32, 24},
    {TensorType::Q8_0, "Q8_0", 32, 34},
    {TensorType::Q8_1, "Q8_1", 32, 36},
    {TensorType::Q2_K, "Q2_K", 256, 84},
    {TensorType::Q3_K, "Q3_K", 256, 110},
    {TensorType::Q4_K, "Q4_K", 256, 144},
    {TensorType::Q5_K, "Q5_K", 256, 176},
    {TensorType::Q6_K, "Q6_K", 256, 210},
    {TensorType::Q8_K, "Q8_K", 256, 292},
    {TensorType::IQ2_XXS, "IQ2_XXS", 256, 66},
    {TensorType::IQ2_XS, "IQ2_XS", 256, 74},
    {TensorType::IQ3_XXS, "IQ3_XXS", 256, 98},
    {TensorType::IQ1_S, "IQ1_S", 256, 50},
    {TensorType::IQ4_NL, "IQ4_NL", 32, 18},
    {TensorType::IQ3_S, "IQ3_S", 256, 110},
    {TensorType::IQ2_S, "IQ2_S", 256, 82},
    {TensorType::IQ4_XS, "IQ4_XS", 256, 136},
    {TensorType::I8, "I8", 1, 1},
    {TensorType::I16, "I16", 1, 2},
    {TensorType::I32, "I32", 1, 4},
    {TensorType::I64, "I64", 1, 8},
    {TensorType::F64, "F64", 1, 8},
    {TensorType::IQ1_M, "IQ1_M", 256, 56},
    {TensorType::BF16, "BF16", 1, 2},
    {TensorType::TQ1_0, "TQ1_0", 256, 54},
    {TensorType::TQ2_0, "TQ2_0", 256, 66},
    {TensorType::MXFP4, "MXFP4", 32, 17},
};

}  // namespace

std::optional<TensorTypeTraits> find_tensor_type(uint32_t id) {
  for (const auto& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

const TensorTypeTraits& tensor_type_traits(TensorType type) {
  for (const auto& t : kTraits) {
    if (t.type == type) return t;
  }
  throw Error("unknown tensor type id " + std::to_string(static_cast<uint32_t>(type)));
}

std::optional<TensorType> tensor_type_from_name(std::string_view name) {
  std::string upper(name);
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& t : kTraits) {
    if (t.name == upper) return t.type;
  }
  return std::nullopt;
}

}  // namespace m40::gguf

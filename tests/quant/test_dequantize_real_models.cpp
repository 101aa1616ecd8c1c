// The block formats as llama.cpp writes them. The shared synthetic models were
// made by llama-quantize from one F32 file, so each quantized tensor must
// dequantize to within its format's error of the F32 original; a wrong bit
// position or scale packing gives errors of the order of the values
// themselves. This checks blocks.h against real files for F16, Q8_0, Q4_0,
// Q4_K, Q6_K and IQ4_NL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "quant/blocks.h"
#include "quant/dequantize.h"
#include "quant/fp16.h"
#include "test_paths.h"

namespace m40::quant {
namespace {

using gguf::TensorType;

std::vector<float> dequantized(const gguf::File& file, const gguf::TensorInfo& tensor) {
  std::vector<float> values(tensor.element_count);
  dequantize_row(tensor.type, file.tensor_data(tensor).data(), values.data(),
                 static_cast<int64_t>(tensor.element_count));
  return values;
}

double relative_rms_error(const std::vector<float>& want, const std::vector<float>& got) {
  double error_sq = 0, want_sq = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    error_sq += e * e;
    want_sq += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(error_sq / want_sq);
}

gguf::File open_shared(const std::string& relative) {
  return gguf::File::open(test::shared_model(relative).string());
}

bool have_shared(const std::string& relative) { return std::filesystem::exists(test::shared_model(relative)); }

// For each tensor of `quantized_name` whose type is in `rms_bounds`: the
// relative rms error against the same tensor of `original_name` stays in
// bounds. `check` may add per-value checks. Returns tensors checked per type.
template <class Check>
std::map<TensorType, int> compare_files(const std::string& original_name, const std::string& quantized_name,
                                        const std::map<TensorType, double>& rms_bounds, Check check) {
  const gguf::File original = open_shared(original_name);
  const gguf::File quantized = open_shared(quantized_name);
  std::map<TensorType, int> checked;
  for (const auto& tensor : quantized.tensors()) {
    const auto bound = rms_bounds.find(tensor.type);
    if (bound == rms_bounds.end()) continue;
    SCOPED_TRACE(tensor.name + " (" + std::string(gguf::tensor_type_name(tensor.type)) + ")");
    const gguf::TensorInfo& reference = original.tensor(tensor.name);
    EXPECT_EQ(reference.dims, tensor.dims);
    const std::vector<float> want = dequantized(original, reference);
    const std::vector<float> got = dequantized(quantized, tensor);
    const double error = relative_rms_error(want, got);
    EXPECT_LT(error, bound->second);
    EXPECT_GT(error, 0.0);
    check(quantized, tensor, want, got);
    if (++checked[tensor.type] == 1) {
      std::printf("  %s: first %s tensor %s, relative rms error %.5f\n", quantized_name.c_str(),
                  std::string(gguf::tensor_type_name(tensor.type)).c_str(), tensor.name.c_str(), error);
    }
  }
  return checked;
}

constexpr const char* kF32 = "synthetic/tiny-llama-rand-F32.gguf";

TEST(RealModels, F16TensorsAreTheRoundedF32Values) {
  if (!have_shared(kF32)) GTEST_SKIP() << "shared models not found";
  const auto checked = compare_files(
      kF32, "synthetic/tiny-llama-rand-F16.gguf", {{TensorType::F16, 3e-4}},
      [](const gguf::File&, const gguf::TensorInfo&, const std::vector<float>& want, const std::vector<float>& got) {
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(got[i], half_to_float(float_to_half(want[i]))) << i;
        }
      });
  EXPECT_EQ(checked.at(TensorType::F16), 16);
}

TEST(RealModels, Q8_0ValuesAreWithinHalfAStep) {
  if (!have_shared(kF32)) GTEST_SKIP() << "shared models not found";
  const auto checked = compare_files(
      kF32, "synthetic/tiny-llama-rand-Q8_0.gguf", {{TensorType::Q8_0, 0.007}},
      [](const gguf::File& file, const gguf::TensorInfo& tensor, const std::vector<float>& want,
         const std::vector<float>& got) {
        const auto* blocks = reinterpret_cast<const BlockQ8_0*>(file.tensor_data(tensor).data());
        for (size_t i = 0; i < want.size(); ++i) {
          // Half a step, plus the step's own fp16 rounding times up to 127.
          const float step = half_to_float(blocks[i / 32].d);
          ASSERT_LE(std::fabs(got[i] - want[i]), 0.57f * step) << i;
        }
      });
  EXPECT_EQ(checked.at(TensorType::Q8_0), 16);
}

TEST(RealModels, Q4_0ValuesAreWithinOneStep) {
  if (!have_shared(kF32)) GTEST_SKIP() << "shared models not found";
  const auto checked = compare_files(
      kF32, "synthetic/tiny-llama-rand-Q4_0.gguf", {{TensorType::Q4_0, 0.12}, {TensorType::Q6_K, 0.03}},
      [](const gguf::File& file, const gguf::TensorInfo& tensor, const std::vector<float>& want,
         const std::vector<float>& got) {
        if (tensor.type != TensorType::Q4_0) return;
        const auto* blocks = reinterpret_cast<const BlockQ4_0*>(file.tensor_data(tensor).data());
        for (size_t i = 0; i < want.size(); ++i) {
          const float step = std::fabs(half_to_float(blocks[i / 32].d));
          ASSERT_LE(std::fabs(got[i] - want[i]), 1.01f * step) << i;
        }
      });
  EXPECT_EQ(checked.at(TensorType::Q4_0), 15);
  EXPECT_EQ(checked.at(TensorType::Q6_K), 1);
}

TEST(RealModels, Q4_KAndQ6_KAreClose) {
  if (!have_shared(kF32)) GTEST_SKIP() << "shared models not found";
  const auto checked = compare_files(kF32, "synthetic/tiny-llama-rand-Q4_K_M.gguf",
                                     {{TensorType::Q4_K, 0.10}, {TensorType::Q6_K, 0.03}},
                                     [](const auto&, const auto&, const auto&, const auto&) {});
  EXPECT_EQ(checked.at(TensorType::Q4_K), 13);
  EXPECT_EQ(checked.at(TensorType::Q6_K), 3);
}

// The trained TinyStories model in IQ4_NL, against its Q8_0 twin (whose own
// error, ~0.5%, is small beside IQ4_NL's).
TEST(RealModels, IQ4_NLIsCloseToTheQ8_0Twin) {
  if (!have_shared("TinyStories-656K-Q8_0.gguf")) GTEST_SKIP() << "shared models not found";
  const auto checked = compare_files("TinyStories-656K-Q8_0.gguf", "TinyStories-656K-Q2_K.gguf",
                                     {{TensorType::IQ4_NL, 0.15}},
                                     [](const auto&, const auto&, const auto&, const auto&) {});
  EXPECT_EQ(checked.at(TensorType::IQ4_NL), 14);
}

}  // namespace
}  // namespace m40::quant

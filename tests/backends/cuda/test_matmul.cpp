// The matmul kernels (matvec for decode, gemm for prefill, matmul's choice
// between them) against their CPU twin cpu::matmul, for every weight type the
// GPU supports, on random valid weights and random non-zero activations.
//
// The two sides multiply the same dequantized weights (up to the last bit of
// the K-quants' fused scale * q - offset) but add the products in different
// orders, so the results differ by rounding only. For one output that is
// bounded by a few units of FP32 rounding (u = 2^-24) times sqrt(cols) times
// sum_c |w_c x_c|: summation error grows like a random walk over the partial
// sums, which never exceed that sum. A wrong weight, a missed block or a stale
// output shows up far above the bound (a single wrong product is about
// sum |w x| / cols, which for every tested cols is many times the bound);
// outputs are poisoned with NaN first, so an unwritten value fails too. The
// whole output is also held to ||y - ref|| < 1e-5 ||scale||, where scale_i =
// sum_c |w_c x_c| + |residual_i| is the size of the terms output i is summed
// from (||ref|| itself can be tiny where the terms cancel).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/matmul.h"
#include "backends/cuda/prefill_plan.h"
#include "common/error.h"
#include "device_buffer.h"
#include "model/weights.h"
#include "quant/dequantize.h"
#include "quant/fp16.h"
#include "quant/random_blocks.h"
#include "random_weights.h"

namespace m40::cuda {
namespace {

using gguf::TensorType;
using test::DeviceBuffer;

using test::all_types;
using test::HostWeight;
using test::random_activations;
using test::random_weight;

enum class Residual { None, Separate, IntoY };

const char* residual_name(Residual mode) {
  switch (mode) {
    case Residual::None: return "no residual";
    case Residual::Separate: return "residual";
    case Residual::IntoY: return "residual == y";
  }
  return "?";
}

constexpr double kUnitRoundoff = 1.0 / (1 << 24);

// The bound on one product output's rounding (the file comment): value is
// the output, abs_sum its sum of |w x| over cols columns.
double product_bound(double abs_sum, double value, int64_t cols) {
  return 4.0 * kUnitRoundoff * std::sqrt(static_cast<double>(cols)) * abs_sum + 2.0 * kUnitRoundoff * std::fabs(value);
}

// The CPU's view of a host weight, and the GPU's of its copy at `data`.
model::WeightView host_view(const HostWeight& w) {
  model::WeightView view;
  view.type = w.type;
  view.rows = static_cast<uint64_t>(w.rows);
  view.cols = static_cast<uint64_t>(w.cols);
  view.row_bytes = w.row_bytes;
  view.data = w.bytes.data();
  return view;
}
DeviceWeight device_view(const HostWeight& w, const void* data) {
  DeviceWeight dw;
  dw.type = w.type;
  dw.rows = w.rows;
  dw.cols = w.cols;
  dw.row_bytes = w.row_bytes;
  dw.data = data;
  return dw;
}

// Parts: matvec_parts with the rows split into three parts (about 1/2, 1/4
// and the rest), each with its own output array; checked without residual.
enum class Kernel { Matvec, Gemm, Matmul, Parts };

// Runs products on the GPU and compares them with the CPU twin.
class Checker {
 public:
  Checker() { M40_CUDA_CHECK(cudaStreamCreate(&stream_)); }
  ~Checker() { cudaStreamDestroy(stream_); }
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;

  // Runs y = W x (+ residual) on the GPU for each residual mode and expects
  // the CPU's answer. x_offset floats shift x off its 16-byte alignment.
  void expect_matches_cpu(const HostWeight& w, int n_tokens, Kernel kernel, int x_offset = 0) {
    SCOPED_TRACE(std::string(gguf::tensor_type_name(w.type)) + " " + std::to_string(w.rows) + " x " +
                 std::to_string(w.cols) + ", " + std::to_string(n_tokens) + " tokens");
    const int64_t rows = w.rows, cols = w.cols;
    const auto x = random_activations(static_cast<size_t>(n_tokens * cols), static_cast<uint32_t>(7 + n_tokens));
    const auto residual = random_activations(static_cast<size_t>(n_tokens * rows), 99);

    // CPU twin and the per-output bound.
    const model::WeightView view = host_view(w);
    std::vector<float> product(static_cast<size_t>(n_tokens * rows));
    cpu::matmul(view, x.data(), n_tokens, product.data(), pool_);
    std::vector<double> abs_sum(product.size());
    for (int t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::fabs(w.values[r * cols + c] * x[t * cols + c]);
        abs_sum[t * rows + r] = s;
      }
    }

    DeviceBuffer<uint8_t> d_w(w.bytes.size());
    DeviceBuffer<float> d_x(x.size() + 4);
    DeviceBuffer<float> d_y(product.size());
    DeviceBuffer<float> d_residual(residual.size());
    M40_CUDA_CHECK(cudaMemcpy(d_w.get(), w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice));
    float* x_dev = d_x.get() + x_offset;
    M40_CUDA_CHECK(cudaMemcpy(x_dev, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    const DeviceWeight dw = device_view(w, d_w.get());

    const int64_t part_rows[3] = {rows / 2, rows / 4, rows - rows / 2 - rows / 4};
    std::vector<std::unique_ptr<DeviceBuffer<float>>> d_parts;
    if (kernel == Kernel::Parts) {
      for (const int64_t r : part_rows) d_parts.push_back(std::make_unique<DeviceBuffer<float>>(r * n_tokens));
    }

    for (const Residual mode : {Residual::None, Residual::Separate, Residual::IntoY}) {
      if (kernel == Kernel::Parts && mode != Residual::None) continue;
      SCOPED_TRACE(residual_name(mode));
      const float* res = nullptr;
      if (mode == Residual::IntoY) {
        M40_CUDA_CHECK(cudaMemcpy(d_y.get(), residual.data(), residual.size() * sizeof(float),
                                  cudaMemcpyHostToDevice));
        res = d_y.get();
      } else {
        M40_CUDA_CHECK(cudaMemset(d_y.get(), 0xff, d_y.bytes()));  // 0xffffffff is a NaN
        if (mode == Residual::Separate) {
          M40_CUDA_CHECK(cudaMemcpy(d_residual.get(), residual.data(), residual.size() * sizeof(float),
                                    cudaMemcpyHostToDevice));
          res = d_residual.get();
        }
      }
      switch (kernel) {
        case Kernel::Matvec: matvec(dw, x_dev, n_tokens, d_y.get(), res, stream_); break;
        case Kernel::Gemm: gemm(dw, x_dev, n_tokens, d_y.get(), res, stream_); break;
        case Kernel::Matmul: matmul(dw, x_dev, n_tokens, d_y.get(), res, stream_); break;
        case Kernel::Parts: {
          OutputPart parts[3];
          for (int i = 0; i < 3; ++i) {
            M40_CUDA_CHECK(cudaMemset(d_parts[i]->get(), 0xff, d_parts[i]->bytes()));
            parts[i] = {d_parts[i]->get(), part_rows[i]};
          }
          ASSERT_TRUE(matvec_parts(dw, x_dev, n_tokens, parts, 3, stream_));
          break;
        }
      }
      M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
      std::vector<float> y(product.size());
      if (kernel == Kernel::Parts) {  // y[t][r] from part i's [t][r - first row of i]
        int64_t first = 0;
        for (int i = 0; i < 3; ++i) {
          std::vector<float> part(static_cast<size_t>(part_rows[i] * n_tokens));
          M40_CUDA_CHECK(
              cudaMemcpy(part.data(), d_parts[i]->get(), part.size() * sizeof(float), cudaMemcpyDeviceToHost));
          for (int t = 0; t < n_tokens; ++t) {
            for (int64_t r = 0; r < part_rows[i]; ++r) y[t * rows + first + r] = part[t * part_rows[i] + r];
          }
          first += part_rows[i];
        }
      } else {
        M40_CUDA_CHECK(cudaMemcpy(y.data(), d_y.get(), d_y.bytes(), cudaMemcpyDeviceToHost));
      }

      double diff_sq = 0.0, scale_sq = 0.0;
      int failures = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        const double ref = mode == Residual::None ? product[i] : static_cast<double>(residual[i]) + product[i];
        const double bound = product_bound(abs_sum[i], ref, cols);
        const double diff = std::fabs(static_cast<double>(y[i]) - ref);
        if (!(diff <= bound) && ++failures <= 5) {
          ADD_FAILURE() << "token " << i / rows << " row " << i % rows << ": GPU " << y[i] << ", CPU " << ref
                        << ", |diff| " << diff << " > bound " << bound;
        }
        diff_sq += (static_cast<double>(y[i]) - ref) * (static_cast<double>(y[i]) - ref);
        const double scale = abs_sum[i] + (mode == Residual::None ? 0.0 : std::fabs(residual[i]));
        scale_sq += scale * scale;
      }
      EXPECT_EQ(failures, 0);
      EXPECT_LT(std::sqrt(diff_sq), 1e-5 * std::sqrt(scale_sq));
    }
  }


 private:
  cudaStream_t stream_ = nullptr;
  cpu::ThreadPool pool_{2};
};

// Column counts worth testing for a type: whole 256-value super-blocks, and
// for the 32-value formats and floats also an odd number of 32s. The
// super-block formats also get 4352 (17 blocks): their wide decoders' 64-value
// units then take the whole 128-lane block with a partial second round
// (2304 and fewer columns take 64-lane groups).
std::vector<int64_t> test_cols(TensorType type) {
  const auto& traits = gguf::tensor_type_traits(type);
  std::vector<int64_t> cols = {512, 2304};
  if (traits.block_size <= 32) {
    cols.push_back(96);
    cols.push_back(416);
  } else {
    cols.push_back(4352);
  }
  return cols;
}

class Matmul : public ::testing::TestWithParam<TensorType> {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
    checker_ = std::make_unique<Checker>();
  }
  void expect_matches_cpu(const HostWeight& w, int n_tokens, Kernel kernel, int x_offset = 0) {
    checker_->expect_matches_cpu(w, n_tokens, kernel, x_offset);
  }

  std::unique_ptr<Checker> checker_;
};

TEST_P(Matmul, MatvecMatchesCpu) {
  for (const int64_t cols : test_cols(GetParam())) {
    const HostWeight w = random_weight(GetParam(), 37, cols, static_cast<uint32_t>(cols));
    for (const int n : {1, 2, 3, 7, 8, 12, 16, 24, 32}) expect_matches_cpu(w, n, Kernel::Matvec);
  }
  // A single row, and more rows than a block holds with a partial last block.
  expect_matches_cpu(random_weight(GetParam(), 1, 512, 5), 1, Kernel::Matvec);
  expect_matches_cpu(random_weight(GetParam(), 301, 512, 6), 8, Kernel::Matvec);
}

// Fused decode products (a layer's Q, K and V in one launch): each part's
// output equals the CPU's product of its rows, at 1 to 16 tokens (9 to 16 in
// one 16-token launch, or two of 8 for the K-quants, Q4_1, Q5_0 and Q5_1).
TEST_P(Matmul, FusedPartsMatchCpu) {
  for (const int64_t cols : test_cols(GetParam())) {
    const HostWeight w = random_weight(GetParam(), 37, cols, 11);
    for (const int n : {1, 3, 8, 13, 16}) expect_matches_cpu(w, n, Kernel::Parts);
  }
}

// Gated products (a SwiGLU or GeGLU FFN's gate and up in one launch, the
// activation in its epilogue): act(gate x) * (up x) against the CPU's two
// products and its silu_mul / gelu_mul, at one and two tokens, with gate
// row counts that leave the last block's pairs partly past the end. The
// bound carries each product's bound through the activation (its slope is
// below 1.2 in magnitude for SiLU and GELU, its value below |gate| + 0.3)
// plus a few units of rounding of the result. The float types decline
// (false): their FFNs keep the activation kernel.
constexpr float kNormEps = 1e-5f;

// A folded norm's input (matvec_*_normalized): x and a norm weight of
// cols values, on the host and the device; `normalized` is cpu::rms_norm's
// x * scale * weight, what the CPU side multiplies.
struct NormInput {
  std::vector<float> x, weight, normalized;
  DeviceBuffer<float> d_x, d_weight;
  explicit NormInput(int64_t cols)
      : x(random_activations(static_cast<size_t>(cols), 61)),
        weight(random_activations(static_cast<size_t>(cols), 67)),
        normalized(static_cast<size_t>(cols)),
        d_x(static_cast<size_t>(cols)),
        d_weight(static_cast<size_t>(cols)) {
    cpu::rms_norm(x.data(), weight.data(), normalized.data(), cols, kNormEps);
    M40_CUDA_CHECK(cudaMemcpy(d_x.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    M40_CUDA_CHECK(cudaMemcpy(d_weight.get(), weight.data(), weight.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  FoldedNorm folded() const { return FoldedNorm{d_weight.get(), kNormEps}; }
};

// act(gate x) * (up x) of a gated product of `gate_rows` gate rows (and as
// many up rows after them) against the CPU, at n tokens; false where
// matvec_gated declines (nothing then checked). With `norm` (one token),
// the product folds the norm in (matvec_gated_normalized) and the CPU
// multiplies norm->normalized.
bool expect_gated_matches_cpu(const HostWeight& w, int64_t gate_rows, GatedActivation act, int n,
                              cudaStream_t stream, cpu::ThreadPool& pool, const NormInput* norm = nullptr) {
  const int64_t cols = w.cols;
  SCOPED_TRACE(std::string(gguf::tensor_type_name(w.type)) + " " + std::to_string(gate_rows) + " gate rows x " +
               std::to_string(cols) + ", " + std::to_string(n) + " tokens, " +
               (act == GatedActivation::Silu ? "SiLU" : "GELU") + (norm != nullptr ? ", folded norm" : ""));
  DeviceBuffer<uint8_t> d_w(w.bytes.size());
  M40_CUDA_CHECK(cudaMemcpy(d_w.get(), w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice));
  const DeviceWeight dw = device_view(w, d_w.get());
  const auto x = norm != nullptr ? norm->normalized
                                 : random_activations(static_cast<size_t>(n * cols), static_cast<uint32_t>(3 + n));
  std::vector<float> product(static_cast<size_t>(n * 2 * gate_rows));
  cpu::matmul(host_view(w), x.data(), n, product.data(), pool);
  DeviceBuffer<float> d_x(x.size());
  DeviceBuffer<float> d_y(static_cast<size_t>(n * gate_rows));
  M40_CUDA_CHECK(cudaMemcpy(d_x.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  M40_CUDA_CHECK(cudaMemset(d_y.get(), 0xff, d_y.bytes()));  // NaN
  const bool ran = norm != nullptr
                       ? matvec_gated_normalized(dw, gate_rows, act, norm->d_x.get(), norm->folded(), d_y.get(), stream)
                       : matvec_gated(dw, gate_rows, act, d_x.get(), n, d_y.get(), stream);
  if (!ran) return false;
  M40_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> y(static_cast<size_t>(n * gate_rows));
  M40_CUDA_CHECK(cudaMemcpy(y.data(), d_y.get(), d_y.bytes(), cudaMemcpyDeviceToHost));
  int failures = 0;
  for (int t = 0; t < n; ++t) {
    const float* gate = product.data() + static_cast<size_t>(t) * 2 * gate_rows;
    const float* up = gate + gate_rows;
    std::vector<float> ref(static_cast<size_t>(gate_rows));
    if (act == GatedActivation::Silu) {
      cpu::silu_mul(gate, up, ref.data(), gate_rows);
    } else {
      cpu::gelu_mul(gate, up, ref.data(), gate_rows);
    }
    for (int64_t r = 0; r < gate_rows; ++r) {
      double abs_gate = 0.0, abs_up = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        abs_gate += std::fabs(w.values[r * cols + c] * x[t * cols + c]);
        abs_up += std::fabs(w.values[(gate_rows + r) * cols + c] * x[t * cols + c]);
      }
      // A folded norm's x differs from the CPU's by a few units of rounding.
      const double x_rounding = norm != nullptr ? 4.0 * kUnitRoundoff : 0.0;
      const double b_gate = product_bound(abs_gate, gate[r], cols) + x_rounding * abs_gate;
      const double b_up = product_bound(abs_up, up[r], cols) + x_rounding * abs_up;
      const double bound = 1.2 * std::fabs(up[r]) * b_gate + (std::fabs(gate[r]) + 0.3) * b_up +
                           8.0 * kUnitRoundoff * std::fabs(ref[r]) + 1e-30;
      const double diff = std::fabs(static_cast<double>(y[t * gate_rows + r]) - ref[r]);
      if (!(diff <= bound) && ++failures <= 5) {
        ADD_FAILURE() << "token " << t << " row " << r << ": GPU " << y[t * gate_rows + r] << ", CPU " << ref[r]
                      << ", |diff| " << diff << " > bound " << bound;
      }
    }
  }
  EXPECT_EQ(failures, 0);
  return true;
}

// Gated products (a SwiGLU or GeGLU FFN's gate and up in one launch, the
// activation in its epilogue): act(gate x) * (up x) against the CPU's two
// products and its silu_mul / gelu_mul, at one and two tokens, with gate
// row counts that leave the last block's pairs partly past the end. The
// bound carries each product's bound through the activation (its slope is
// below 1.2 in magnitude for SiLU and GELU, its value below |gate| + 0.3)
// plus a few units of rounding of the result. The float types decline
// (false): their FFNs keep the activation kernel.
TEST_P(Matmul, GatedProductsMatchCpu) {
  const TensorType type = GetParam();
  const bool float_type = type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16;
  cudaStream_t stream = nullptr;
  M40_CUDA_CHECK(cudaStreamCreate(&stream));
  cpu::ThreadPool pool(2);
  for (const int64_t cols : test_cols(type)) {
    for (const int64_t gate_rows : {int64_t{37}, int64_t{64}}) {
      const HostWeight w = random_weight(type, 2 * gate_rows, cols, static_cast<uint32_t>(cols + gate_rows));
      for (const int n : {1, 2}) {
        for (const GatedActivation act : {GatedActivation::Silu, GatedActivation::GeluTanh}) {
          EXPECT_EQ(expect_gated_matches_cpu(w, gate_rows, act, n, stream, pool), !float_type);
        }
      }
      // Three tokens are not a gated kernel's: declined, nothing written.
      DeviceBuffer<uint8_t> d_w(w.bytes.size());
      const DeviceWeight dw = device_view(w, d_w.get());
      DeviceBuffer<float> d_x3(static_cast<size_t>(3 * cols));
      EXPECT_FALSE(matvec_gated(dw, gate_rows, GatedActivation::Silu, d_x3.get(), 3, d_x3.get(), stream));
    }
  }
  cudaStreamDestroy(stream);
}

// One- and two-token Q4_K and one-token Q8_0, Q4_0 and IQ4_XS products of
// rows up to 4096 columns stream their rows (matmul_streamed.cu; their two
// tokens take the matvec kernel, checked here as well): each block walks several batches
// of 8 (4) rows when there are more than 5 (2 to 4) blocks of them per SM,
// the last batch partly past the end; lanes past a narrow row's units
// compute nothing. Plain, with a residual, in fused parts, and gated.
TEST(MatmulShapes, StreamedProductsMatchCpu) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Checker checker;
  cudaStream_t stream = nullptr;
  M40_CUDA_CHECK(cudaStreamCreate(&stream));
  cpu::ThreadPool pool(2);
  for (const TensorType type : {TensorType::Q4_K, TensorType::Q8_0, TensorType::Q4_0, TensorType::IQ4_XS}) {
    const int64_t walked_rows = 8 * 12 * int64_t{current_multiprocessor_count()} + 3;
    const HostWeight walked = random_weight(type, walked_rows, 1024, 41);
    const HostWeight wide = random_weight(type, 301, 4096, 43);
    const int64_t gate_rows = 4 * 12 * int64_t{current_multiprocessor_count()} + 1;
    const HostWeight gated = random_weight(type, 2 * gate_rows, 768, 47);
    for (const int n : {1, 2}) {
      checker.expect_matches_cpu(walked, n, Kernel::Matvec);
      checker.expect_matches_cpu(walked, n, Kernel::Parts);
      checker.expect_matches_cpu(wide, n, Kernel::Matvec);
      checker.expect_matches_cpu(wide, n, Kernel::Parts);
      EXPECT_TRUE(expect_gated_matches_cpu(gated, gate_rows, GatedActivation::Silu, n, stream, pool));
    }
  }
  cudaStreamDestroy(stream);
}

// A layer's RMSNorm folded into a streamed product (matvec_parts_normalized,
// matvec_gated_normalized; Q4_K, Q8_0, Q4_0, IQ4_XS): the product of rms_norm(x) *
// weight, as the CPU computes it from x. Products the streamed kernel does not take (two
// tokens are not asked; Q6_K, or rows wider than 4096) decline.
TEST(MatmulShapes, FoldedNormMatchesCpu) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = nullptr;
  M40_CUDA_CHECK(cudaStreamCreate(&stream));
  cpu::ThreadPool pool(2);
  for (const TensorType type : {TensorType::Q4_K, TensorType::Q8_0, TensorType::Q4_0, TensorType::IQ4_XS}) {
    for (const int64_t cols : {int64_t{1024}, int64_t{4096}}) {
      SCOPED_TRACE(std::string(gguf::tensor_type_name(type)) + ", " + std::to_string(cols) + " columns");
      const NormInput norm(cols);
      // Fused parts, as a layer's Q, K and V.
      const int64_t rows = 8 * 12 * int64_t{current_multiprocessor_count()} + 5;
      const HostWeight w = random_weight(type, rows, cols, static_cast<uint32_t>(cols + 1));
      std::vector<float> product(static_cast<size_t>(rows));
      cpu::matmul(host_view(w), norm.normalized.data(), 1, product.data(), pool);
      DeviceBuffer<uint8_t> d_w(w.bytes.size());
      M40_CUDA_CHECK(cudaMemcpy(d_w.get(), w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice));
      const int64_t part_rows[3] = {rows / 2, rows / 4, rows - rows / 2 - rows / 4};
      DeviceBuffer<float> d_y(static_cast<size_t>(rows));
      M40_CUDA_CHECK(cudaMemset(d_y.get(), 0xff, d_y.bytes()));  // NaN
      const OutputPart parts[3] = {{d_y.get(), part_rows[0]},
                                   {d_y.get() + part_rows[0], part_rows[1]},
                                   {d_y.get() + part_rows[0] + part_rows[1], part_rows[2]}};
      ASSERT_TRUE(matvec_parts_normalized(device_view(w, d_w.get()), norm.d_x.get(), norm.folded(), parts, 3, stream));
      M40_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<float> y(static_cast<size_t>(rows));
      M40_CUDA_CHECK(cudaMemcpy(y.data(), d_y.get(), d_y.bytes(), cudaMemcpyDeviceToHost));
      int failures = 0;
      for (int64_t r = 0; r < rows; ++r) {
        double abs_sum = 0.0;
        for (int64_t c = 0; c < cols; ++c) abs_sum += std::fabs(w.values[r * cols + c] * norm.normalized[c]);
        const double bound = product_bound(abs_sum, product[r], cols) + 4.0 * kUnitRoundoff * abs_sum;
        const double diff = std::fabs(static_cast<double>(y[r]) - product[r]);
        if (!(diff <= bound) && ++failures <= 5) {
          ADD_FAILURE() << "row " << r << ": GPU " << y[r] << ", CPU " << product[r] << ", |diff| " << diff
                        << " > bound " << bound;
        }
      }
      EXPECT_EQ(failures, 0);

      // Gated, as an FFN's gate and up.
      const int64_t gate_rows = 4 * 12 * int64_t{current_multiprocessor_count()} + 3;
      const HostWeight gated = random_weight(type, 2 * gate_rows, cols, static_cast<uint32_t>(cols + 2));
      EXPECT_TRUE(expect_gated_matches_cpu(gated, gate_rows, GatedActivation::Silu, 1, stream, pool, &norm));

      // A Q6_K product does not fold.
      const HostWeight q6 = random_weight(TensorType::Q6_K, 37, cols, 5);
      DeviceBuffer<uint8_t> d_q6(q6.bytes.size());
      const OutputPart whole[1] = {{d_y.get(), 37}};
      EXPECT_FALSE(
          matvec_parts_normalized(device_view(q6, d_q6.get()), norm.d_x.get(), norm.folded(), whole, 1, stream));
    }
  }
  // Rows wider than the streamed kernel's 4096 columns do not fold.
  const NormInput wide_norm(4352);
  const HostWeight wide = random_weight(TensorType::Q4_K, 16, 4352, 9);
  DeviceBuffer<uint8_t> d_wide(wide.bytes.size());
  DeviceBuffer<float> d_y(16);
  EXPECT_FALSE(matvec_gated_normalized(device_view(wide, d_wide.get()), 8, GatedActivation::Silu, wide_norm.d_x.get(),
                                       wide_norm.folded(), d_y.get(), stream));
  cudaStreamDestroy(stream);
}

TEST_P(Matmul, GemmMatchesCpu) {
  for (const int64_t cols : {int64_t{512}, int64_t{96}}) {
    if (cols % gguf::tensor_type_traits(GetParam()).block_size != 0) continue;
    for (const int64_t rows : {int64_t{37}, int64_t{130}}) {
      const HostWeight w = random_weight(GetParam(), rows, cols, static_cast<uint32_t>(rows + cols));
      for (const int n : {1, 33, 64, 200, 512}) expect_matches_cpu(w, n, Kernel::Gemm);
    }
  }
}

// The 128 x 128 prefill tile runs when its blocks make nearly full waves:
// one row tile per SM, 128 tokens (smaller products take the 128 x 64 tile,
// which GemmMatchesCpu covers).
TEST(MatmulShapes, GemmWideTileMatchesCpu) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Checker checker;
  const int64_t rows = 128 * int64_t{current_multiprocessor_count()};
  for (const TensorType type : {TensorType::F16, TensorType::Q8_0, TensorType::Q4_0, TensorType::IQ4_NL,
                                TensorType::Q4_K, TensorType::Q6_K, TensorType::Q3_K}) {
    const HostWeight w = random_weight(type, rows, 256, 21);
    checker.expect_matches_cpu(w, 128, Kernel::Gemm);
  }
}

// Two products in one launch (matvec_pair): Q4_K rows in two parts beside
// Q6_K rows, one token, against the CPU's products, for rows of 64 units or
// fewer (64-lane groups) and more (the whole block), each side either way;
// outputs poisoned first. Other pairs of types and two tokens decline.
TEST(MatmulShapes, PairedProductsMatchCpu) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = nullptr;
  M40_CUDA_CHECK(cudaStreamCreate(&stream));
  cpu::ThreadPool pool(2);
  // One product's output against the CPU's (each output within
  // product_bound).
  auto expect_product = [&](const HostWeight& w, const std::vector<float>& x, const std::vector<float>& y,
                            const char* which) {
    std::vector<float> want(static_cast<size_t>(w.rows));
    cpu::matmul(host_view(w), x.data(), 1, want.data(), pool);
    int failures = 0;
    for (int64_t r = 0; r < w.rows; ++r) {
      double abs_sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) abs_sum += std::fabs(w.values[r * w.cols + c] * x[c]);
      const double diff = std::fabs(static_cast<double>(y[r]) - want[r]);
      if (!(diff <= product_bound(abs_sum, want[r], w.cols)) && ++failures <= 5) {
        ADD_FAILURE() << which << " row " << r << ": GPU " << y[r] << ", CPU " << want[r];
      }
    }
    EXPECT_EQ(failures, 0) << which;
  };
  for (const int64_t cols : {int64_t{512}, int64_t{4352}}) {
    for (const int64_t other_rows : {int64_t{37}, int64_t{130}}) {
      SCOPED_TRACE(std::to_string(cols) + " columns, " + std::to_string(other_rows) + " Q6_K rows");
      const HostWeight a = random_weight(TensorType::Q4_K, 75, cols, 31);
      const HostWeight b = random_weight(TensorType::Q6_K, other_rows, cols, 32);
      const auto x = random_activations(static_cast<size_t>(cols), 33);
      DeviceBuffer<uint8_t> d_a(a.bytes.size()), d_b(b.bytes.size());
      M40_CUDA_CHECK(cudaMemcpy(d_a.get(), a.bytes.data(), a.bytes.size(), cudaMemcpyHostToDevice));
      M40_CUDA_CHECK(cudaMemcpy(d_b.get(), b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice));
      DeviceBuffer<float> d_x(x.size()), d_q(50), d_k(25), d_v(static_cast<size_t>(b.rows));
      M40_CUDA_CHECK(cudaMemcpy(d_x.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
      for (const DeviceBuffer<float>* d : {&d_q, &d_k, &d_v}) M40_CUDA_CHECK(cudaMemset(d->get(), 0xff, d->bytes()));
      const OutputPart parts[2] = {{d_q.get(), 50}, {d_k.get(), 25}};
      ASSERT_TRUE(matvec_pair(device_view(a, d_a.get()), parts, 2, device_view(b, d_b.get()), d_v.get(), d_x.get(), 1,
                              stream));
      M40_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<float> qk(75), v(static_cast<size_t>(b.rows));
      M40_CUDA_CHECK(cudaMemcpy(qk.data(), d_q.get(), 50 * sizeof(float), cudaMemcpyDeviceToHost));
      M40_CUDA_CHECK(cudaMemcpy(qk.data() + 50, d_k.get(), 25 * sizeof(float), cudaMemcpyDeviceToHost));
      M40_CUDA_CHECK(cudaMemcpy(v.data(), d_v.get(), d_v.bytes(), cudaMemcpyDeviceToHost));
      expect_product(a, x, qk, "Q4_K parts");
      expect_product(b, x, v, "Q6_K");
      // Two tokens, and a pair without a paired kernel (Q6_K beside Q4_K):
      // declined, nothing written.
      DeviceBuffer<float> d_x2(2 * x.size()), d_other(75);
      M40_CUDA_CHECK(cudaMemset(d_x2.get(), 0, d_x2.bytes()));
      EXPECT_FALSE(matvec_pair(device_view(a, d_a.get()), parts, 2, device_view(b, d_b.get()), d_v.get(), d_x2.get(),
                               2, stream));
      M40_CUDA_CHECK(cudaMemset(d_v.get(), 0xff, d_v.bytes()));
      M40_CUDA_CHECK(cudaMemset(d_other.get(), 0xff, d_other.bytes()));
      const OutputPart whole_b[1] = {{d_v.get(), b.rows}};
      EXPECT_FALSE(matvec_pair(device_view(b, d_b.get()), whole_b, 1, device_view(a, d_a.get()), d_other.get(),
                               d_x.get(), 1, stream));
      M40_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<float> untouched(75);
      M40_CUDA_CHECK(cudaMemcpy(untouched.data(), d_other.get(), d_other.bytes(), cudaMemcpyDeviceToHost));
      for (const float value : untouched) EXPECT_TRUE(std::isnan(value));
    }
  }
  cudaStreamDestroy(stream);
}

// The 128 x 128 tile split over K: the smallest product of 65 tokens and
// 1024 columns that plan_prefill gives the wide tile and more than one part
// on this GPU (a ragged last wave), against the CPU.
TEST(MatmulShapes, GemmWideTileSplitOverKMatchesCpu) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int sms = current_multiprocessor_count();
  int64_t rows = 0;
  for (int64_t tiles = 1; tiles <= 64 * int64_t{sms} && rows == 0; ++tiles) {
    const mm::PrefillPlan plan = mm::plan_prefill(static_cast<int>(128 * tiles), 1024, 65, sms, true);
    if (plan.wide && plan.splits > 1) rows = 128 * tiles;
  }
  ASSERT_GT(rows, 0) << "no split wide-tile product for " << sms << " SMs";
  Checker checker;
  checker.expect_matches_cpu(random_weight(TensorType::Q4_K, rows, 1024, 23), 65, Kernel::Gemm);
}

// matmul() sends up to 32 tokens to matvec and more to gemm; matvec also
// takes more than 32 (in chunks).
TEST_P(Matmul, EveryBatchSizeThroughEveryEntryPoint) {
  const HostWeight w = random_weight(GetParam(), 45, 256, 11);
  for (const int n : {31, 32, 33, 65}) expect_matches_cpu(w, n, Kernel::Matmul);
  expect_matches_cpu(w, 40, Kernel::Matvec);
  expect_matches_cpu(w, 5, Kernel::Gemm);
}

// x not 16-byte aligned: the vector loads cannot be used, the scalar kernel
// takes over.
TEST_P(Matmul, UnalignedActivationsStillWork) {
  const HostWeight w = random_weight(GetParam(), 19, 256, 12);
  for (const int n : {1, 4, 40}) expect_matches_cpu(w, n, Kernel::Matmul, /*x_offset=*/1);
}

// Layer-sized products (the decode shapes of a small model) over many blocks.
TEST_P(Matmul, LargerProducts) {
  const HostWeight w = random_weight(GetParam(), 640, 4096, 13);
  expect_matches_cpu(w, 1, Kernel::Matvec);
  expect_matches_cpu(w, 8, Kernel::Matvec);
  expect_matches_cpu(w, 100, Kernel::Gemm);
  // A row of more than 64 units for the wide decoders at 1 and 2 tokens
  // (Q6_K's 64-value units: 76, so whole-block groups of 128 lanes, some
  // past the row's end; Q4_0 and IQ4_NL: a round's second unit past it).
  const HostWeight wide = random_weight(GetParam(), 70, 4864, 14);
  expect_matches_cpu(wide, 1, Kernel::Matvec);
  expect_matches_cpu(wide, 2, Kernel::Matvec);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, Matmul, ::testing::ValuesIn(all_types()),
                         [](const ::testing::TestParamInfo<TensorType>& param_info) {
                           return std::string(gguf::tensor_type_name(param_info.param));
                         });

// Float weights whose rows are not whole 16-byte vectors use the scalar kernel.
TEST(MatmulShapes, FloatRowsOfAnyLength) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Checker checker;
  for (const TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    const HostWeight w = random_weight(type, 21, 100, 3);
    for (const int n : {1, 3, 40}) {
      checker.expect_matches_cpu(w, n, Kernel::Matvec);
      checker.expect_matches_cpu(w, n, Kernel::Gemm);
    }
  }
}

TEST(MatmulShapes, EmptyProducts) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer<float> y(6);
  DeviceBuffer<float> residual(6);
  const std::vector<float> ones(6, 1.0f);
  M40_CUDA_CHECK(cudaMemcpy(residual.get(), ones.data(), 24, cudaMemcpyHostToDevice));
  DeviceWeight w;
  w.type = TensorType::Q4_K;
  w.rows = 3;
  w.cols = 0;
  w.row_bytes = 0;
  M40_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
  matmul(w, nullptr, 2, y.get(), residual.get(), nullptr);  // no columns: y = residual
  M40_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> host(6);
  M40_CUDA_CHECK(cudaMemcpy(host.data(), y.get(), 24, cudaMemcpyDeviceToHost));
  for (const float v : host) EXPECT_EQ(v, 1.0f);
  matvec(w, nullptr, 0, nullptr, nullptr, nullptr);  // no tokens: nothing to do
  gemm(w, nullptr, 0, nullptr, nullptr, nullptr);
}

// A weight at a made-up device address (and made-up x and y), for the
// argument checks that fail or decline before anything touches the GPU.
DeviceWeight unplaced_weight(TensorType type, int64_t rows, int64_t cols, size_t row_bytes) {
  DeviceWeight w;
  w.type = type;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = row_bytes;
  w.data = reinterpret_cast<const void*>(uintptr_t{1024});
  return w;
}
const float* const kUnplacedX = reinterpret_cast<const float*>(uintptr_t{256});
float* const kUnplacedY = reinterpret_cast<float*>(uintptr_t{512});

// Argument checks run before anything touches the GPU, so they run anywhere.
TEST(MatmulArguments, BadWeightsAreClearErrors) {
  const float* x = kUnplacedX;
  float* y = kUnplacedY;
  DeviceWeight w = unplaced_weight(TensorType::Q8_1, 4, 64, 72);
  try {
    matmul(w, x, 1, y, nullptr, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q8_1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
  }

  w.type = TensorType::Q4_K;
  w.cols = 100;
  w.row_bytes = 144;
  try {
    matvec(w, x, 1, y, nullptr, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a whole number of blocks"), std::string::npos) << e.what();
  }

  w.cols = 512;
  w.row_bytes = 144;  // a row needs 288
  EXPECT_THROW(gemm(w, x, 64, y, nullptr, nullptr), Error);
  w.row_bytes = 288;
  EXPECT_THROW(gemm(w, x, -1, y, nullptr, nullptr), Error);
  w.data = nullptr;
  EXPECT_THROW(matvec(w, x, 1, y, nullptr, nullptr), Error);
}

// matvec_parts refuses parts that do not add up to the weight, and declines
// (false, no work) what the fused kernel cannot do, so the caller falls back.
TEST(MatmulArguments, FusedPartsCheckTheirParts) {
  float* y = kUnplacedY;
  const DeviceWeight w = unplaced_weight(TensorType::Q4_K, 6, 256, 144);
  const float* x = kUnplacedX;
  const OutputPart two[2] = {{y, 4}, {y, 2}};
  const OutputPart short_parts[2] = {{y, 4}, {y, 1}};
  const OutputPart four[4] = {{y, 2}, {y, 2}, {y, 1}, {y, 1}};
  try {
    matvec_parts(w, x, 1, short_parts, 2, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the parts have 5 rows, the weight 6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(matvec_parts(w, x, 1, four, 4, nullptr), Error);
  EXPECT_FALSE(matvec_parts(w, x, kMaxFusedTokens + 1, two, 2, nullptr));
  EXPECT_FALSE(matvec_parts(w, x + 1, 1, two, 2, nullptr));  // x off its 16-byte alignment
}

// matvec_gated refuses a weight that is not two halves and a missing
// activation, before touching the GPU.
TEST(MatmulArguments, GatedProductsCheckTheirHalves) {
  float* y = kUnplacedY;
  const float* x = kUnplacedX;
  const DeviceWeight w = unplaced_weight(TensorType::Q4_K, 6, 256, 144);
  try {
    matvec_gated(w, 4, GatedActivation::Silu, x, 1, y, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("6 rows are not a gate and an up matrix of 4 rows"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(matvec_gated(w, 3, GatedActivation::None, x, 1, y, nullptr), Error);
  EXPECT_FALSE(matvec_gated(w, 3, GatedActivation::Silu, x + 1, 1, y, nullptr));  // x off its alignment
}

// The prefill plan (no GPU needed): which tile, and how many parts of K.
TEST(MatmulPlan, PrefillSplitsFillTheWaves) {
  constexpr int kH100 = 132, kM40 = 24;
  // 11008 x 4096 at 128 tokens on 132 SMs: 172 tiles of 128 x 64 for 264
  // block slots (0.65 of a wave). Three parts make 516 blocks, 2 waves of
  // a third of the work each (2/3 of the unsplit time) for 3 x 11 MB of
  // partial sums; six would take 4 waves of a sixth, the same, with twice
  // the partial sums.
  mm::PrefillPlan plan = mm::plan_prefill(11008, 4096, 128, kH100, true);
  EXPECT_FALSE(plan.wide);
  EXPECT_EQ(plan.splits, 3);
  // No scratch for partial sums: no split.
  EXPECT_EQ(mm::plan_prefill(11008, 4096, 128, kH100, false).splits, 1);
  // Whole waves stay whole: 4096 x 4096 at 512 tokens is 128 wide tiles for
  // 132 SMs, and 12288 x 4096 on an M40 16 waves of 24.
  plan = mm::plan_prefill(4096, 4096, 512, kH100, true);
  EXPECT_TRUE(plan.wide);
  EXPECT_EQ(plan.splits, 1);
  plan = mm::plan_prefill(12288, 4096, 512, kM40, true);
  EXPECT_TRUE(plan.wide);
  EXPECT_EQ(plan.splits, 1);
  // A 128-row router at 512 tokens (8 tiles of 128 x 64) fills the GPU only
  // in parts: as many as K allows (16 of 4 steps for 2048 columns).
  EXPECT_EQ(mm::plan_prefill(128, 2048, 512, kH100, true).splits, 16);
  // Few K steps: no part gets fewer than 4.
  EXPECT_EQ(mm::plan_prefill(128, 256, 512, kH100, true).splits, 2);
  EXPECT_EQ(mm::plan_prefill(128, 128, 512, kH100, true).splits, 1);
  // Whatever the shape: 1 to 16 parts of at least 4 K steps, and a split
  // leaves fewer idle block slots in the last wave than none.
  for (const int sms : {kM40, 80, kH100}) {
    for (const int rows : {128, 1024, 4096, 11008, 22016, 32000}) {
      for (const int cols : {256, 4096, 11008}) {
        for (const int tokens : {65, 128, 256, 512, 2048}) {
          plan = mm::plan_prefill(rows, cols, tokens, sms, true);
          const mm::PrefillTile& tile = plan.wide ? mm::kWidePrefillTile : mm::kShortPrefillTile;
          SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + ", " + std::to_string(tokens) +
                       " tokens, " + std::to_string(sms) + " SMs: " + std::to_string(plan.splits) + " parts");
          ASSERT_GE(plan.splits, 1);
          ASSERT_LE(plan.splits, 16);
          if (plan.splits == 1) continue;
          EXPECT_GE(cols / tile.k_step / plan.splits, 4);
          const int64_t tiles = int64_t{(rows + tile.rows - 1) / tile.rows} * ((tokens + tile.tokens - 1) / tile.tokens);
          const int64_t slots = int64_t{tile.blocks_per_sm} * sms;
          const double unsplit_waves = static_cast<double>((tiles + slots - 1) / slots);
          const double split_waves = static_cast<double>((tiles * plan.splits + slots - 1) / slots) / plan.splits;
          EXPECT_LT(split_waves, unsplit_waves);
        }
      }
    }
  }
}

// On GPUs of many SMs, 33 to 96 tokens: chunks of 32 through the decode
// products where the 64-token prefill tiles would be mostly padding (a
// remainder of a few tokens costs little in the matvec kernels), the prefill
// product where its tiles are full. The H100 measurements behind the costs:
// pp40 and pp80 faster in chunks, pp48, pp64 and pp96 in the prefill tile.
TEST(MatmulPlan, DecodeChunksWhereThePrefillTilesWouldBePadding) {
  for (const int n : {33, 40, 65, 72, 80}) EXPECT_TRUE(mm::decode_chunks_beat_prefill(n)) << n << " tokens";
  for (const int n : {48, 56, 64, 96}) EXPECT_FALSE(mm::decode_chunks_beat_prefill(n)) << n << " tokens";
}

TEST(MatmulArguments, DedicatedKernelTypes) {
  for (const TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                             TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K, TensorType::Q3_K,
                             TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::IQ4_NL,
                             TensorType::IQ4_XS}) {
    EXPECT_TRUE(matvec_supported(t)) << gguf::tensor_type_name(t);
  }
  for (const TensorType t : {TensorType::Q8_1, TensorType::Q8_K}) {
    EXPECT_FALSE(matvec_supported(t)) << gguf::tensor_type_name(t);
  }
}

}  // namespace
}  // namespace m40::cuda

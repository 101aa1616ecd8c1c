// The non-matmul layer kernels against their CPU twins (src/backends/cpu),
// on random inputs, with every output poisoned with NaN before the kernel
// runs. Bounds per operation:
//   embed_tokens, kv_append, add_in_place: bit for bit (same decoding and
//     conversion code on both sides; an IEEE add rounds the same everywhere);
//   rms_norm: 1e-6 relative (FP32 tree sum against the CPU's double sum);
//   rope: equal angles (the same repeated product), sincosf against the
//     host's sin/cos differ by a few ulp: 1e-6 of the inputs' scale; with
//     YaRN, whose mix of two angles the host compiler may fuse into an FMA,
//     2 ulp of the angle more (position x 2^-22, times the magnitude);
//   silu_mul: expf against the host's exp, a couple of ulp: 1e-6 relative;
//   gelu_mul: tanhf against tanh; 1 + tanh cancels for very negative gates,
//     where the outputs are small: 2e-6 relative + 1e-6;
//   add_bias, scale_and_cap (cap 0): bit for bit; with a cap, tanhf: 1e-6
//     relative;
//   add_branch: the RMSNorm's FP32 sum against the CPU's double, on values
//     added to the residual: 1e-6 relative + 1e-6;
//   attention_temperature: the same double formula, rounded to float: one
//     ulp of the factor (3e-7 relative).
#include <gtest/gtest.h>

#include <memory>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/kv_cache.h"
#include "backends/block_tables.h"
#include "backends/cpu/ops.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/kv_blocks.h"
#include "common/error.h"
#include "device_buffer.h"
#include "stream_test.h"
#include "layer_test_util.h"
#include "model/hparams.h"
#include "quant/fp16.h"
#include "quant/random_blocks.h"

namespace m40::cuda {
namespace {

using gguf::TensorType;
using test::DeviceBuffer;
using test::expect_close;
using test::from_device;
using test::poison;
using test::random_floats;
using test::to_device;

class LayerKernels : public test::CudaStreamTest {
 protected:
};

// ---------------------------------------------------------------------------
// embed_tokens

// A table of `rows` rows of `cols` values in `type`, as raw bytes.
std::vector<uint8_t> random_table(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  const auto& traits = gguf::tensor_type_traits(type);
  const int64_t values = rows * cols;
  if (type == TensorType::F32) {
    const auto f = random_floats(static_cast<size_t>(values), -3.0f, 3.0f, seed);
    std::vector<uint8_t> bytes(f.size() * 4);
    std::memcpy(bytes.data(), f.data(), bytes.size());
    return bytes;
  }
  if (type == TensorType::F16 || type == TensorType::BF16) {
    const auto f = random_floats(static_cast<size_t>(values), -3.0f, 3.0f, seed);
    std::vector<uint8_t> bytes(f.size() * 2);
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t h = type == TensorType::F16 ? quant::float_to_half(f[i]) : quant::float_to_bf16(f[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    return bytes;
  }
  return test::random_valid_blocks(type, values / traits.block_size, seed);
}

TEST_F(LayerKernels, EmbedTokensMatchesGetRowBitForBitInEveryType) {
  std::vector<TensorType> types = {TensorType::F32, TensorType::F16, TensorType::BF16};
  for (const TensorType t : test::block_types()) types.push_back(t);
  const int64_t rows = 37;
  const int64_t cols = 768;  // three 256-value chunks; 24 blocks of 32
  const std::vector<int32_t> tokens = {0, 36, 5, 5, 17, 1, 30, 36, 2, 11, 0};
  const int n_tokens = static_cast<int>(tokens.size());
  for (const TensorType type : types) {
    SCOPED_TRACE(std::string(gguf::tensor_type_name(type)));
    const auto& traits = gguf::tensor_type_traits(type);
    const auto bytes = random_table(type, rows, cols, 7);
    const uint64_t row_bytes = static_cast<uint64_t>(cols) / traits.block_size * traits.bytes_per_block;
    ASSERT_EQ(bytes.size(), row_bytes * rows);

    model::WeightView view;
    view.type = type;
    view.cols = static_cast<uint64_t>(cols);
    view.rows = static_cast<uint64_t>(rows);
    view.row_bytes = row_bytes;
    view.data = bytes.data();
    std::vector<float> cpu(static_cast<size_t>(n_tokens * cols));
    for (int t = 0; t < n_tokens; ++t) cpu::get_row(view, tokens[static_cast<size_t>(t)], cpu.data() + t * cols);

    DeviceBuffer<uint8_t> d_table(bytes.size());
    DeviceBuffer<int32_t> d_tokens(tokens.size());
    DeviceBuffer<float> d_out(cpu.size());
    to_device(d_table, bytes);
    to_device(d_tokens, tokens);
    poison(d_out);
    const DeviceWeight table{type, cols, rows, static_cast<size_t>(row_bytes), d_table.get()};
    embed_tokens(table, d_tokens.get(), n_tokens, d_out.get(), stream_);
    const auto gpu = from_device(d_out);
    EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * sizeof(float)), 0);
  }
}

TEST_F(LayerKernels, EmbedTokensGivesNaNForAnIdOutsideTheTable) {
  const std::vector<float> table_values = random_floats(4 * 32, -1.0f, 1.0f, 3);
  const std::vector<int32_t> tokens = {2, 4, -1, 3};
  DeviceBuffer<float> d_table(table_values.size());
  DeviceBuffer<int32_t> d_tokens(tokens.size());
  DeviceBuffer<float> d_out(tokens.size() * 32);
  to_device(d_table, table_values);
  to_device(d_tokens, tokens);
  M40_CUDA_CHECK(cudaMemset(d_out.get(), 0, d_out.bytes()));
  const DeviceWeight table{TensorType::F32, 32, 4, 32 * sizeof(float), d_table.get()};
  embed_tokens(table, d_tokens.get(), 4, d_out.get(), stream_);
  const auto out = from_device(d_out);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[static_cast<size_t>(i)], table_values[static_cast<size_t>(2 * 32 + i)]);
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>(32 + i)]));
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>(64 + i)]));
    EXPECT_EQ(out[static_cast<size_t>(96 + i)], table_values[static_cast<size_t>(3 * 32 + i)]);
  }
}

// ---------------------------------------------------------------------------
// rms_norm

void check_rms_norm(cudaStream_t stream, int n_rows, int n, bool in_place, int misalign) {
  SCOPED_TRACE(std::to_string(n_rows) + " rows of " + std::to_string(n) + (in_place ? ", in place" : "") +
               (misalign != 0 ? ", unaligned" : ""));
  const float eps = 1e-5f;
  const auto x = random_floats(static_cast<size_t>(n_rows) * n, -2.0f, 2.0f, static_cast<uint32_t>(n + n_rows));
  const auto w = random_floats(static_cast<size_t>(n), 0.5f, 1.5f, static_cast<uint32_t>(n));
  std::vector<float> cpu(x.size());
  for (int r = 0; r < n_rows; ++r) {
    cpu::rms_norm(x.data() + static_cast<int64_t>(r) * n, w.data(), cpu.data() + static_cast<int64_t>(r) * n, n, eps);
  }
  // Offsetting every pointer by one float takes the scalar (unaligned) path.
  DeviceBuffer<float> d_x(x.size() + 1);
  DeviceBuffer<float> d_w(w.size() + 1);
  DeviceBuffer<float> d_y(x.size() + 1);
  poison(d_y);
  M40_CUDA_CHECK(cudaMemcpy(d_x.get() + misalign, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  M40_CUDA_CHECK(cudaMemcpy(d_w.get() + misalign, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  float* y = in_place ? d_x.get() + misalign : d_y.get() + misalign;
  rms_norm(d_x.get() + misalign, d_w.get() + misalign, y, n_rows, n, eps, stream);
  M40_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> gpu(x.size());
  M40_CUDA_CHECK(cudaMemcpy(gpu.data(), y, gpu.size() * 4, cudaMemcpyDeviceToHost));
  expect_close(gpu, cpu, 1e-6, 1e-30, "rms_norm");
}

TEST_F(LayerKernels, RmsNormMatchesTheCpu) {
  check_rms_norm(stream_, 1, 8, false, 0);      // the 2-head test model's n_embd
  check_rms_norm(stream_, 5, 128, false, 0);
  check_rms_norm(stream_, 3, 4096, false, 0);
  check_rms_norm(stream_, 2, 5120, false, 0);
  check_rms_norm(stream_, 2, 8192, false, 0);    // the widest row kept in registers
  check_rms_norm(stream_, 2, 12288, true, 0);    // wider: the row read twice, in place
  check_rms_norm(stream_, 300, 4096, false, 0);  // a prefill batch
  check_rms_norm(stream_, 4, 4095, false, 0);    // not a multiple of 4: scalar path
  check_rms_norm(stream_, 4, 4096, false, 1);    // unaligned pointers: scalar path
  check_rms_norm(stream_, 7, 4096, true, 0);     // y == x
  check_rms_norm(stream_, 7, 100, true, 1);
  check_rms_norm(stream_, 24 * 4, 32, true, 0);  // per-head Q norm: rows of head_dim, in place
  check_rms_norm(stream_, 5 * 8, 128, true, 0);
}

// ---------------------------------------------------------------------------
// rope

struct RopeCase {
  int head_dim;
  int n_rot;
  bool neox;
  bool freq_factors;
  float freq_base;
  float freq_scale;
  int n_heads;
  int row_stride;
  float ext_factor = 0.0f;  // YaRN
  float corr_low = 0.0f;
  float corr_high = 0.0f;
  float magnitude = 1.0f;
};

void check_rope(cudaStream_t stream, const RopeCase& c) {
  SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + ", n_rot " + std::to_string(c.n_rot) +
               (c.neox ? ", neox" : ", normal") + (c.freq_factors ? ", freq factors" : "") + ", base " +
               std::to_string(c.freq_base) + ", scale " + std::to_string(c.freq_scale) + ", ext_factor " +
               std::to_string(c.ext_factor) + " (" + std::to_string(c.corr_low) + ".." +
               std::to_string(c.corr_high) + "), magnitude " + std::to_string(c.magnitude));
  // Positions: zero, small, large, the end of a 32k context, unsorted.
  const std::vector<int32_t> positions = {0, 1, 7, 4095, 31, 32767, 12345, 2, 100000, 511};
  const int n_tokens = static_cast<int>(positions.size());
  const auto x = random_floats(static_cast<size_t>(n_tokens) * c.row_stride, -1.0f, 1.0f, 11);
  std::vector<float> factors = random_floats(static_cast<size_t>(c.n_rot / 2), 1.0f, 8.0f, 5);

  cpu::RopeParams p;
  p.head_dim = c.head_dim;
  p.n_rot = c.n_rot;
  p.freq_base = c.freq_base;
  p.freq_scale = c.freq_scale;
  p.ext_factor = c.ext_factor;
  p.corr_low = c.corr_low;
  p.corr_high = c.corr_high;
  p.magnitude = c.magnitude;
  p.style = c.neox ? model::RopeStyle::NeoX : model::RopeStyle::Normal;
  p.freq_factors = c.freq_factors ? factors.data() : nullptr;
  std::vector<float> cpu = x;
  for (int t = 0; t < n_tokens; ++t) {
    cpu::rope(cpu.data() + static_cast<int64_t>(t) * c.row_stride, c.n_heads, positions[static_cast<size_t>(t)], p);
  }

  DeviceBuffer<float> d_x(x.size());
  DeviceBuffer<int32_t> d_pos(positions.size());
  DeviceBuffer<float> d_factors(factors.size());
  to_device(d_x, x);
  to_device(d_pos, positions);
  to_device(d_factors, factors);
  RopeConfig config;
  config.head_dim = c.head_dim;
  config.n_rot = c.n_rot;
  config.freq_base = c.freq_base;
  config.freq_scale = c.freq_scale;
  config.ext_factor = c.ext_factor;
  config.corr_low = c.corr_low;
  config.corr_high = c.corr_high;
  config.magnitude = c.magnitude;
  config.neox = c.neox;
  config.freq_factors = c.freq_factors ? d_factors.get() : nullptr;
  rope(d_x.get(), n_tokens, c.n_heads, c.row_stride, d_pos.get(), config, stream);
  // Inputs in [-1, 1]: a few ulp of 1 is ~3e-7. Values past the heads (a
  // fused row's tail) and past n_rot must come back untouched. Checked per
  // token: a YaRN angle may differ by an ulp (see the top of this file).
  const auto gpu = from_device(d_x);
  for (int t = 0; t < n_tokens; ++t) {
    const double angle_ulps = c.ext_factor != 0.0f ? positions[static_cast<size_t>(t)] * std::ldexp(1.0, -22) : 0.0;
    const auto first = static_cast<std::ptrdiff_t>(t) * c.row_stride;
    expect_close(std::vector<float>(gpu.begin() + first, gpu.begin() + first + c.row_stride),
                 std::vector<float>(cpu.begin() + first, cpu.begin() + first + c.row_stride), 1e-6,
                 1e-6 + 2.0 * c.magnitude * angle_ulps, "rope at position " + std::to_string(positions[static_cast<size_t>(t)]));
  }
}

TEST_F(LayerKernels, RopeMatchesTheCpu) {
  check_rope(stream_, {128, 128, false, false, 10000.0f, 1.0f, 8, 8 * 128});
  check_rope(stream_, {128, 128, true, false, 1000000.0f, 1.0f, 8, 8 * 128});
  check_rope(stream_, {128, 128, false, true, 500000.0f, 1.0f, 32, 32 * 128});  // Llama 3.1 rope_freqs
  check_rope(stream_, {64, 32, false, false, 10000.0f, 0.25f, 4, 4 * 64});      // partial rotation, linear scaling
  check_rope(stream_, {64, 32, true, true, 10000.0f, 0.5f, 4, 4 * 64});
  check_rope(stream_, {16, 16, false, false, 10000.0f, 1.0f, 8, 8 * 16 + 2 * 4 * 16});  // Q of a fused QKV row
  check_rope(stream_, {4, 4, false, false, 10000.0f, 1.0f, 2, 2 * 4});                  // the 2-head test model
  check_rope(stream_, {4, 4, true, false, 10000.0f, 1.0f, 2, 6 * 4});
  check_rope(stream_, {256, 256, true, false, 10000.0f, 1.0f, 2, 2 * 256});
}

// YaRN (mistral3: the ramp over pairs 2..9 of 16, freq_scale 1/16, an mscale
// magnitude), LongRoPE (frequency factors and an attn_factor magnitude, phi3),
// a partial mix (ext_factor 0.5) with NeoX pairs, frequency factors and
// partial rotation.
TEST_F(LayerKernels, RopeWithYarnAndMagnitudeMatchesTheCpu) {
  check_rope(stream_, {32, 32, false, false, 1000000.0f, 1.0f / 16.0f, 4, 4 * 32, 1.0f, 2.3f, 9.4f, 1.1386f});
  check_rope(stream_, {32, 32, true, false, 1000000.0f, 1.0f / 16.0f, 2, 4 * 32, 1.0f, 2.3f, 9.4f, 1.1386f});
  check_rope(stream_, {32, 32, true, true, 10000.0f, 1.0f, 4, 4 * 32 + 2 * 2 * 32, 0.0f, 0.0f, 0.0f, 1.190238f});
  check_rope(stream_, {128, 64, true, true, 500000.0f, 0.125f, 8, 8 * 128, 0.5f, 4.0f, 25.0f, 1.25f});
  check_rope(stream_, {128, 128, false, false, 10000.0f, 0.25f, 8, 8 * 128, 1.0f, 20.0f, 20.0f, 1.0f});  // a step, no ramp
}

// norm_and_rope_heads: Q's and K's heads of one layer in one launch, each
// head normalized (where its norm is given) then rotated (where RoPE is),
// against cpu::rms_norm per head then cpu::rope. Q's rows hold a fused
// row's tail in some cases, which must come back untouched.
struct HeadsCase {
  int head_dim, n_rot;
  bool neox;
  int n_head, n_head_kv;
  bool q_norm, k_norm, rope;
  int q_tail = 0;  // values after Q's heads in its row
  // K's and V's heads also stored into a paged KV cache of this type (F32:
  // not stored).
  backend::KvType store = backend::KvType::F32;
};

void check_norm_and_rope_heads(cudaStream_t stream, const HeadsCase& c) {
  SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + ", n_rot " + std::to_string(c.n_rot) +
               (c.neox ? ", neox" : ", normal") + ", heads " + std::to_string(c.n_head) + "/" +
               std::to_string(c.n_head_kv) + (c.q_norm ? ", Q norm" : "") + (c.k_norm ? ", K norm" : "") +
               (c.rope ? ", RoPE" : ", no RoPE"));
  const std::vector<int32_t> positions = {0, 5, 4095, 31, 32767, 3};
  const int n_tokens = static_cast<int>(positions.size());
  const int q_stride = c.n_head * c.head_dim + c.q_tail;
  const int k_stride = c.n_head_kv * c.head_dim;
  const float eps = 1e-6f;
  const auto q = random_floats(static_cast<size_t>(n_tokens) * q_stride, -2.0f, 2.0f, 21);
  const auto k = random_floats(static_cast<size_t>(n_tokens) * k_stride, -2.0f, 2.0f, 22);
  const auto q_w = random_floats(static_cast<size_t>(c.head_dim), 0.5f, 1.5f, 23);
  const auto k_w = random_floats(static_cast<size_t>(c.head_dim), 0.5f, 1.5f, 24);

  cpu::RopeParams p;
  p.head_dim = c.head_dim;
  p.n_rot = c.n_rot;
  p.freq_base = 1000000.0f;
  p.style = c.neox ? model::RopeStyle::NeoX : model::RopeStyle::Normal;
  std::vector<float> want_q = q, want_k = k;
  const auto reference = [&](std::vector<float>& x, int stride, int n_heads, bool norm, const std::vector<float>& w) {
    for (int t = 0; t < n_tokens; ++t) {
      float* row = x.data() + static_cast<int64_t>(t) * stride;
      if (norm) {
        for (int h = 0; h < n_heads; ++h) cpu::rms_norm(row + h * c.head_dim, w.data(), row + h * c.head_dim, c.head_dim, eps);
      }
      if (c.rope) cpu::rope(row, n_heads, positions[static_cast<size_t>(t)], p);
    }
  };
  reference(want_q, q_stride, c.n_head, c.q_norm, q_w);
  reference(want_k, k_stride, c.n_head_kv, c.k_norm, k_w);

  DeviceBuffer<float> d_q(q.size()), d_k(k.size()), d_qw(q_w.size()), d_kw(k_w.size());
  DeviceBuffer<int32_t> d_pos(positions.size());
  to_device(d_q, q);
  to_device(d_k, k);
  to_device(d_qw, q_w);
  to_device(d_kw, k_w);
  to_device(d_pos, positions);
  RopeConfig config;
  config.head_dim = c.head_dim;
  config.n_rot = c.n_rot;
  config.freq_base = p.freq_base;
  config.neox = c.neox;
  const bool store = c.store != backend::KvType::F32;
  const HeadCache k_store = store ? HeadCache::K : HeadCache::None;
  const HeadCache v_store = store ? HeadCache::V : HeadCache::None;
  // V: stored as it is (never normalized or rotated).
  const auto v = random_floats(k.size(), -2.0f, 2.0f, 25);
  DeviceBuffer<float> d_v(v.size());
  to_device(d_v, v);
  const HeadRows rows[3] = {{d_q.get(), c.n_head, q_stride, c.q_norm ? d_qw.get() : nullptr},
                            {d_k.get(), c.n_head_kv, k_stride, c.k_norm ? d_kw.get() : nullptr, true, k_store},
                            {d_v.get(), c.n_head_kv, k_stride, nullptr, false, v_store}};

  // The paged cache: one sequence over a 32k context, its blocks spread
  // over a pool of one block per position sent plus 2 spare (their rows, and
  // every row not sent, keep their poison); a token of no sequence is sent
  // too and must be skipped.
  const int n_ctx = 32768;
  const int max_blocks = backend::kv_blocks_for(n_ctx);
  const int n_pool = n_tokens + 2;
  std::vector<int32_t> table(static_cast<size_t>(max_blocks), 0);
  for (int t = 0; t < n_tokens; ++t) table[static_cast<size_t>(positions[static_cast<size_t>(t)] / backend::kKvBlockSize)] = (t * 5 + 3) % n_pool;
  std::vector<int32_t> seq_ids(static_cast<size_t>(n_tokens), 0);
  seq_ids.back() = -1;
  const KvFormat format = c.store == backend::KvType::Q8_0 ? KvFormat::Q8_0 : KvFormat::F16;
  const size_t row_bytes = kv_row_bytes(format, k_stride);
  const size_t pool_rows = static_cast<size_t>(n_pool) * backend::kKvBlockSize;
  DeviceBuffer<uint8_t> d_k_cache(pool_rows * row_bytes), d_v_cache(pool_rows * row_bytes);
  DeviceBuffer<int32_t> d_table(table.size()), d_seq(seq_ids.size());
  poison(d_k_cache);
  poison(d_v_cache);
  to_device(d_table, table);
  to_device(d_seq, seq_ids);
  const KvLayer layer{d_k_cache.get(), d_v_cache.get(), n_ctx, k_stride, d_table.get(), max_blocks, format};

  norm_and_rope_heads(rows, store ? 3 : 2, n_tokens, c.head_dim, eps, d_pos.get(), c.rope ? &config : nullptr, stream,
                      HeadStore{&layer, d_seq.get()});
  // Normalized values are a few units: their rounding (the GPU sums the
  // squares in another order) and RoPE's few-ulp angles at 32k positions.
  const auto gpu_k = from_device(d_k);
  expect_close(from_device(d_q), want_q, 1e-5, 1e-5, "Q");
  expect_close(gpu_k, want_k, 1e-5, 1e-5, "K");
  EXPECT_EQ(from_device(d_v), v) << "V is left as it is";
  if (!store) return;

  // The cache holds the CPU's conversion of the heads as the GPU left them
  // (K checked just above), at each token's pool row; nothing else.
  cpu::KvCache want(1, n_pool, k_stride, c.store);
  std::vector<bool> stored(pool_rows, false);
  for (int t = 0; t + 1 < n_tokens; ++t) {
    const int64_t row = backend::kv_row(table.data(), positions[static_cast<size_t>(t)]);
    want.store(0, row, gpu_k.data() + static_cast<int64_t>(t) * k_stride, v.data() + static_cast<int64_t>(t) * k_stride);
    stored[static_cast<size_t>(row)] = true;
  }
  const auto cache_k = from_device(d_k_cache);
  const auto cache_v = from_device(d_v_cache);
  int64_t mismatches = 0;
  for (size_t row = 0; row < pool_rows; ++row) {
    for (size_t b = 0; b < row_bytes; ++b) {
      const size_t i = row * row_bytes + b;
      const int want_kb = stored[row] ? want.key_bytes(0)[i] : 0xff;
      const int want_vb = stored[row] ? want.value_bytes(0)[i] : 0xff;
      if ((cache_k[i] != want_kb || cache_v[i] != want_vb) && ++mismatches <= 5) {
        ADD_FAILURE() << "pool row " << row << " byte " << b << ": GPU " << int{cache_k[i]} << "/" << int{cache_v[i]}
                      << ", expected " << want_kb << "/" << want_vb;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(LayerKernels, NormAndRopeOfHeadsMatchTheCpu) {
  check_norm_and_rope_heads(stream_, {128, 128, true, 32, 4, true, true, true});  // qwen3 / qwen3moe
  check_norm_and_rope_heads(stream_, {256, 256, true, 8, 4, true, true, true});   // gemma3
  check_norm_and_rope_heads(stream_, {128, 128, false, 32, 8, false, false, true});  // llama: RoPE only
  check_norm_and_rope_heads(stream_, {64, 32, true, 4, 2, true, true, true, 2 * 2 * 64});  // partial rotation, fused row
  check_norm_and_rope_heads(stream_, {64, 64, true, 9, 3, true, false, true});   // Q norm only, 12 heads: 2 blocks
  check_norm_and_rope_heads(stream_, {128, 128, true, 16, 8, true, true, false});  // a NoPE layer with norms
  check_norm_and_rope_heads(stream_, {4, 4, false, 2, 2, true, true, true});
  // K and V stored into the cache as well.
  check_norm_and_rope_heads(stream_, {128, 128, true, 32, 4, true, true, true, 0, backend::KvType::F16});
  check_norm_and_rope_heads(stream_, {128, 128, true, 32, 4, true, true, true, 0, backend::KvType::Q8_0});
  check_norm_and_rope_heads(stream_, {64, 32, false, 4, 2, false, false, true, 2 * 2 * 64, backend::KvType::Q8_0});
  check_norm_and_rope_heads(stream_, {16, 16, false, 8, 4, false, false, true, 0, backend::KvType::F16});
  check_norm_and_rope_heads(stream_, {128, 128, false, 16, 8, true, true, false, 0, backend::KvType::F16});
}

TEST(LayerKernelArguments, NormAndRopeOfHeadsRejectBadShapes) {
  const HeadRows rows[kMaxHeadRows + 1] = {{nullptr, 2, 128, nullptr}, {nullptr, 1, 64, nullptr}};
  EXPECT_THROW(norm_and_rope_heads(rows, kMaxHeadRows + 1, 1, 64, 1e-6f, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(norm_and_rope_heads(rows, 2, 1, 96, 1e-6f, nullptr, nullptr, nullptr), Error);  // 2 x 96 > 128
  const HeadRows big{nullptr, 1, 2048, reinterpret_cast<const float*>(16)};
  EXPECT_THROW(norm_and_rope_heads(&big, 1, 1, 2048, 1e-6f, nullptr, nullptr, nullptr), Error);  // norm of 2048
  // Stores: no cache given; heads that do not fill the cache's rows; Q8_0
  // blocks that would straddle two heads of 48.
  const HeadRows k_rows{nullptr, 2, 96, nullptr, true, HeadCache::K};
  EXPECT_THROW(norm_and_rope_heads(&k_rows, 1, 1, 48, 1e-6f, nullptr, nullptr, nullptr), Error);
  int32_t table[4] = {};
  const KvLayer f16{nullptr, nullptr, 64, 128, table, 4, KvFormat::F16};
  EXPECT_THROW(norm_and_rope_heads(&k_rows, 1, 1, 48, 1e-6f, nullptr, nullptr, nullptr, HeadStore{&f16, table}), Error);
  const KvLayer q8{nullptr, nullptr, 64, 96, table, 4, KvFormat::Q8_0};
  EXPECT_FALSE(heads_can_store(q8, 48));
  EXPECT_TRUE(heads_can_store(q8, 96));
  EXPECT_THROW(norm_and_rope_heads(&k_rows, 1, 1, 48, 1e-6f, nullptr, nullptr, nullptr, HeadStore{&q8, table}), Error);
}

TEST(LayerKernelArguments, RopeRejectsAnOddOrOversizedRotation) {
  RopeConfig config;
  config.head_dim = 64;
  config.n_rot = 63;
  EXPECT_THROW(rope(nullptr, 1, 1, 64, nullptr, config, nullptr), Error);
  config.n_rot = 66;
  EXPECT_THROW(rope(nullptr, 1, 1, 64, nullptr, config, nullptr), Error);
  config.n_rot = 64;
  EXPECT_THROW(rope(nullptr, 1, 2, 64, nullptr, config, nullptr), Error);  // two heads in a row of one
}

// ---------------------------------------------------------------------------
// silu_mul, add_in_place

// The gated activations (out = act(gate) * up) against their CPU twins:
// aligned or not (the float4 and scalar paths), in place or not.
struct GatedKernel {
  const char* name;
  void (*cpu)(const float*, const float*, float*, int64_t);
  void (*gpu)(const float*, const float*, float*, int64_t, cudaStream_t);
  float gate_range;  // gate values drawn from [-range, range]
  double rel, abs;   // tolerance
};
const GatedKernel kSilu{"silu_mul", cpu::silu_mul, silu_mul, 12.0f, 1e-6, 1e-30};
const GatedKernel kGelu{"gelu_mul", cpu::gelu_mul, gelu_mul, 8.0f, 2e-6, 1e-6};

void check_gated(const GatedKernel& k, cudaStream_t stream, int64_t n, int misalign, bool in_place) {
  SCOPED_TRACE(std::string(k.name) + ", " + std::to_string(n) + " values" + (misalign != 0 ? ", unaligned" : "") +
               (in_place ? ", in place" : ""));
  const auto gate = random_floats(static_cast<size_t>(n), -k.gate_range, k.gate_range, 21);
  const auto up = random_floats(static_cast<size_t>(n), -2.0f, 2.0f, 22);
  std::vector<float> cpu(static_cast<size_t>(n));
  k.cpu(gate.data(), up.data(), cpu.data(), n);
  DeviceBuffer<float> d_gate(gate.size() + 1);
  DeviceBuffer<float> d_up(up.size() + 1);
  DeviceBuffer<float> d_out(gate.size() + 1);
  poison(d_out);
  M40_CUDA_CHECK(cudaMemcpy(d_gate.get() + misalign, gate.data(), gate.size() * 4, cudaMemcpyHostToDevice));
  M40_CUDA_CHECK(cudaMemcpy(d_up.get() + misalign, up.data(), up.size() * 4, cudaMemcpyHostToDevice));
  float* out = in_place ? d_gate.get() + misalign : d_out.get() + misalign;
  k.gpu(d_gate.get() + misalign, d_up.get() + misalign, out, n, stream);
  M40_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> gpu(static_cast<size_t>(n));
  M40_CUDA_CHECK(cudaMemcpy(gpu.data(), out, gpu.size() * 4, cudaMemcpyDeviceToHost));
  expect_close(gpu, cpu, k.rel, k.abs, k.name);
}

void check_silu_mul(cudaStream_t stream, int64_t n, int misalign, bool in_place) {
  check_gated(kSilu, stream, n, misalign, in_place);
}

TEST_F(LayerKernels, SiluMulMatchesTheCpu) {
  check_silu_mul(stream_, 11008 * 3, 0, false);
  check_silu_mul(stream_, 1000003, 0, false);  // more than one pass of the grid, scalar tail
  check_silu_mul(stream_, 14336, 1, false);
  check_silu_mul(stream_, 14336, 0, true);
  check_silu_mul(stream_, 7, 0, false);
}

// silu_mul_rows: rows of [gate | up] (a fused expert product) against
// cpu::silu_mul of each row's halves.
TEST_F(LayerKernels, SiluMulRowsMatchesTheCpuOnEachRowsHalves) {
  for (const auto& [rows, n_ff] : {std::pair{1, 768}, std::pair{37, 32}, std::pair{300, 1408}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(n_ff));
    const auto gate_up = random_floats(static_cast<size_t>(rows) * 2 * n_ff, -12.0f, 12.0f, 23);
    std::vector<float> cpu(static_cast<size_t>(rows) * n_ff);
    for (int r = 0; r < rows; ++r) {
      const float* row = gate_up.data() + static_cast<size_t>(r) * 2 * n_ff;
      cpu::silu_mul(row, row + n_ff, cpu.data() + static_cast<size_t>(r) * n_ff, n_ff);
    }
    DeviceBuffer<float> d_in(gate_up.size()), d_out(cpu.size());
    M40_CUDA_CHECK(cudaMemcpy(d_in.get(), gate_up.data(), gate_up.size() * 4, cudaMemcpyHostToDevice));
    poison(d_out);
    silu_mul_rows(d_in.get(), rows, n_ff, d_out.get(), stream_);
    M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> gpu(cpu.size());
    M40_CUDA_CHECK(cudaMemcpy(gpu.data(), d_out.get(), gpu.size() * 4, cudaMemcpyDeviceToHost));
    expect_close(gpu, cpu, kSilu.rel, kSilu.abs, "silu_mul_rows");
  }
}

void check_add(cudaStream_t stream, int64_t n, int misalign) {
  SCOPED_TRACE(std::to_string(n) + " values" + (misalign != 0 ? ", unaligned" : ""));
  const auto y = random_floats(static_cast<size_t>(n), -5.0f, 5.0f, 31);
  const auto x = random_floats(static_cast<size_t>(n), -5.0f, 5.0f, 32);
  std::vector<float> cpu(y);
  for (size_t i = 0; i < cpu.size(); ++i) cpu[i] += x[i];
  DeviceBuffer<float> d_y(y.size() + 1);
  DeviceBuffer<float> d_x(x.size() + 1);
  M40_CUDA_CHECK(cudaMemcpy(d_y.get() + misalign, y.data(), y.size() * 4, cudaMemcpyHostToDevice));
  M40_CUDA_CHECK(cudaMemcpy(d_x.get() + misalign, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  add_in_place(d_y.get() + misalign, d_x.get() + misalign, n, stream);
  M40_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> gpu(static_cast<size_t>(n));
  M40_CUDA_CHECK(cudaMemcpy(gpu.data(), d_y.get() + misalign, gpu.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * 4), 0);
}

TEST_F(LayerKernels, AddInPlaceIsExact) {
  check_add(stream_, 4096 * 7, 0);
  check_add(stream_, 2000001, 0);
  check_add(stream_, 4096, 1);
  check_add(stream_, 5, 0);
}

void check_gelu_mul(cudaStream_t stream, int64_t n, int misalign, bool in_place) {
  check_gated(kGelu, stream, n, misalign, in_place);
}

TEST_F(LayerKernels, GeluMulMatchesTheCpu) {
  check_gelu_mul(stream_, 14336 * 3, 0, false);
  check_gelu_mul(stream_, 1000003, 0, false);  // more than one pass of the grid, scalar tail
  check_gelu_mul(stream_, 14336, 1, false);
  check_gelu_mul(stream_, 14336, 0, true);
  check_gelu_mul(stream_, 7, 0, false);
}

TEST_F(LayerKernels, AddBiasMatchesTheCpuBitForBit) {
  for (const auto& [n_rows, n_cols] : {std::pair{1, 4096}, std::pair{37, 1024}, std::pair{300, 128}, std::pair{3, 7}}) {
    SCOPED_TRACE(std::to_string(n_rows) + " rows of " + std::to_string(n_cols));
    const auto y = random_floats(static_cast<size_t>(n_rows) * n_cols, -5.0f, 5.0f, 51);
    const auto bias = random_floats(static_cast<size_t>(n_cols), -1.0f, 1.0f, 52);
    std::vector<float> cpu(y);
    for (int r = 0; r < n_rows; ++r) cpu::add_in_place(cpu.data() + static_cast<int64_t>(r) * n_cols, bias.data(), n_cols);
    DeviceBuffer<float> d_y(y.size()), d_bias(bias.size());
    to_device(d_y, y);
    to_device(d_bias, bias);
    add_bias(d_y.get(), d_bias.get(), n_rows, n_cols, stream_);
    const auto gpu = from_device(d_y);
    EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * 4), 0);
  }
}

// Q, K and V biases in one launch, as the backend adds them: each part gets
// its own bias and nothing beyond its rows is touched.
TEST_F(LayerKernels, AddBiasesToThreeMatricesInOneLaunch) {
  for (const int n_rows : {1, 5, 300}) {
    SCOPED_TRACE(std::to_string(n_rows) + " rows");
    const int widths[3] = {3584, 512, 512};  // Qwen2.5-7B's Q, K and V
    std::vector<std::vector<float>> y(3), bias(3), cpu(3);
    std::vector<std::unique_ptr<DeviceBuffer<float>>> d_y, d_bias;
    BiasTarget targets[3];
    for (int p = 0; p < 3; ++p) {
      // One guard row past each matrix: it must stay as it is.
      y[p] = random_floats(static_cast<size_t>(n_rows + 1) * widths[p], -5.0f, 5.0f, 61 + p);
      bias[p] = random_floats(static_cast<size_t>(widths[p]), -1.0f, 1.0f, 64 + p);
      cpu[p] = y[p];
      for (int r = 0; r < n_rows; ++r) {
        cpu::add_in_place(cpu[p].data() + static_cast<int64_t>(r) * widths[p], bias[p].data(), widths[p]);
      }
      d_y.push_back(std::make_unique<DeviceBuffer<float>>(y[p].size()));
      d_bias.push_back(std::make_unique<DeviceBuffer<float>>(bias[p].size()));
      to_device(*d_y[p], y[p]);
      to_device(*d_bias[p], bias[p]);
      targets[p] = {d_y[p]->get(), d_bias[p]->get(), widths[p]};
    }
    add_biases(targets, 3, n_rows, stream_);
    for (int p = 0; p < 3; ++p) {
      const auto gpu = from_device(*d_y[p]);
      EXPECT_EQ(std::memcmp(gpu.data(), cpu[p].data(), cpu[p].size() * 4), 0) << "part " << p;
    }
  }
  EXPECT_THROW(add_biases(nullptr, 0, 1, nullptr), Error);
  EXPECT_THROW(add_biases(nullptr, kMaxBiasTargets + 1, 1, nullptr), Error);
}

TEST_F(LayerKernels, ScaleAndCapMatchesTheCpu) {
  struct Case {
    float scale, cap;
  };
  // The embedding scale (no cap), granite's logit scale, gemma2's final
  // soft-cap over logits past it, both at once.
  for (const Case c : {Case{12.0f, 0.0f}, Case{0.125f, 0.0f}, Case{1.0f, 30.0f}, Case{0.5f, 5.0f}}) {
    SCOPED_TRACE("scale " + std::to_string(c.scale) + ", cap " + std::to_string(c.cap));
    const int64_t n = 32 * 1029 + 3;
    const auto x = random_floats(static_cast<size_t>(n), -60.0f, 60.0f, 61);
    std::vector<float> cpu(x);
    cpu::scale(cpu.data(), n, c.scale);
    if (c.cap > 0.0f) cpu::softcap(cpu.data(), n, c.cap);
    DeviceBuffer<float> d_x(x.size());
    to_device(d_x, x);
    scale_and_cap(d_x.get(), n, c.scale, c.cap, stream_);
    const auto gpu = from_device(d_x);
    if (c.cap == 0.0f) {
      EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * 4), 0);
    } else {
      expect_close(gpu, cpu, 1e-6, 1e-30, "scale_and_cap");
    }
  }
}

void check_add_branch(cudaStream_t stream, int n_rows, int n, bool bias, bool norm, float residual_scale) {
  SCOPED_TRACE(std::to_string(n_rows) + " rows of " + std::to_string(n) + (bias ? ", bias" : "") +
               (norm ? ", post-norm" : "") + ", scale " + std::to_string(residual_scale));
  const float eps = 1e-6f;
  const size_t values = static_cast<size_t>(n_rows) * n;
  const auto x = random_floats(values, -4.0f, 4.0f, static_cast<uint32_t>(n + 71));
  const auto branch = random_floats(values, -3.0f, 3.0f, static_cast<uint32_t>(n + 72));
  const auto b = random_floats(static_cast<size_t>(n), -1.0f, 1.0f, 73);
  const auto w = random_floats(static_cast<size_t>(n), 0.5f, 1.5f, 74);
  // The CPU's add_branch step: proj += bo, RMSNorm, scale, x += proj.
  std::vector<float> cpu(x), proj(branch);
  for (int r = 0; r < n_rows; ++r) {
    float* pr = proj.data() + static_cast<int64_t>(r) * n;
    if (bias) cpu::add_in_place(pr, b.data(), n);
    if (norm) cpu::rms_norm(pr, w.data(), pr, n, eps);
  }
  if (residual_scale != 1.0f) cpu::scale(proj.data(), static_cast<int64_t>(values), residual_scale);
  cpu::add_in_place(cpu.data(), proj.data(), static_cast<int64_t>(values));

  DeviceBuffer<float> d_x(values), d_branch(values), d_b(b.size()), d_w(w.size());
  to_device(d_x, x);
  to_device(d_branch, branch);
  to_device(d_b, b);
  to_device(d_w, w);
  const BranchJoin join{bias ? d_b.get() : nullptr, norm ? d_w.get() : nullptr, eps, residual_scale};
  add_branch(d_x.get(), d_branch.get(), join, n_rows, n, stream);
  expect_close(from_device(d_x), cpu, 1e-6, 1e-6, "add_branch");
  EXPECT_EQ(from_device(d_branch), branch) << "the branch must be left as it is";

  // With the next stage's norm in the same pass: into a poisoned buffer, and
  // over the branch itself (as the backend does, the branch being xn).
  const auto next_w = random_floats(static_cast<size_t>(n), 0.5f, 1.5f, 75);
  std::vector<float> normed(values);
  for (int r = 0; r < n_rows; ++r) {
    const int64_t o = static_cast<int64_t>(r) * n;
    cpu::rms_norm(cpu.data() + o, next_w.data(), normed.data() + o, n, eps);
  }
  DeviceBuffer<float> d_next_w(next_w.size()), d_normed(values);
  to_device(d_next_w, next_w);
  for (const bool over_branch : {false, true}) {
    SCOPED_TRACE(over_branch ? "normalized over the branch" : "normalized into its own buffer");
    to_device(d_x, x);
    to_device(d_branch, branch);
    poison(d_normed);
    float* out = over_branch ? d_branch.get() : d_normed.get();
    add_branch(d_x.get(), d_branch.get(), join, n_rows, n, stream, NextNorm{d_next_w.get(), out});
    expect_close(from_device(d_x), cpu, 1e-6, 1e-6, "add_branch x");
    expect_close(over_branch ? from_device(d_branch) : from_device(d_normed), normed, 2e-6, 1e-6, "add_branch norm");
  }
}

TEST_F(LayerKernels, AddBranchMatchesTheCpu) {
  check_add_branch(stream_, 5, 4096, false, true, 1.0f);   // gemma: post-norm
  check_add_branch(stream_, 3, 64, false, false, 0.22f);   // granite: residual scale
  check_add_branch(stream_, 4, 3584, true, false, 1.0f);   // an attn_output bias
  check_add_branch(stream_, 300, 128, true, true, 0.5f);   // all three, a prefill batch
  check_add_branch(stream_, 2, 100, false, true, 0.22f);   // a row that is not a multiple of the block
  check_add_branch(stream_, 3, 102, true, true, 0.22f);    // n % 4 != 0: the scalar kernel
  check_add_branch(stream_, 2, 16384, true, true, 1.0f);   // the widest row kept in registers
  check_add_branch(stream_, 1, 16388, false, true, 1.0f);  // one float4 more: the scalar kernel
}

TEST_F(LayerKernels, AttentionTemperatureMatchesTheCpu) {
  // mistral3's tiny model (steps of 16 positions) and Ministral 3's (16384).
  for (const uint32_t length : {16u, 16384u}) {
    SCOPED_TRACE("step length " + std::to_string(length));
    model::ModelHparams hp;
    hp.attn_temperature_scale = 0.1f;
    hp.attn_temperature_length = length;
    const std::vector<int32_t> positions = {0, 1, 15, 16, 17, 31, 32, 47, 100, 4095, 16383, 16384, 100000};
    const int n_tokens = static_cast<int>(positions.size());
    const int row_len = 4 * 32;
    const auto q = random_floats(static_cast<size_t>(n_tokens) * row_len, -3.0f, 3.0f, 81);
    std::vector<float> cpu(q);
    for (int t = 0; t < n_tokens; ++t) {
      cpu::scale(cpu.data() + static_cast<int64_t>(t) * row_len, row_len,
                 hp.attention_temperature(positions[static_cast<size_t>(t)]));
    }
    DeviceBuffer<float> d_q(q.size());
    DeviceBuffer<int32_t> d_pos(positions.size());
    to_device(d_q, q);
    to_device(d_pos, positions);
    attention_temperature(d_q.get(), n_tokens, row_len, d_pos.get(), hp.attn_temperature_scale, length, stream_);
    expect_close(from_device(d_q), cpu, 3e-7, 1e-30, "attention_temperature");
  }
}

TEST(LayerKernelArguments, NegativeCountsAreErrors) {
  EXPECT_THROW(silu_mul(nullptr, nullptr, nullptr, -1, nullptr), Error);
  EXPECT_THROW(gelu_mul(nullptr, nullptr, nullptr, -1, nullptr), Error);
  EXPECT_THROW(scale_and_cap(nullptr, -1, 1.0f, 0.0f, nullptr), Error);
  EXPECT_THROW(scale_and_cap(nullptr, 4, 1.0f, -1.0f, nullptr), Error);  // a negative cap
  EXPECT_THROW(add_bias(nullptr, nullptr, 1, 0, nullptr), Error);
  EXPECT_THROW(add_branch(nullptr, nullptr, BranchJoin{}, -1, 8, nullptr), Error);
  float dummy = 0.0f;
  EXPECT_THROW(add_branch(nullptr, nullptr, BranchJoin{}, 1, 8, nullptr, NextNorm{&dummy, nullptr}), Error);
  EXPECT_THROW(attention_temperature(nullptr, 1, 8, nullptr, 0.1f, 0, nullptr), Error);  // a step length of 0
  EXPECT_THROW(add_in_place(nullptr, nullptr, -1, nullptr), Error);
  EXPECT_THROW(rms_norm(nullptr, nullptr, nullptr, 1, 0, 1e-5f, nullptr), Error);
  EXPECT_NO_THROW(silu_mul(nullptr, nullptr, nullptr, 0, nullptr));  // nothing to launch
}

// ---------------------------------------------------------------------------
// kv_append

void check_kv_append(cudaStream_t stream, int n_seq, int n_ctx, int kv_dim,
                     backend::KvType type = backend::KvType::F16) {
  const bool q8 = type == backend::KvType::Q8_0;
  SCOPED_TRACE(std::to_string(n_seq) + " sequences x " + std::to_string(n_ctx) + " positions x kv_dim " +
               std::to_string(kv_dim) + (q8 ? ", Q8_0" : ", FP16"));
  // Distinct (sequence, position) slots in a shuffled order, as a mixed batch
  // of prefill chunks and decode tokens would send them.
  std::vector<int32_t> seq_ids, positions;
  std::mt19937 rng(41);
  for (int s = 0; s < n_seq; ++s) {
    for (int p = 0; p < n_ctx; ++p) {
      if (rng() % 3 != 0 || p == n_ctx - 1) {
        seq_ids.push_back(s);
        positions.push_back(p);
      }
    }
  }
  std::vector<size_t> order(seq_ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> s2, p2;
  for (const size_t i : order) {
    s2.push_back(seq_ids[i]);
    p2.push_back(positions[i]);
  }
  seq_ids.swap(s2);
  positions.swap(p2);
  const int n_tokens = static_cast<int>(seq_ids.size());

  // Values across the half range: ordinary, subnormal in half, overflowing
  // to inf, ties to even.
  auto k = random_floats(static_cast<size_t>(n_tokens) * kv_dim, -4.0f, 4.0f, 42);
  auto v = random_floats(static_cast<size_t>(n_tokens) * kv_dim, -4.0f, 4.0f, 43);
  for (size_t i = 0; i < k.size(); i += 7) k[i] *= 1e-6f;
  for (size_t i = 3; i < k.size(); i += 101) k[i] = 70000.0f;
  for (size_t i = 5; i < v.size(); i += 13) v[i] = 1.0f + 1.0f / 2048.0f;  // halfway between two halves
  if (q8 && n_tokens >= 3) {
    // Q8_0's edge blocks: all zeros (scale 0), a scale of exactly 1 with
    // quants on rounding ties (0.5 -> 0, 1.5 -> 2, -2.5 -> -2), and values
    // whose scale overflows the half range (clamped to 65504, quants to 127).
    std::fill(k.begin(), k.begin() + 32, 0.0f);
    for (int j = 0; j < 32; ++j) v[static_cast<size_t>(j)] = j == 0 ? 127.0f : 0.5f * static_cast<float>(2 * j - 31);
    for (int j = 0; j < 32; ++j) k[static_cast<size_t>(kv_dim + j)] = j % 2 == 0 ? 1e7f : -3e6f;
  }

  // The paged pool: every sequence's blocks a shuffled choice of a pool
  // with 3 spare blocks, whose rows must keep their poison.
  const int max_blocks = backend::kv_blocks_for(n_ctx);
  const int n_blocks = n_seq * max_blocks + 3;
  backend::BlockTables tables(n_seq, n_ctx, n_blocks);
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (int s = 0; s < n_seq; ++s) {
    tables.set(s, std::span<const int32_t>(blocks.data() + static_cast<size_t>(s) * max_blocks, max_blocks), 0);
  }
  const size_t pool_rows = static_cast<size_t>(n_blocks) * backend::kKvBlockSize;

  cpu::KvCache cache(1, n_blocks, kv_dim, type);
  std::vector<bool> stored(pool_rows, false);
  for (int t = 0; t < n_tokens; ++t) {
    const int64_t row = backend::kv_row(tables.table(seq_ids[static_cast<size_t>(t)]), positions[static_cast<size_t>(t)]);
    cache.store(0, row, k.data() + static_cast<int64_t>(t) * kv_dim, v.data() + static_cast<int64_t>(t) * kv_dim);
    stored[static_cast<size_t>(row)] = true;
  }

  const KvFormat format = q8 ? KvFormat::Q8_0 : KvFormat::F16;
  const size_t row_bytes = kv_row_bytes(format, kv_dim);
  DeviceBuffer<uint8_t> d_k_cache(pool_rows * row_bytes), d_v_cache(pool_rows * row_bytes);
  DeviceBuffer<float> d_k(k.size()), d_v(v.size());
  DeviceBuffer<int32_t> d_seq(seq_ids.size()), d_pos(positions.size()), d_tables(tables.flat().size());
  poison(d_k_cache);
  poison(d_v_cache);
  to_device(d_k, k);
  to_device(d_v, v);
  to_device(d_seq, seq_ids);
  to_device(d_pos, positions);
  to_device(d_tables, tables.flat());
  kv_append(KvLayer{d_k_cache.get(), d_v_cache.get(), n_ctx, kv_dim, d_tables.get(), max_blocks, format}, d_k.get(),
            d_v.get(), d_seq.get(), d_pos.get(), n_tokens, stream);
  const auto gpu_k = from_device(d_k_cache);
  const auto gpu_v = from_device(d_v_cache);

  // Stored rows: the CPU's bits. Others (spare blocks, unsent positions):
  // still the poison (no stray writes).
  // Compared byte by byte: halves, or Q8_0 scales and quants.
  const uint8_t* cpu_k = cache.key_bytes(0);
  const uint8_t* cpu_v = cache.value_bytes(0);
  int64_t mismatches = 0;
  for (size_t row = 0; row < pool_rows; ++row) {
    for (size_t b = 0; b < row_bytes; ++b) {
      const size_t i = row * row_bytes + b;
      const int want_k = stored[row] ? cpu_k[i] : 0xff;
      const int want_v = stored[row] ? cpu_v[i] : 0xff;
      if ((gpu_k[i] != want_k || gpu_v[i] != want_v) && ++mismatches <= 5) {
        ADD_FAILURE() << "pool row " << row << " byte " << b << ": GPU " << int{gpu_k[i]} << "/" << int{gpu_v[i]}
                      << ", expected " << want_k << "/" << want_v;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(LayerKernels, KvAppendStoresTheCpuHalvesBitForBit) {
  check_kv_append(stream_, 3, 64, 2 * 128);  // float4 path
  check_kv_append(stream_, 2, 50, 4 * 16);
  check_kv_append(stream_, 2, 33, 2 * 4);    // the 2-head test model
  check_kv_append(stream_, 2, 17, 6);        // kv_dim not a multiple of 4: scalar path
  check_kv_append(stream_, 5, 40, 2 * 64);   // a last block of 8 positions
}

// The Q8_0 cache: the GPU's quantize_block_q8_0 gives the CPU's blocks.
TEST_F(LayerKernels, KvAppendStoresTheCpuQ8_0BlocksBitForBit) {
  check_kv_append(stream_, 3, 64, 2 * 128, backend::KvType::Q8_0);
  check_kv_append(stream_, 2, 50, 32, backend::KvType::Q8_0);      // one block a row
  check_kv_append(stream_, 2, 33, 3 * 32, backend::KvType::Q8_0);  // an odd number of blocks
  check_kv_append(stream_, 5, 40, 2 * 64, backend::KvType::Q8_0);
}

TEST_F(LayerKernels, KvAppendRefusesQ8_0RowsThatAreNotWholeBlocks) {
  EXPECT_THROW(kv_append(KvLayer{nullptr, nullptr, 4, 48, nullptr, 1, KvFormat::Q8_0}, nullptr, nullptr,
                         nullptr, nullptr, 1, stream_),
               Error);
}

TEST_F(LayerKernels, KvAppendSkipsPositionsOutsideTheContext) {
  const int n_ctx = 4, kv_dim = 8;
  const std::vector<int32_t> seq_ids = {0, 0, 0};
  const std::vector<int32_t> positions = {-1, 4, 1};
  const auto k = random_floats(3 * kv_dim, -1.0f, 1.0f, 1);
  DeviceBuffer<uint16_t> d_k_cache(n_ctx * kv_dim), d_v_cache(n_ctx * kv_dim);
  DeviceBuffer<float> d_k(k.size());
  DeviceBuffer<int32_t> d_seq(3), d_pos(3), d_table(1);
  poison(d_k_cache);
  poison(d_v_cache);
  to_device(d_k, k);
  to_device(d_seq, seq_ids);
  to_device(d_pos, positions);
  to_device(d_table, std::vector<int32_t>{0});
  kv_append(KvLayer{d_k_cache.get(), d_v_cache.get(), n_ctx, kv_dim, d_table.get(), 1}, d_k.get(), d_k.get(),
            d_seq.get(), d_pos.get(), 3, stream_);
  const auto out = from_device(d_k_cache);
  for (int p = 0; p < n_ctx; ++p) {
    for (int d = 0; d < kv_dim; ++d) {
      const uint16_t want = p == 1 ? quant::float_to_half(k[static_cast<size_t>(2 * kv_dim + d)]) : uint16_t{0xffff};
      EXPECT_EQ(out[static_cast<size_t>(p * kv_dim + d)], want) << "pos " << p << " dim " << d;
    }
  }
}

}  // namespace
}  // namespace m40::cuda

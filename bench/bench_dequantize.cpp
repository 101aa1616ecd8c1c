// CPU dequantize_row and quantize_row throughput per type, one thread, on rows
// of 16M values (64 MB of floats: out of cache, like real tensors). The limit
// to read them against is MemcpyFloats: copying the same 64 MB of floats,
// which a dequantizer also has to write.
//
// items_per_second is values/s; bytes_per_second counts the bytes read plus
// the bytes written.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf/tensor_type.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"
#include "quant/random_blocks.h"

namespace {

using m40::gguf::TensorType;

constexpr int64_t kValues = int64_t{1} << 24;

int64_t stored_bytes(TensorType type, int64_t n) {
  const auto& traits = m40::gguf::tensor_type_traits(type);
  return n / traits.block_size * traits.bytes_per_block;
}

std::vector<float> gaussian_values(int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(n));
  for (auto& v : values) v = normal(rng);
  return values;
}

std::vector<uint8_t> stored_row(TensorType type) {
  if (m40::quant::can_quantize(type)) {
    std::vector<uint8_t> bytes(static_cast<size_t>(stored_bytes(type, kValues)));
    m40::quant::quantize_row(type, gaussian_values(kValues).data(), bytes.data(), kValues);
    return bytes;
  }
  const auto& traits = m40::gguf::tensor_type_traits(type);
  return m40::test::random_valid_blocks(type, kValues / traits.block_size, 1);
}

void count(benchmark::State& state, int64_t bytes_read, int64_t bytes_written) {
  state.SetItemsProcessed(state.iterations() * kValues);
  state.SetBytesProcessed(state.iterations() * (bytes_read + bytes_written));
}

void BM_MemcpyFloats(benchmark::State& state) {
  const std::vector<float> src = gaussian_values(kValues);
  std::vector<float> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  count(state, kValues * 4, kValues * 4);
}

void BM_Dequantize(benchmark::State& state, TensorType type) {
  const std::vector<uint8_t> src = stored_row(type);
  std::vector<float> dst(static_cast<size_t>(kValues));
  for (auto _ : state) {
    m40::quant::dequantize_row(type, src.data(), dst.data(), kValues);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  count(state, static_cast<int64_t>(src.size()), kValues * 4);
}

void BM_Quantize(benchmark::State& state, TensorType type) {
  const std::vector<float> src = gaussian_values(kValues);
  std::vector<uint8_t> dst(static_cast<size_t>(stored_bytes(type, kValues)));
  for (auto _ : state) {
    m40::quant::quantize_row(type, src.data(), dst.data(), kValues);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  count(state, kValues * 4, static_cast<int64_t>(dst.size()));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("MemcpyFloats", BM_MemcpyFloats)->Unit(benchmark::kMillisecond);
  const TensorType dequantized[] = {TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0,
                                    TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
                                    TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                                    TensorType::Q6_K, TensorType::IQ4_NL, TensorType::IQ4_XS};
  for (const TensorType type : dequantized) {
    const std::string name = "Dequantize/" + std::string(m40::gguf::tensor_type_name(type));
    benchmark::RegisterBenchmark(name.c_str(), BM_Dequantize, type)->Unit(benchmark::kMillisecond);
  }
  for (const TensorType type : {TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                                TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    const std::string name = "Quantize/" + std::string(m40::gguf::tensor_type_name(type));
    benchmark::RegisterBenchmark(name.c_str(), BM_Quantize, type)->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// The small per-layer kernels on the GPU (plain program: prints a markdown
// table): RMSNorm, RoPE, the K/V append, SiLU x up, the branch join with
// the next layer's norm, the token embedding and the logits' soft-cap, at
// Llama-2-7B's widths for 1, 8, 32 and 512 tokens. Each row gives the time
// per call and the kernel's traffic (bytes read plus written) per second
// beside the device-to-device copy bandwidth. At decode sizes these kernels
// move a few KB to a few hundred KB and their time is mostly launch and
// latency: a layer runs about ten of them.
//
//   bench_cuda_layers [iterations]
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_weight.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/kv_blocks.h"
#include "cuda_bench_common.cuh"

namespace {

using m40::bench::device_alloc;
using m40::bench::fill_floats;
using m40::bench::fill_halves;
using m40::bench::time_ms;

// Llama-2-7B: 4096 wide, 32 heads of 128 (as many KV heads), FFN 11008,
// 32000 tokens.
constexpr int kEmbd = 4096, kHeads = 32, kHeadDim = 128, kFf = 11008, kVocab = 32000;
constexpr int kMaxTokens = 512, kCtx = 4096;

struct Row {
  const char* kernel;
  double bytes;              // read plus written per call
  std::function<void()> call;
};

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
  // The ceiling: a device-to-device copy of 512 MiB (reads + writes).
  const double copy_gbs = m40::bench::print_device_and_copy_bandwidth();

  const int kv_dim = kHeads * kHeadDim;
  float* x = device_alloc<float>(size_t{kMaxTokens} * kEmbd);
  float* branch = device_alloc<float>(size_t{kMaxTokens} * kEmbd);
  float* normed = device_alloc<float>(size_t{kMaxTokens} * kEmbd);
  float* weight = device_alloc<float>(kEmbd);
  float* q = device_alloc<float>(size_t{kMaxTokens} * kv_dim);
  float* k = device_alloc<float>(size_t{kMaxTokens} * kv_dim);
  float* v = device_alloc<float>(size_t{kMaxTokens} * kv_dim);
  float* gate = device_alloc<float>(size_t{kMaxTokens} * kFf);
  float* up = device_alloc<float>(size_t{kMaxTokens} * kFf);
  float* logits = device_alloc<float>(size_t{32} * kVocab);
  uint16_t* table = device_alloc<uint16_t>(size_t{kVocab} * kEmbd);  // an F16 token embedding
  const std::pair<float*, int64_t> buffers[] = {{x, kMaxTokens * kEmbd},   {branch, kMaxTokens * kEmbd}, {weight, kEmbd},
                                                {q, kMaxTokens * kv_dim},   {k, kMaxTokens * kv_dim},     {v, kMaxTokens * kv_dim},
                                                {gate, kMaxTokens * kFf},   {up, kMaxTokens * kFf},       {logits, 32 * kVocab}};
  uint32_t seed = 1;
  for (const auto& [p, n] : buffers) {
    fill_floats<<<1024, 256>>>(p, n, seed++);
    M40_CUDA_CHECK_LAUNCH();
  }
  fill_halves<<<1024, 256>>>(table, int64_t{kVocab} * kEmbd, 5);
  M40_CUDA_CHECK_LAUNCH();
  const m40::cuda::DeviceWeight embedding{m40::gguf::TensorType::F16, kEmbd, kVocab, size_t{kEmbd} * 2, table};

  // One sequence per token (a decode step) over a paged F16 cache of kCtx
  // positions per sequence.
  const int max_blocks = m40::backend::kv_blocks_for(kCtx);
  const size_t pool_rows = size_t{kMaxTokens} * kCtx / 8;  // blocks enough for 512 sequences of kCtx / 8
  uint16_t* k_cache = device_alloc<uint16_t>(pool_rows * kv_dim);
  uint16_t* v_cache = device_alloc<uint16_t>(pool_rows * kv_dim);
  std::vector<int32_t> h_tables(size_t{kMaxTokens} * max_blocks);
  for (size_t i = 0; i < h_tables.size(); ++i) {
    h_tables[i] = static_cast<int32_t>(i % (pool_rows / m40::backend::kKvBlockSize));
  }
  int32_t* tables = device_alloc<int32_t>(h_tables.size());
  M40_CUDA_CHECK(cudaMemcpy(tables, h_tables.data(), h_tables.size() * 4, cudaMemcpyHostToDevice));
  const m40::cuda::KvLayer cache{k_cache, v_cache, kCtx, kv_dim, tables, max_blocks, m40::cuda::KvFormat::F16};
  std::vector<int32_t> h_ids(kMaxTokens), h_pos(kMaxTokens);
  std::iota(h_ids.begin(), h_ids.end(), 0);
  for (int t = 0; t < kMaxTokens; ++t) h_pos[static_cast<size_t>(t)] = (kCtx / 8 - 1) - t % 7;
  int32_t* seq_ids = device_alloc<int32_t>(kMaxTokens);
  int32_t* positions = device_alloc<int32_t>(kMaxTokens);
  int32_t* tokens = device_alloc<int32_t>(kMaxTokens);
  M40_CUDA_CHECK(cudaMemcpy(seq_ids, h_ids.data(), kMaxTokens * 4, cudaMemcpyHostToDevice));
  M40_CUDA_CHECK(cudaMemcpy(positions, h_pos.data(), kMaxTokens * 4, cudaMemcpyHostToDevice));
  M40_CUDA_CHECK(cudaMemcpy(tokens, h_ids.data(), kMaxTokens * 4, cudaMemcpyHostToDevice));

  m40::cuda::RopeConfig rope_config;
  rope_config.head_dim = kHeadDim;
  rope_config.n_rot = kHeadDim;
  const m40::cuda::BranchJoin plain_join{nullptr, weight, 1e-5f, 1.0f};  // a post-norm: gemma's join

  std::printf("| kernel | tokens | us/call | GB/s | of copy |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: |\n");
  for (const int n : {1, 8, 32, kMaxTokens}) {
    const double f = 4.0, h = 2.0;  // bytes of a float, a half
    const double row = static_cast<double>(n) * kEmbd * f;
    const int out_rows = n < 32 ? n : 32;
    const Row rows[] = {
        {"rms_norm", 2 * row + kEmbd * f, [&] { m40::cuda::rms_norm(x, weight, normed, n, kEmbd, 1e-5f, nullptr); }},
        {"rope (Q)", 2.0 * n * kv_dim * f + n * 4.0,
         [&] { m40::cuda::rope(q, n, kHeads, kv_dim, positions, rope_config, nullptr); }},
        {"kv_append", 2.0 * n * kv_dim * (f + h) + 2 * n * 4.0,
         [&] { m40::cuda::kv_append(cache, k, v, seq_ids, positions, n, nullptr); }},
        // What a qwen3 layer launches once: Q's and K's norms and RoPE, K
        // and V into the cache (Q and K read and written, V read, the cache
        // written).
        {"heads: Q/K norms, RoPE, K/V store", 5.0 * n * kv_dim * f + 2.0 * n * kv_dim * h + 2 * n * 4.0,
         [&] {
           const m40::cuda::HeadRows heads[3] = {
               {q, kHeads, kv_dim, weight},
               {k, kHeads, kv_dim, weight, true, m40::cuda::HeadCache::K},
               {v, kHeads, kv_dim, nullptr, false, m40::cuda::HeadCache::V}};
           m40::cuda::norm_and_rope_heads(heads, 3, n, kHeadDim, 1e-6f, positions, &rope_config, nullptr,
                                          m40::cuda::HeadStore{&cache, seq_ids});
         }},
        {"silu_mul", 3.0 * n * kFf * f, [&] { m40::cuda::silu_mul(gate, up, gate, int64_t{n} * kFf, nullptr); }},
        {"add_branch + next norm", 5 * row + 2 * kEmbd * f,
         [&] {
           m40::cuda::add_branch(x, branch, plain_join, n, kEmbd, nullptr, m40::cuda::NextNorm{weight, normed});
         }},
        {"embed_tokens (F16)", n * kEmbd * (h + f) + n * 4.0,
         [&] { m40::cuda::embed_tokens(embedding, tokens, n, x, nullptr); }},
        {"scale_and_cap (logits)", 2.0 * out_rows * kVocab * f,
         [&] { m40::cuda::scale_and_cap(logits, int64_t{out_rows} * kVocab, 1.0f, 30.0f, nullptr); }},
    };
    for (const Row& r : rows) {
      const double ms = time_ms(iterations, r.call);
      const double gbs = r.bytes / (ms * 1e6);
      std::printf("| %s | %d | %.2f | %.1f | %.0f%% |\n", r.kernel, n, ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
    }
  }
  return 0;
}

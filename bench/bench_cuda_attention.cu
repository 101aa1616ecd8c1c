// Attention throughput on the GPU (plain program: prints markdown tables).
//
// Decode is bandwidth-bound: each step reads every cached K and V row of its
// sequences once, n_pos x kv_dim halves of each. The table prints that
// traffic per second beside the card's device-to-device copy bandwidth
// (read + write counted), the practical ceiling. Prefill is FP32-bound: it
// prints GFLOP/s (4 x head_dim FLOPs per query head and visible key).
//
// The cache is paged as the backend's is (backends/kv_blocks.h): each
// sequence's blocks of 16 positions are a shuffled choice from the pool.
//
//   bench_cuda_attention [iterations] [long [KV_HEADS [CONTEXT]]]
//
// "long" runs only the long-context decode table, optionally one KV head
// count and one context (to profile a single case, e.g. under ncu).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/attention_variants.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/kv_blocks.h"
#include "cuda_bench_common.cuh"

namespace {

using m40::cuda::AttentionShape;
using m40::cuda::KvFormat;
using m40::cuda::KvLayer;
using m40::cuda::detail::AttentionKernel;
using m40::cuda::detail::AttentionPlan;

using m40::bench::device_alloc;
using m40::bench::fill_floats;
using m40::bench::fill_halves;
using m40::bench::time_in_graph_ms;
using m40::bench::time_ms;

// The layer of n_ctx positions per sequence over a pool of pool_rows rows of
// kv_dim: the block tables of sequences 0..n_seq-1 are a shuffled choice of
// the pool's blocks, uploaded to `tables` (room for kMaxTableEntries).
constexpr int kMaxTableEntries = 8192;
KvLayer paged_layer(uint16_t* k, uint16_t* v, int32_t* tables, size_t pool_rows, int n_seq, int n_ctx, int kv_dim) {
  const int max_blocks = m40::backend::kv_blocks_for(n_ctx);
  std::vector<int32_t> blocks(pool_rows / m40::backend::kKvBlockSize);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(7));
  const size_t entries = static_cast<size_t>(n_seq) * max_blocks;
  if (entries > blocks.size() || entries > kMaxTableEntries) {
    std::fprintf(stderr, "bench: %d sequences of %d positions do not fit the pool\n", n_seq, n_ctx);
    std::exit(1);
  }
  M40_CUDA_CHECK(cudaMemcpy(tables, blocks.data(), entries * sizeof(int32_t), cudaMemcpyHostToDevice));
  return KvLayer{k, v, n_ctx, kv_dim, tables, max_blocks};
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 50;
  const bool long_only = argc > 2 && std::string(argv[2]) == "long";
  const int only_kv_heads = argc > 3 ? std::atoi(argv[3]) : 0;
  const int only_context = argc > 4 ? std::atoi(argv[4]) : 0;
  // The ceiling: a device-to-device copy of 512 MiB (reads + writes).
  const double copy_gbs = m40::bench::print_device_and_copy_bandwidth();

  const int head_dim = 128;
  const int n_head = 32;
  const int max_seq = 8;
  const int n_ctx = 4096;
  const size_t cache_values = static_cast<size_t>(max_seq) * n_ctx * n_head * head_dim;  // room for MHA
  uint16_t* k = device_alloc<uint16_t>(cache_values);
  uint16_t* v = device_alloc<uint16_t>(cache_values);
  fill_halves<<<1024, 256>>>(k, static_cast<int64_t>(cache_values), 1);
  M40_CUDA_CHECK_LAUNCH();
  fill_halves<<<1024, 256>>>(v, static_cast<int64_t>(cache_values), 2);
  M40_CUDA_CHECK_LAUNCH();
  const int max_tokens = 512;
  float* q = device_alloc<float>(static_cast<size_t>(max_tokens) * n_head * head_dim);
  float* out = device_alloc<float>(static_cast<size_t>(max_tokens) * n_head * head_dim);
  fill_floats<<<1024, 256>>>(q, static_cast<int64_t>(max_tokens) * n_head * head_dim, 3);
  M40_CUDA_CHECK_LAUNCH();
  int32_t* seq_ids = device_alloc<int32_t>(max_tokens);
  int32_t* tables = device_alloc<int32_t>(kMaxTableEntries);
  int32_t* positions = device_alloc<int32_t>(max_tokens);

  // Long contexts (#20's depths): one sequence at 4k..32k positions, MHA and
  // GQA 4:1 and 8:1, FP16 and Q8_0 caches, automatic split, timed inside a
  // CUDA graph as a decode step runs it (the host's launch and scratch costs,
  // which the other tables include, dominate calls below ~20 us). The cache
  // (max_seq x n_ctx positions of MHA) holds 32768 positions of one
  // sequence; random FP16 bits are valid Q8_0 blocks too (a half scale in
  // [-1, 1] every 34 bytes, any int8 quants). One call's K and V exceed the
  // L2 from 8k positions at MHA and 32k at GQA 8:1.
  std::printf("## decode at long contexts: one sequence, %d query heads x %d, in a CUDA graph\n\n", n_head, head_dim);
  std::printf("| KV | KV heads | context | us/call | KV GB/s | of copy | 2 query heads a block: us/call |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const KvFormat type : {KvFormat::F16, KvFormat::Q8_0}) {
    for (const int n_head_kv : {32, 8, 4}) {
      for (const int context : {4096, 8192, 16384, 32768}) {
        const int pool_positions = max_seq * n_ctx;
        if (context > pool_positions || (only_kv_heads > 0 && n_head_kv != only_kv_heads) ||
            (only_context > 0 && context != only_context)) {
          continue;
        }
        const std::vector<int32_t> h_seq(1, 0), h_pos(1, context - 1);
        M40_CUDA_CHECK(cudaMemcpy(seq_ids, h_seq.data(), 4, cudaMemcpyHostToDevice));
        M40_CUDA_CHECK(cudaMemcpy(positions, h_pos.data(), 4, cudaMemcpyHostToDevice));
        KvLayer layer = paged_layer(k, v, tables, static_cast<size_t>(pool_positions), 1, context,
                                    n_head_kv * head_dim);
        layer.type = type;
        const AttentionShape shape{n_head, n_head_kv, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
        const auto time_plan = [&](const AttentionPlan& plan) {
          return time_in_graph_ms(std::max(1, iterations / 5), 10, [&](cudaStream_t stream) {
            m40::cuda::detail::attention_with_plan(layer, shape, q, seq_ids, positions, 1, context, out, stream,
                                                   plan);
          });
        };
        const double ms = time_plan(AttentionPlan{AttentionKernel::Decode, 0});
        // The GQA group split over blocks of two heads (each K/V row read by
        // two blocks, mostly from the L2), against the whole group a block.
        char two_heads[32] = "-";
        if (n_head_kv < n_head) {
          std::snprintf(two_heads, sizeof two_heads, "%.1f",
                        time_plan(AttentionPlan{AttentionKernel::Decode, 0, 2}) * 1e3);
        }
        const double bytes = 2.0 * static_cast<double>(context) * m40::cuda::kv_row_bytes(type, n_head_kv * head_dim);
        const double gbs = bytes / (ms * 1e6);
        std::printf("| %s | %d | %d | %.1f | %.1f | %.0f%% | %s |\n", type == KvFormat::F16 ? "f16" : "q8_0",
                    n_head_kv, context, ms * 1e3, gbs, 100.0 * gbs / copy_gbs, two_heads);
      }
    }
  }
  if (long_only) return 0;

  std::printf("\n## decode: one token per sequence, %d query heads x %d\n\n", n_head, head_dim);
  std::printf("| KV heads | sequences | context | kernel | us/call | KV GB/s | of copy |\n");
  std::printf("| ---: | ---: | ---: | --- | ---: | ---: | ---: |\n");
  for (const int n_head_kv : {32, 8}) {
    for (const int n_seq : {1, 8}) {
      for (const int context : {512, 4096}) {
        for (const int splits : {0, 1}) {
          if (splits == 1 && n_seq != 1) continue;
          std::vector<int32_t> h_seq(static_cast<size_t>(n_seq)), h_pos(static_cast<size_t>(n_seq), context - 1);
          for (int s = 0; s < n_seq; ++s) h_seq[static_cast<size_t>(s)] = s;
          M40_CUDA_CHECK(cudaMemcpy(seq_ids, h_seq.data(), h_seq.size() * 4, cudaMemcpyHostToDevice));
          M40_CUDA_CHECK(cudaMemcpy(positions, h_pos.data(), h_pos.size() * 4, cudaMemcpyHostToDevice));
          const KvLayer layer = paged_layer(k, v, tables, cache_values / (n_head_kv * head_dim), max_seq, n_ctx,
                                            n_head_kv * head_dim);
          const AttentionShape shape{n_head, n_head_kv, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
          const AttentionPlan plan{AttentionKernel::Decode, splits};
          const double ms = time_ms(iterations, [&] {
            m40::cuda::detail::attention_with_plan(layer, shape, q, seq_ids, positions, n_seq, context, out, nullptr,
                                                   plan);
          });
          const double bytes = 2.0 * n_seq * static_cast<double>(context) * n_head_kv * head_dim * 2.0;
          const double gbs = bytes / (ms * 1e6);
          std::printf("| %d | %d | %d | %s | %.1f | %.1f | %.0f%% |\n", n_head_kv, n_seq, context,
                      splits == 1 ? "decode, no split" : "decode, auto split", ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
        }
      }
    }
  }

  std::printf("\n## prefill: one sequence, %d query heads x %d\n\n", n_head, head_dim);
  std::printf("| KV heads | tokens | first position | us/call | GFLOP/s |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: |\n");
  for (const int n_head_kv : {32, 8}) {
    for (const int start : {0, n_ctx - max_tokens}) {
      const int n_tokens = max_tokens;
      std::vector<int32_t> h_seq(static_cast<size_t>(n_tokens), 0), h_pos(static_cast<size_t>(n_tokens));
      double visible = 0.0;
      for (int t = 0; t < n_tokens; ++t) {
        h_pos[static_cast<size_t>(t)] = start + t;
        visible += start + t + 1;
      }
      M40_CUDA_CHECK(cudaMemcpy(seq_ids, h_seq.data(), h_seq.size() * 4, cudaMemcpyHostToDevice));
      M40_CUDA_CHECK(cudaMemcpy(positions, h_pos.data(), h_pos.size() * 4, cudaMemcpyHostToDevice));
      const KvLayer layer = paged_layer(k, v, tables, cache_values / (n_head_kv * head_dim), 1, n_ctx,
                                        n_head_kv * head_dim);
      const AttentionShape shape{n_head, n_head_kv, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
      const double ms = time_ms(std::max(1, iterations / 5), [&] {
        m40::cuda::attention(layer, shape, q, seq_ids, positions, n_tokens, start + n_tokens, out, nullptr);
      });
      const double flops = 4.0 * head_dim * n_head * visible;
      std::printf("| %d | %d | %d | %.1f | %.0f |\n", n_head_kv, n_tokens, start, ms * 1e3, flops / (ms * 1e6));
    }
  }

  // A decode step of many sequences (a server with --parallel over 32), one
  // token each at position 511: the decode kernel against the prefill kernel,
  // which Auto picks past 32 tokens and which takes each token as its own
  // segment.
  std::printf("\n## decode step of many sequences: one token each at position 511, %d query heads x %d\n\n", n_head,
              head_dim);
  std::printf("| KV heads | sequences | decode kernel, us | prefill kernel, us |\n");
  std::printf("| ---: | ---: | ---: | ---: |\n");
  for (const int n_head_kv : {32, 8}) {
    for (const int n_seq : {33, 64, 128}) {
      const int context = 512;
      if (static_cast<size_t>(n_seq) * context * n_head_kv * head_dim > cache_values) continue;
      std::vector<int32_t> h_seq(static_cast<size_t>(n_seq)), h_pos(static_cast<size_t>(n_seq), context - 1);
      for (int t = 0; t < n_seq; ++t) h_seq[static_cast<size_t>(t)] = t;
      M40_CUDA_CHECK(cudaMemcpy(seq_ids, h_seq.data(), h_seq.size() * 4, cudaMemcpyHostToDevice));
      M40_CUDA_CHECK(cudaMemcpy(positions, h_pos.data(), h_pos.size() * 4, cudaMemcpyHostToDevice));
      const KvLayer layer = paged_layer(k, v, tables, cache_values / (n_head_kv * head_dim), n_seq, context,
                                        n_head_kv * head_dim);
      const AttentionShape shape{n_head, n_head_kv, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
      double ms[2];
      for (const AttentionKernel kernel : {AttentionKernel::Decode, AttentionKernel::Prefill}) {
        ms[kernel == AttentionKernel::Decode ? 0 : 1] = time_ms(std::max(1, iterations / 5), [&] {
          m40::cuda::detail::attention_with_plan(layer, shape, q, seq_ids, positions, n_seq, context, out, nullptr,
                                                 AttentionPlan{kernel, 0});
        });
      }
      std::printf("| %d | %d | %.1f | %.1f |\n", n_head_kv, n_seq, ms[0] * 1e3, ms[1] * 1e3);
    }
  }

  // A server step: 7 sequences decoding one token each (position 300) beside
  // a prompt chunk of another sequence that ends at position 1999, as one call
  // (the batch as the scheduler builds it) and as two (the decode tokens
  // through the decode kernel, the chunk through the prefill kernel).
  std::printf("\n## mixed step: 7 decode tokens + a prompt chunk ending at 1999, %d KV heads\n\n", n_head);
  std::printf("| chunk | one call, us | decode call + chunk call, us | chunk alone, us |\n");
  std::printf("| ---: | ---: | ---: | ---: |\n");
  for (const int chunk : {64, 256}) {
    const int n_decode = 7;
    const int n_tokens = n_decode + chunk;
    std::vector<int32_t> h_seq(static_cast<size_t>(n_tokens)), h_pos(static_cast<size_t>(n_tokens));
    for (int t = 0; t < n_decode; ++t) h_seq[static_cast<size_t>(t)] = t + 1, h_pos[static_cast<size_t>(t)] = 300;
    for (int t = 0; t < chunk; ++t) {
      h_seq[static_cast<size_t>(n_decode + t)] = 0;
      h_pos[static_cast<size_t>(n_decode + t)] = 2000 - chunk + t;
    }
    M40_CUDA_CHECK(cudaMemcpy(seq_ids, h_seq.data(), h_seq.size() * 4, cudaMemcpyHostToDevice));
    M40_CUDA_CHECK(cudaMemcpy(positions, h_pos.data(), h_pos.size() * 4, cudaMemcpyHostToDevice));
    const KvLayer layer = paged_layer(k, v, tables, cache_values / (n_head * head_dim), max_seq, n_ctx,
                                      n_head * head_dim);
    const AttentionShape shape{n_head, n_head, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
    const int q_dim = n_head * head_dim;
    const double one_ms = time_ms(std::max(1, iterations / 5), [&] {
      m40::cuda::attention(layer, shape, q, seq_ids, positions, n_tokens, n_ctx, out, nullptr);
    });
    const double two_ms = time_ms(std::max(1, iterations / 5), [&] {
      m40::cuda::attention(layer, shape, q, seq_ids, positions, n_decode, n_ctx, out, nullptr);
      m40::cuda::attention(layer, shape, q + n_decode * q_dim, seq_ids + n_decode, positions + n_decode, chunk,
                           n_ctx, out + n_decode * q_dim, nullptr);
    });
    const double chunk_ms = time_ms(std::max(1, iterations / 5), [&] {
      m40::cuda::attention(layer, shape, q + n_decode * q_dim, seq_ids + n_decode, positions + n_decode, chunk,
                           n_ctx, out + n_decode * q_dim, nullptr);
    });
    std::printf("| %d | %.1f | %.1f | %.1f |\n", chunk, one_ms * 1e3, two_ms * 1e3, chunk_ms * 1e3);
  }

  M40_CUDA_CHECK(cudaFree(tables));
  M40_CUDA_CHECK(cudaFree(k));
  M40_CUDA_CHECK(cudaFree(v));
  M40_CUDA_CHECK(cudaFree(q));
  M40_CUDA_CHECK(cudaFree(out));
  M40_CUDA_CHECK(cudaFree(seq_ids));
  M40_CUDA_CHECK(cudaFree(positions));
  return 0;
}

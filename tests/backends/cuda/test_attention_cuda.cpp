// The attention kernels against cpu::attention on the same FP16 or Q8_0
// cache bytes (filled through cpu::KvCache::store and copied to the GPU), read through
// the same block tables: every sequence's blocks are a shuffled choice from
// a pool with spare blocks (rows the kernels must not read). Every batch
// runs through each kernel: the decode kernel with its automatic split, with
// no split and with a forced odd split; the prefill kernel; and Auto. Scores
// are scaled by 1/sqrt(head_dim), optionally soft-capped and limited to a
// sliding window, the same settings on both sides.
//
// Bound: |GPU - CPU| <= 1e-5 (+ 1e-5 relative). Both sides compute in FP32
// from the same widened halves (or Q8_0 values q * d, the same product on
// both sides); they differ in the order of the sums (tree
// and online-softmax rescaling against the CPU's sequential float sums and
// double softmax denominator). Outputs are convex combinations of V in
// [-1, 1], so 1e-5 is relative to the values' scale; observed errors are
// around 1e-7.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/cpu/kv_cache.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/attention_variants.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/layer_kernels.h"
#include "backends/block_tables.h"
#include "backends/kv_blocks.h"
#include "common/error.h"
#include "device_buffer.h"
#include "stream_test.h"
#include "layer_test_util.h"

namespace m40::cuda {
namespace {

using detail::AttentionKernel;
using detail::AttentionPlan;
using test::DeviceBuffer;

struct Heads {
  int n_head;
  int n_head_kv;
  int head_dim;
};

// How the scores are made: the queries' scale (a larger one peaks the
// softmax), the soft-cap and the sliding window (0: off).
struct Scores {
  float q_scale = 1.0f;
  float softcap = 0.0f;
  int window = 0;
};

std::string describe(const Scores& s) {
  std::string d;
  if (s.q_scale != 1.0f) d += ", queries x " + std::to_string(s.q_scale);
  if (s.softcap > 0.0f) d += ", soft-cap " + std::to_string(s.softcap);
  if (s.window > 0) d += ", window " + std::to_string(s.window);
  return d;
}

std::string describe(const Heads& h) {
  return std::to_string(h.n_head) + "/" + std::to_string(h.n_head_kv) + " heads of " + std::to_string(h.head_dim);
}

std::string describe(const AttentionPlan& plan) {
  switch (plan.kernel) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Prefill: return "prefill kernel";
    case AttentionKernel::Decode: {
      std::string d = plan.splits == 0 ? "decode kernel, automatic split"
                                       : "decode kernel, " + std::to_string(plan.splits) + " parts";
      if (plan.heads_per_block > 0) d += ", " + std::to_string(plan.heads_per_block) + " heads a block";
      return d;
    }
  }
  return "?";
}

class Attention : public test::CudaStreamTest {
 protected:

  // A paged cache for n_seq sequences of n_ctx positions: a pool of
  // kSpareBlocks more blocks than they need, all rows random (stored through
  // the CPU's store), each sequence's table a shuffled choice of blocks; its
  // bytes and tables on the GPU; a batch of random queries.
  static constexpr int kSpareBlocks = 5;
  struct Problem {
    Problem(const Heads& h, const Scores& s, int n_seq_, int n_ctx_, int n_tokens_, backend::KvType type_)
        : heads(h), scores(s), n_seq(n_seq_), n_ctx(n_ctx_), n_tokens(n_tokens_), kv_dim(h.n_head_kv * h.head_dim),
          q_dim(h.n_head * h.head_dim), max_blocks(backend::kv_blocks_for(n_ctx_)),
          n_blocks(n_seq_ * max_blocks + kSpareBlocks), type(type_), cache(1, n_blocks, kv_dim, type_),
          tables(n_seq_, n_ctx_, n_blocks), d_k(pool_rows() * kv_row_bytes(format(), kv_dim)),
          d_v(pool_rows() * kv_row_bytes(format(), kv_dim)),
          d_q(static_cast<size_t>(n_tokens_) * q_dim), d_out(static_cast<size_t>(n_tokens_) * q_dim),
          d_seq(static_cast<size_t>(n_tokens_)), d_pos(static_cast<size_t>(n_tokens_)),
          d_tables(static_cast<size_t>(n_seq_) * max_blocks) {}

    size_t pool_rows() const { return static_cast<size_t>(n_blocks) * backend::kKvBlockSize; }

    // The CPU's answer for the batch (seq_ids, positions), uploading both.
    std::vector<float> reference(const std::vector<int32_t>& seq_ids, const std::vector<int32_t>& positions) {
      test::to_device(d_seq, seq_ids);
      test::to_device(d_pos, positions);
      std::vector<float> out(q.size());
      const AttentionShape s = shape();
      cpu::attention(cache, 0, cpu::AttentionShape{s.n_head, s.n_head_kv, s.head_dim, s.scale, s.softcap, s.window},
                     q.data(), seq_ids.data(), positions.data(), n_tokens, tables, out.data(), pool());
      return out;
    }

    KvFormat format() const { return type == backend::KvType::Q8_0 ? KvFormat::Q8_0 : KvFormat::F16; }
    KvLayer layer() const { return KvLayer{d_k.get(), d_v.get(), n_ctx, kv_dim, d_tables.get(), max_blocks, format()}; }
    AttentionShape shape() const {
      return AttentionShape{heads.n_head, heads.n_head_kv, heads.head_dim,
                            1.0f / std::sqrt(static_cast<float>(heads.head_dim)), scores.softcap, scores.window};
    }

    Heads heads;
    Scores scores;
    int n_seq, n_ctx, n_tokens, kv_dim, q_dim, max_blocks, n_blocks;
    backend::KvType type;
    cpu::KvCache cache;
    backend::BlockTables tables;
    std::vector<float> q;
    DeviceBuffer<uint8_t> d_k, d_v;  // the pool's bytes, as the CPU cache holds them
    DeviceBuffer<float> d_q, d_out;
    DeviceBuffer<int32_t> d_seq, d_pos, d_tables;
  };

  static std::unique_ptr<Problem> prepare(const Heads& heads, int n_seq, int n_ctx, int n_tokens,
                                          const Scores& scores = {},
                                          backend::KvType type = backend::KvType::F16) {
    auto p = std::make_unique<Problem>(heads, scores, n_seq, n_ctx, n_tokens, type);
    std::mt19937 rng(static_cast<uint32_t>(n_ctx * 31 + p->kv_dim));
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::vector<float> k(static_cast<size_t>(p->kv_dim)), v(static_cast<size_t>(p->kv_dim));
    for (size_t row = 0; row < p->pool_rows(); ++row) {
      for (auto& x : k) x = unit(rng);
      for (auto& x : v) x = unit(rng);
      p->cache.store(0, static_cast<int64_t>(row), k.data(), v.data());
    }
    shuffle_tables(*p, static_cast<uint32_t>(rng()));
    p->q.resize(static_cast<size_t>(n_tokens) * p->q_dim);
    for (auto& x : p->q) x = scores.q_scale * unit(rng);
    M40_CUDA_CHECK(cudaMemcpy(p->d_k.get(), p->cache.key_bytes(0), p->d_k.bytes(), cudaMemcpyHostToDevice));
    M40_CUDA_CHECK(cudaMemcpy(p->d_v.get(), p->cache.value_bytes(0), p->d_v.bytes(), cudaMemcpyHostToDevice));
    test::to_device(p->d_q, p->q);
    return p;
  }

  // Gives every sequence a new shuffled choice of the pool's blocks, on both
  // sides (the GPU's tables in place, as the backend uploads them).
  static void shuffle_tables(Problem& p, uint32_t seed) {
    std::vector<int32_t> blocks(static_cast<size_t>(p.n_blocks));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), std::mt19937(seed));
    for (int s = 0; s < p.n_seq; ++s) {
      p.tables.set(s, std::span<const int32_t>(blocks.data() + static_cast<size_t>(s) * p.max_blocks, p.max_blocks), 0);
    }
    test::to_device(p.d_tables, p.tables.flat());
  }

  // Runs the batch on the CPU and through every kernel plan, and compares.
  void check(const Heads& heads, int n_seq, int n_ctx, const std::vector<int32_t>& seq_ids,
             const std::vector<int32_t>& positions, const Scores& scores = {}) {
    const int n_tokens = static_cast<int>(seq_ids.size());
    int max_positions = 1;
    for (const int32_t pos : positions) max_positions = std::max(max_positions, pos + 1);
    SCOPED_TRACE(describe(heads) + describe(scores) + ", " + std::to_string(n_tokens) + " tokens, max position " +
                 std::to_string(max_positions - 1) + " of " + std::to_string(n_ctx) +
                 (kv_type_ == backend::KvType::Q8_0 ? ", Q8_0 cache" : ", FP16 cache"));
    auto p = prepare(heads, n_seq, n_ctx, n_tokens, scores, kv_type_);
    const std::vector<float> cpu_out = p->reference(seq_ids, positions);

    const AttentionPlan plans[] = {
        {AttentionKernel::Auto, 0},
        {AttentionKernel::Decode, 0},
        {AttentionKernel::Decode, 1},
        {AttentionKernel::Decode, 7},
        {AttentionKernel::Decode, 0, 2},  // GQA groups split over blocks of 2 heads
        {AttentionKernel::Prefill, 0},
    };
    for (const AttentionPlan& plan : plans) {
      // Sized for the batch, and for the whole context as a decode graph
      // sizes it (each token's parts then follow its own position).
      for (const int sized_for : {max_positions, n_ctx}) {
        SCOPED_TRACE(describe(plan) + ", sized for " + std::to_string(sized_for) + " positions");
        test::poison(p->d_out);
        detail::attention_with_plan(p->layer(), p->shape(), p->d_q.get(), p->d_seq.get(), p->d_pos.get(), n_tokens,
                                    sized_for, p->d_out.get(), stream_, plan);
        M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
        test::expect_close(test::from_device(p->d_out), cpu_out, 1e-5, 1e-5, "attention");
      }
    }
  }

  static cpu::ThreadPool& pool() {
    static cpu::ThreadPool threads;
    return threads;
  }

  backend::KvType kv_type_ = backend::KvType::F16;  // the cache type check() builds
};

// One sequence, one token: decode at positions from the first to the last
// of a 3000-position context (split and unsplit, short and long).
TEST_F(Attention, SingleTokenDecodeAtShortAndLongContexts) {
  for (const Heads heads : {Heads{8, 2, 64}, Heads{8, 2, 128}}) {
    for (const int32_t pos : {0, 1, 200, 255, 256, 1023, 2100, 2999}) {
      check(heads, 1, 3000, {0}, {pos});
    }
  }
}

// A decode batch: one token per sequence, sequences in shuffled order,
// contexts from 1 to the end of the cache.
TEST_F(Attention, MultiSequenceDecodeBatch) {
  check({8, 2, 128}, 6, 3000, {3, 0, 5, 1, 4, 2}, {5, 2500, 0, 300, 1024, 2999});
  check({32, 8, 128}, 4, 1500, {0, 1, 2, 3}, {1499, 17, 700, 1});
}

// Prefill chunks of 1..300 tokens at nonzero starts: causal within the chunk.
TEST_F(Attention, PrefillChunksAtNonzeroStartPositions) {
  for (const int n : {1, 2, 31, 33, 100, 300}) {
    for (const int start : {0, 17, 1500}) {
      std::vector<int32_t> positions(static_cast<size_t>(n));
      std::iota(positions.begin(), positions.end(), start);
      check({8, 2, 64}, 2, 2048, std::vector<int32_t>(static_cast<size_t>(n), 1), positions);
    }
  }
  std::vector<int32_t> positions(300);
  std::iota(positions.begin(), positions.end(), 1748);  // the chunk ends at the last position
  check({8, 2, 128}, 1, 2048, std::vector<int32_t>(300, 0), positions);
}

// A mixed batch in any order: two prefill chunks and two decode tokens,
// shuffled, so that query tiles hold several sequences.
TEST_F(Attention, MixedBatchInAnyOrder) {
  std::vector<int32_t> seq_ids, positions;
  for (int p = 100; p < 140; ++p) {
    seq_ids.push_back(0);
    positions.push_back(p);
  }
  seq_ids.push_back(2);
  positions.push_back(1800);
  for (int p = 0; p < 70; ++p) {
    seq_ids.push_back(1);
    positions.push_back(p);
  }
  seq_ids.push_back(3);
  positions.push_back(5);
  check({8, 2, 64}, 4, 2048, seq_ids, positions);  // in order

  std::vector<size_t> order(seq_ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937(9));
  std::vector<int32_t> s2, p2;
  for (const size_t i : order) {
    s2.push_back(seq_ids[i]);
    p2.push_back(positions[i]);
  }
  check({8, 2, 64}, 4, 2048, s2, p2);
}

// The shared test models' shapes and other head layouts: head_dim 4 and 16,
// a head_dim that is not a power of two, head_dim 256, MQA, three and eight
// query heads per KV head, no GQA.
TEST_F(Attention, OddShapes) {
  const std::vector<int32_t> decode_seq = {1, 0};
  const std::vector<int32_t> decode_pos = {600, 40};
  std::vector<int32_t> prefill_seq(45, 0), prefill_pos(45);
  std::iota(prefill_pos.begin(), prefill_pos.end(), 250);
  for (const Heads heads : {Heads{2, 2, 4}, Heads{8, 4, 16}, Heads{4, 4, 80}, Heads{4, 1, 256}, Heads{6, 2, 64},
                            Heads{8, 1, 128}, Heads{4, 4, 12}, Heads{32, 32, 128}}) {
    check(heads, 2, 700, decode_seq, decode_pos);
    check(heads, 2, 700, prefill_seq, prefill_pos);
  }
}

// Large scores (a peaked softmax) over a long context.
TEST_F(Attention, PeakedSoftmax) {
  check({8, 2, 128}, 1, 2600, {0}, {2599}, Scores{8.0f});
  std::vector<int32_t> positions(64);
  std::iota(positions.begin(), positions.end(), 2000);
  check({8, 2, 128}, 1, 2600, std::vector<int32_t>(64, 0), positions, Scores{8.0f});
}

// Soft-capped scores (gemma2): peaked queries so that the cap bends most
// scores, decode and prefill, and a cap too large to matter.
TEST_F(Attention, SoftCappedScores) {
  std::vector<int32_t> positions(50);
  std::iota(positions.begin(), positions.end(), 700);
  for (const Scores scores : {Scores{8.0f, 2.0f}, Scores{8.0f, 5.0f}, Scores{1.0f, 50.0f}}) {
    check({8, 2, 128}, 2, 1200, {1, 0}, {1199, 3}, scores);
    check({4, 2, 64}, 1, 1200, std::vector<int32_t>(50, 0), positions, scores);
  }
}

// Sliding windows (gemma): decode at positions before, at and past the
// window (the parts split the window only; forced 7 parts included), and
// prefill chunks that start before and after it, windows that are not a
// multiple of the key tile.
TEST_F(Attention, SlidingWindow) {
  for (const int window : {1, 8, 37, 300}) {
    const Scores scores{1.0f, 0.0f, window};
    for (const int32_t pos : {0, window - 1, window, window + 1, 1000, 2999}) {
      check({8, 2, 128}, 1, 3000, {0}, {pos}, scores);
    }
    check({8, 2, 64}, 4, 2048, {3, 0, 2, 1}, {5, 2047, 300, 40}, scores);
    for (const int start : {0, 17, 1500}) {
      std::vector<int32_t> prefill(100);
      std::iota(prefill.begin(), prefill.end(), start);
      check({8, 2, 64}, 1, 2048, std::vector<int32_t>(100, 0), prefill, scores);
    }
  }
  // Gemma2's combination: a window and a soft-cap, a shuffled mixed batch.
  std::vector<int32_t> seq_ids, positions;
  for (int p = 0; p < 45; ++p) {
    seq_ids.push_back(p % 3 == 0 ? 1 : 0);
    positions.push_back(p % 3 == 0 ? 600 + p : 100 + p);
  }
  check({4, 2, 32}, 2, 700, seq_ids, positions, Scores{4.0f, 5.0f, 8});
}

// A Q8_0 cache (kv_dim / 32 blocks a row, 2-byte aligned): the same kernels
// read it through their Q8_0 instantiations. Decode at short and long
// contexts with pieces of 8 and of 4 values, a shuffled decode batch,
// prefill chunks, a mixed batch, GQA layouts, a soft-cap and a window.
TEST_F(Attention, Q8_0CacheMatchesTheCpuOnTheSameBytes) {
  kv_type_ = backend::KvType::Q8_0;
  for (const Heads heads : {Heads{8, 2, 64}, Heads{8, 2, 128}}) {
    for (const int32_t pos : {0, 255, 256, 2999}) check(heads, 1, 3000, {0}, {pos});
  }
  check({8, 2, 128}, 6, 3000, {3, 0, 5, 1, 4, 2}, {5, 2500, 0, 300, 1024, 2999});
  for (const int n : {1, 33, 300}) {
    std::vector<int32_t> positions(static_cast<size_t>(n));
    std::iota(positions.begin(), positions.end(), 17);
    check({8, 2, 64}, 2, 2048, std::vector<int32_t>(static_cast<size_t>(n), 1), positions);
  }
  std::vector<int32_t> seq_ids, positions;
  for (int p = 0; p < 70; ++p) {
    seq_ids.push_back(p % 5 == 0 ? 2 : p % 2);
    positions.push_back(p % 5 == 0 ? 1800 + p : 100 + p);
  }
  check({8, 2, 64}, 3, 2048, seq_ids, positions);
  // head_dim 4 and 12 (pieces of 4 that do not start a block), 80, 256, MQA.
  std::vector<int32_t> prefill_seq(45, 0), prefill_pos(45);
  std::iota(prefill_pos.begin(), prefill_pos.end(), 250);
  for (const Heads heads : {Heads{8, 8, 4}, Heads{8, 8, 12}, Heads{4, 4, 80}, Heads{4, 1, 256}, Heads{8, 1, 128},
                            Heads{6, 2, 64}}) {
    check(heads, 2, 700, {1, 0}, {600, 40});
    check(heads, 2, 700, prefill_seq, prefill_pos);
  }
  check({8, 2, 128}, 2, 1200, {1, 0}, {1199, 3}, Scores{8.0f, 5.0f});
  check({8, 2, 128}, 1, 3000, {0}, {2999}, Scores{1.0f, 0.0f, 300});
  std::vector<int32_t> windowed(100);
  std::iota(windowed.begin(), windowed.end(), 1500);
  check({8, 2, 64}, 1, 2048, std::vector<int32_t>(100, 0), windowed, Scores{1.0f, 0.0f, 37});
}

// The CUDA backend replays decode steps from a graph captured once per batch
// size, with the attention sized for the whole context and the positions read
// from the device: the split's scratch becomes allocation nodes of the graph,
// and each replay must follow the positions it finds.
TEST_F(Attention, DecodeCapturedInAGraphFollowsThePositionsAtReplay) {
  const int n_ctx = 3000;
  // A global layer, and a windowed one (its parts split the window only,
  // whatever position each replay brings).
  for (const Scores scores : {Scores{}, Scores{1.0f, 0.0f, 300}}) {
    SCOPED_TRACE(describe(scores));
    auto p = prepare(Heads{8, 2, 128}, 3, n_ctx, 3, scores);
    const std::vector<int32_t> seq_ids = {2, 0, 1};
    cudaGraph_t graph = nullptr;
    M40_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      attention(p->layer(), p->shape(), p->d_q.get(), p->d_seq.get(), p->d_pos.get(), 3, n_ctx, p->d_out.get(),
                stream_);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    M40_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    cudaGraphDestroy(graph);
    M40_CUDA_CHECK(status);
    int replay = 0;
    for (const std::vector<int32_t>& positions :
         {std::vector<int32_t>{10, 2999, 500}, std::vector<int32_t>{11, 0, 2048}, std::vector<int32_t>{1700, 1, 63},
          std::vector<int32_t>{1700, 1, 63}}) {
      // The last replay after new tables in the same buffer (set_blocks).
      if (++replay == 4) shuffle_tables(*p, 1234);
      SCOPED_TRACE("replay " + std::to_string(replay) + ", positions " + std::to_string(positions[0]) + ", " +
                   std::to_string(positions[1]) + ", " + std::to_string(positions[2]));
      const std::vector<float> cpu_out = p->reference(seq_ids, positions);
      test::poison(p->d_out);
      M40_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
      test::expect_close(test::from_device(p->d_out), cpu_out, 1e-5, 1e-5, "attention");
    }
    M40_CUDA_CHECK(cudaGraphExecDestroy(exec));
  }
}

TEST_F(Attention, PositionsOutsideTheContextGiveNaN) {
  const int n_ctx = 16, head_dim = 64;
  DeviceBuffer<int32_t> d_table(1);
  test::to_device(d_table, std::vector<int32_t>{0});
  DeviceBuffer<uint16_t> d_k(n_ctx * head_dim), d_v(n_ctx * head_dim);
  M40_CUDA_CHECK(cudaMemset(d_k.get(), 0, d_k.bytes()));
  M40_CUDA_CHECK(cudaMemset(d_v.get(), 0, d_v.bytes()));
  const std::vector<int32_t> seq_ids = {0, 0, 0};
  const std::vector<int32_t> positions = {3, 16, -1};
  DeviceBuffer<int32_t> d_seq(3), d_pos(3);
  test::to_device(d_seq, seq_ids);
  test::to_device(d_pos, positions);
  DeviceBuffer<float> d_q(3 * head_dim), d_out(3 * head_dim);
  M40_CUDA_CHECK(cudaMemset(d_q.get(), 0, d_q.bytes()));
  AttentionShape shape{1, 1, head_dim, 0.125f};
  for (const AttentionPlan plan : {AttentionPlan{AttentionKernel::Decode, 1}, AttentionPlan{AttentionKernel::Decode, 2},
                                   AttentionPlan{AttentionKernel::Prefill, 0}}) {
    SCOPED_TRACE(describe(plan));
    M40_CUDA_CHECK(cudaMemset(d_out.get(), 0, d_out.bytes()));
    detail::attention_with_plan(KvLayer{d_k.get(), d_v.get(), n_ctx, head_dim, d_table.get(), 1}, shape, d_q.get(),
                                d_seq.get(),
                                d_pos.get(), 3, n_ctx, d_out.get(), stream_, plan);
    const auto out = test::from_device(d_out);
    for (int d = 0; d < head_dim; ++d) {
      EXPECT_EQ(out[static_cast<size_t>(d)], 0.0f);  // zero values, zero output
      EXPECT_TRUE(std::isnan(out[static_cast<size_t>(head_dim + d)]));
      EXPECT_TRUE(std::isnan(out[static_cast<size_t>(2 * head_dim + d)]));
    }
  }
}

TEST(AttentionArguments, HeadDimsTheKernelsTake) {
  for (const int head_dim : {4, 12, 32, 80, 128, 136, 192, 256}) EXPECT_TRUE(attention_head_dim_supported(head_dim));
  for (const int head_dim : {0, 6, 130, 132, 260}) EXPECT_FALSE(attention_head_dim_supported(head_dim)) << head_dim;
}

// Shape errors are found before any CUDA call: these run without a GPU.
TEST(AttentionArguments, ShapeErrorsNameTheProblem) {
  alignas(16) static float buffer[64];
  alignas(16) static uint16_t cache[64];
  static const int32_t table[1] = {0};
  const KvLayer layer{cache, cache, 4, 16, table, 1};
  EXPECT_THROW(attention(layer, AttentionShape{6, 4, 4, 0.5f}, buffer, nullptr, nullptr, 1, 1, buffer, nullptr),
               Error);  // 6 heads over 4 KV heads
  EXPECT_THROW(attention(KvLayer{cache, cache, 4, 12, table, 1}, AttentionShape{2, 2, 6, 0.5f}, buffer, nullptr,
                         nullptr, 1, 1, buffer, nullptr),
               Error);  // head_dim not a multiple of 4
  EXPECT_THROW(attention(KvLayer{cache, cache, 4, 16}, AttentionShape{4, 4, 4, 0.5f}, buffer, nullptr, nullptr, 1, 1,
                         buffer, nullptr),
               Error);  // no block tables
  EXPECT_THROW(attention(KvLayer{cache, cache, 40, 16, table, 1}, AttentionShape{4, 4, 4, 0.5f}, buffer, nullptr,
                         nullptr, 1, 1, buffer, nullptr),
               Error);  // tables of 1 entry for a context of 3 blocks
  EXPECT_THROW(attention(layer, AttentionShape{4, 2, 4, 0.5f}, buffer, nullptr, nullptr, 1, 1, buffer, nullptr),
               Error);  // kv_dim 16 is not 2 x 4
  EXPECT_THROW(attention(layer, AttentionShape{4, 4, 4, 0.5f}, buffer + 1, nullptr, nullptr, 1, 1, buffer, nullptr),
               Error);  // q not 16-byte aligned
  EXPECT_THROW(attention(layer, AttentionShape{4, 4, 4, 0.5f, -1.0f}, buffer, nullptr, nullptr, 1, 1, buffer, nullptr),
               Error);  // a negative soft-cap
  EXPECT_THROW(attention(layer, AttentionShape{4, 4, 4, 0.5f, 0.0f, -8}, buffer, nullptr, nullptr, 1, 1, buffer,
                         nullptr),
               Error);  // a negative window
  EXPECT_NO_THROW(attention(layer, AttentionShape{4, 4, 4, 0.5f}, buffer, nullptr, nullptr, 0, 1, buffer, nullptr));
}

}  // namespace
}  // namespace m40::cuda

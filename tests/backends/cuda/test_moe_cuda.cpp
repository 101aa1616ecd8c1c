// The mixture-of-experts kernels (moe.h, grouped_matmul) against their CPU
// twins on random inputs, outputs poisoned with NaN first: the routing
// against cpu::route_experts, the grouping against the order it promises,
// the grouped products against cpu::matmul of each chosen expert, in every
// GPU weight type and for every kernel the token count picks, and the
// combination against the weighted sum. The whole MoE FFN is compared with
// the CPU engine in test_cuda_backend.cpp (the tiny MoE models).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/moe.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/device.h"
#include "backends/cuda/moe.h"
#include "layer_test_util.h"
#include "model/weights.h"
#include "random_weights.h"

namespace m40::cuda {
namespace {

using test::DeviceBuffer;
using test::from_device;
using test::poison;
using test::to_device;

bool have_gpu() { return device_count() > 0; }

// Random expert choices, each token's k experts distinct, some experts
// chosen by many tokens (a skewed router) so that items split.
std::vector<int32_t> random_choices(int n_tokens, int k, int n_expert, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  std::vector<int32_t> experts(n_expert);
  for (int t = 0; t < n_tokens; ++t) {
    for (int e = 0; e < n_expert; ++e) experts[e] = e;
    // Expert 0 and 1 first half the time: popular experts.
    if (rng() % 2 == 0) {
      std::shuffle(experts.begin() + std::min(2, k), experts.end(), rng);
    } else {
      std::shuffle(experts.begin(), experts.end(), rng);
    }
    ids.insert(ids.end(), experts.begin(), experts.begin() + k);
  }
  return ids;
}

TEST(MoeCuda, RoutingMatchesTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    int n_tokens, n_expert, k;
  };
  for (const Case c : {Case{1, 8, 2}, Case{7, 4, 2}, Case{33, 128, 8}, Case{300, 60, 4}, Case{5, 40, 33},
                       Case{3, 1024, 8}, Case{9, 5, 5}}) {
    for (const bool renormalize : {true, false}) {  // qwen3moe and Mixtral; qwen2moe
      SCOPED_TRACE(std::to_string(c.n_tokens) + " tokens, " + std::to_string(c.n_expert) + " experts, k " +
                   std::to_string(c.k) + (renormalize ? ", renormalized" : ", as the softmax gives them"));
      // Logits of a real router's spread (several units), never equal.
      const auto logits = test::random_floats(static_cast<size_t>(c.n_tokens) * c.n_expert, -4.0f, 4.0f,
                                              static_cast<uint32_t>(c.n_expert * 31 + c.k));
      std::vector<cpu::ExpertChoice> want(static_cast<size_t>(c.n_tokens) * c.k);
      for (int t = 0; t < c.n_tokens; ++t) {
        cpu::route_experts(logits.data() + static_cast<size_t>(t) * c.n_expert, c.n_expert, c.k, renormalize,
                           want.data() + t * c.k);
      }
      DeviceBuffer<float> d_logits(logits.size());
      DeviceBuffer<int32_t> d_ids(want.size());
      DeviceBuffer<float> d_weights(want.size());
      to_device(d_logits, logits);
      poison(d_ids);
      poison(d_weights);
      route_experts(d_logits.get(), c.n_tokens, c.n_expert, c.k, renormalize, d_ids.get(), d_weights.get(), nullptr);
      const auto ids = from_device(d_ids);
      const auto weights = from_device(d_weights);
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const bool ok = ids[i] == want[i].expert && std::fabs(weights[i] - want[i].weight) <= 1e-6f + 1e-5f * want[i].weight;
        if (!ok && ++bad <= 5) {
          ADD_FAILURE() << "token " << i / c.k << " slot " << i % c.k << ": GPU expert " << ids[i] << " weight "
                        << weights[i] << ", CPU expert " << want[i].expert << " weight " << want[i].weight;
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(MoeCuda, RoutingRefusesBadArguments) {
  EXPECT_THROW(route_experts(nullptr, 1, 0, 1, true, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(route_experts(nullptr, 1, kMaxExperts + 1, 1, true, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(route_experts(nullptr, 1, 8, 9, true, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(route_and_group(nullptr, 1, 8, 9, true, 1, 8, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
               Error);
  EXPECT_THROW(group_by_expert(nullptr, 8, kMaxExperts + 1, 1, 1, 8, nullptr, nullptr, nullptr, nullptr), Error);
  DeviceWeight w{test::TensorType::F32, 32, 64, 128, nullptr};
  // Items of two tokens cannot read x by token; 64 rows are not 3 experts.
  EXPECT_THROW(grouped_matmul(w, 4, nullptr, true, 2, nullptr, 0, nullptr, nullptr), Error);
  EXPECT_THROW(grouped_matmul(w, 3, nullptr, false, 1, nullptr, 0, nullptr, nullptr), Error);
}

TEST(MoeCuda, ItemSizesFollowTheTokensPerExpert) {
  // A GPU of few SMs (an M40): the decode kernel up to shares of 16.
  const int few = expert_tile_share(test::TensorType::Q4_K, 24);
  EXPECT_EQ(few, 16);
  EXPECT_EQ(expert_item_tokens(1, 8, 128, few), 1);
  EXPECT_EQ(expert_item_tokens(32, 8, 128, few), 2);
  EXPECT_EQ(expert_item_tokens(8, 2, 8, few), 2);
  EXPECT_EQ(expert_item_tokens(32, 2, 8, few), 4);   // 8 each: items of 4
  EXPECT_EQ(expert_item_tokens(64, 2, 8, few), 4);   // 16 each
  EXPECT_EQ(expert_item_tokens(65, 2, 8, few), 32);  // 17 each: the 32-token tile
  EXPECT_EQ(expert_item_tokens(512, 8, 128, few), 32);
  EXPECT_EQ(expert_item_tokens(513, 8, 128, few), kMaxExpertGemmTokens);
  // Many SMs: tiles from shares past 4 (past 8 for Q8_0, whose tile loads
  // are slow), the smallest tile that holds the share.
  const int many = expert_tile_share(test::TensorType::Q4_K, 132);
  EXPECT_EQ(many, kMaxExpertMatvecTokens);
  EXPECT_EQ(expert_tile_share(test::TensorType::Q8_0, 132), 2 * kMaxExpertMatvecTokens);
  EXPECT_EQ(expert_item_tokens(16, 8, 128, many), 1);    // 1 each
  EXPECT_EQ(expert_item_tokens(64, 8, 128, many), 4);    // 4 each
  EXPECT_EQ(expert_item_tokens(128, 8, 128, many), 16);  // 8 each
  EXPECT_EQ(expert_item_tokens(256, 8, 128, many), 16);
  EXPECT_EQ(expert_item_tokens(257, 8, 128, many), 32);
  EXPECT_EQ(expert_item_tokens(128, 8, 128, 2 * kMaxExpertMatvecTokens), 4);
  // Never fewer items than a step can make: every expert once, plus one
  // per item_tokens slots (checked against the worst case here, all slots
  // on as many experts as possible).
  EXPECT_EQ(max_expert_items(1, 8, 128, 1), 8);
  EXPECT_EQ(max_expert_items(32, 8, 128, 2), (256 + 128) / 2);  // 128 experts with 1 or 3 slots each
  EXPECT_EQ(max_expert_items(512, 8, 128, 64), (4096 + 128 * 63) / 64);
  EXPECT_EQ(max_expert_items(3, 2, 8, 4), 6);  // never more than the slots
}

// The grid's item count (max_expert_items) is never below the items a step
// makes, whatever the routing: every expert chosen, one expert taking every
// token, skewed and even spreads (group_by_expert would drop the items past
// it). Host arithmetic only.
TEST(MoeCuda, NoRoutingMakesMoreItemsThanTheGridHas) {
  std::mt19937 rng(11);
  for (const auto& [k, n_expert] : {std::pair{1, 4}, std::pair{2, 8}, std::pair{8, 128}, std::pair{4, 60}}) {
    for (int n_tokens = 1; n_tokens <= 600; n_tokens += n_tokens < 40 ? 1 : 37) {
      for (const int tile_share : {kMaxExpertMatvecTokens, 2 * kMaxExpertMatvecTokens, 4 * kMaxExpertMatvecTokens}) {
      const int item_tokens = expert_item_tokens(n_tokens, k, n_expert, tile_share);
      const int bound = max_expert_items(n_tokens, k, n_expert, item_tokens);
      for (int pattern = 0; pattern < 4; ++pattern) {
        std::vector<int> count(n_expert, 0);
        for (int t = 0; t < n_tokens; ++t) {
          for (int i = 0; i < k; ++i) {
            // 0: the same k experts for every token; 1: round robin (even);
            // 2: skewed random; 3: each expert's count one past a multiple
            // of item_tokens where it can be (the most items per slot).
            int e = i;
            if (pattern == 1) e = (t * k + i) % n_expert;
            if (pattern == 2) e = (i + static_cast<int>(rng() % (rng() % 2 == 0 ? 3 : n_expert - i))) % n_expert;
            if (pattern == 3) e = ((t * k + i) / (item_tokens + 1)) % n_expert;
            ++count[e];
          }
        }
        int items = 0;
        for (const int c : count) items += (c + item_tokens - 1) / item_tokens;
        EXPECT_LE(items, bound) << n_tokens << " tokens, k " << k << ", " << n_expert << " experts, pattern "
                                << pattern << ", items of " << item_tokens;
      }
      }
    }
  }
}

// Checks what group_by_expert promises for `ids` against a host ordering.
// With logits, the routing runs first (route_and_group: one fused block
// up to kMaxFusedRouteTokens tokens) and `ids` is the CPU's routing of them.
void expect_grouping(const std::vector<int32_t>& ids, int k, int n_expert, int item_tokens,
                     const std::vector<float>* logits = nullptr, bool renormalize = true,
                     const std::vector<float>* weights = nullptr) {
  const int n_slots = static_cast<int>(ids.size());
  const int n_tokens = n_slots / k;
  const int n_items = max_expert_items(n_tokens, k, n_expert, item_tokens) + 3;  // spare items must be marked empty
  DeviceBuffer<int32_t> d_ids(ids.size()), d_sorted(ids.size()), d_rows(ids.size());
  DeviceBuffer<ExpertItem> d_items(static_cast<size_t>(n_items));
  poison(d_sorted);
  poison(d_rows);
  poison(d_items);
  if (logits != nullptr) {
    DeviceBuffer<float> d_logits(logits->size()), d_weights(ids.size());
    to_device(d_logits, *logits);
    poison(d_ids);
    poison(d_weights);
    route_and_group(d_logits.get(), n_tokens, n_expert, k, renormalize, item_tokens, n_items, d_ids.get(),
                    d_weights.get(), d_sorted.get(), d_rows.get(), d_items.get(), nullptr);
    EXPECT_EQ(from_device(d_ids), ids) << "the routing";
    if (weights != nullptr) test::expect_close(from_device(d_weights), *weights, 1e-6, 1e-5, "the routing's weights");
  } else {
    to_device(d_ids, ids);
    group_by_expert(d_ids.get(), n_slots, n_expert, k, item_tokens, n_items, d_sorted.get(), d_rows.get(),
                    d_items.get(), nullptr);
  }
  const auto sorted = from_device(d_sorted);
  const auto rows = from_device(d_rows);
  const auto items = from_device(d_items);

  // Host order: by expert, then slot.
  std::vector<int32_t> want_sorted(n_slots);
  for (int s = 0; s < n_slots; ++s) want_sorted[s] = s;
  std::stable_sort(want_sorted.begin(), want_sorted.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  EXPECT_EQ(sorted, want_sorted);
  for (int r = 0; r < n_slots; ++r) EXPECT_EQ(rows[want_sorted[r]], r) << "slot " << want_sorted[r];
  std::vector<ExpertItem> want_items;
  for (int r = 0; r < n_slots;) {
    const int e = ids[want_sorted[r]];
    int end = r;
    while (end < n_slots && ids[want_sorted[end]] == e) ++end;
    for (int first = r; first < end; first += item_tokens) {
      want_items.push_back(ExpertItem{e, first, std::min(item_tokens, end - first), want_sorted[first] / k});
    }
    r = end;
  }
  ASSERT_LE(static_cast<int>(want_items.size()), n_items);
  for (int i = 0; i < n_items; ++i) {
    SCOPED_TRACE("item " + std::to_string(i));
    if (i < static_cast<int>(want_items.size())) {
      EXPECT_EQ(items[i].expert, want_items[i].expert);
      EXPECT_EQ(items[i].first, want_items[i].first);
      EXPECT_EQ(items[i].count, want_items[i].count);
      EXPECT_EQ(items[i].token, want_items[i].token);
    } else {
      EXPECT_EQ(items[i].expert, -1);
    }
  }
}

TEST(MoeCuda, GroupingOrdersSlotsByExpertAndCutsItems) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  for (const int item_tokens : {1, 2, 8, 64}) {
    SCOPED_TRACE(std::to_string(item_tokens) + " tokens per item");
    expect_grouping(random_choices(1, 8, 128, 1), 8, 128, item_tokens);
    expect_grouping(random_choices(32, 8, 128, 2), 8, 128, item_tokens);
    expect_grouping(random_choices(513, 8, 128, 3), 8, 128, item_tokens);  // 4104 slots: many ballot rounds
    expect_grouping(random_choices(40, 2, 8, 4), 2, 8, item_tokens);
    expect_grouping(random_choices(3, 3, 1000, 5), 3, 1000, item_tokens);
    // Past 64 slots: each warp's range placed from its counts where those fit
    // in shared memory (256 experts), the ballot passes where they do not
    // (700 experts: 16 warps' counts take 44.8 KB).
    expect_grouping(random_choices(200, 3, 256, 6), 3, 256, item_tokens);
    expect_grouping(random_choices(200, 3, 700, 7), 3, 700, item_tokens);
  }
}

// route_and_group: the fused block (up to 32 tokens; its grouping one
// thread per expert up to 256 slots, one warp per expert past them) and the
// two kernels past it route as the CPU does and group as group_by_expert
// promises.
TEST(MoeCuda, RouteAndGroupRoutesAsTheCpuAndGroups) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    int n_tokens, n_expert, k;
  };
  for (const Case c : {Case{1, 128, 8}, Case{8, 128, 8}, Case{32, 128, 8}, Case{33, 128, 8}, Case{17, 8, 2},
                       Case{2, 1024, 8}, Case{5, 40, 33}, Case{32, 64, 16}, Case{100, 60, 4}}) {
    SCOPED_TRACE(std::to_string(c.n_tokens) + " tokens, " + std::to_string(c.n_expert) + " experts, k " +
                 std::to_string(c.k));
    const auto logits = test::random_floats(static_cast<size_t>(c.n_tokens) * c.n_expert, -4.0f, 4.0f,
                                            static_cast<uint32_t>(c.n_tokens + c.n_expert));
    for (const bool renormalize : {true, false}) {
      std::vector<int32_t> ids;
      std::vector<float> weights;
      std::vector<cpu::ExpertChoice> choice(c.k);
      for (int t = 0; t < c.n_tokens; ++t) {
        cpu::route_experts(logits.data() + static_cast<size_t>(t) * c.n_expert, c.n_expert, c.k, renormalize,
                           choice.data());
        for (const auto& ch : choice) ids.push_back(ch.expert), weights.push_back(ch.weight);
      }
      expect_grouping(ids, c.k, c.n_expert, expert_item_tokens(c.n_tokens, c.k, c.n_expert, 4 * kMaxExpertMatvecTokens),
                      &logits, renormalize, &weights);
    }
  }
}

// grouped_matmul of random stacked experts against cpu::matmul of each
// slot's expert, for n_tokens tokens choosing k of n_expert each.
// With x_by_token (items of one token only), x holds the tokens and each
// item reads its token's row, as the FFN's decode steps do. tile_share:
// expert_item_tokens's (4 x kMaxExpertMatvecTokens: a GPU of few SMs).
void expect_grouped_product(test::TensorType type, int64_t rows, int64_t cols, int n_expert, int n_tokens, int k,
                            cpu::ThreadPool& pool, bool x_by_token = false,
                            int tile_share = 4 * kMaxExpertMatvecTokens) {
  const int item_tokens = x_by_token ? 1 : expert_item_tokens(n_tokens, k, n_expert, tile_share);
  SCOPED_TRACE(std::string(gguf::tensor_type_name(type)) + " " + std::to_string(rows) + " x " + std::to_string(cols) +
               ", " + std::to_string(n_expert) + " experts, " + std::to_string(n_tokens) + " tokens, k " +
               std::to_string(k) + (x_by_token ? ", x by token" : "") + ", items of " + std::to_string(item_tokens));
  const test::HostWeight w = test::random_weight(type, rows * n_expert, cols, static_cast<uint32_t>(rows + cols));
  const auto ids = random_choices(n_tokens, k, n_expert, static_cast<uint32_t>(n_tokens));
  const int n_slots = n_tokens * k;
  const int n_items = max_expert_items(n_tokens, k, n_expert, item_tokens);
  // Rows in expert order, as the FFN gathers them (or the tokens' rows).
  const auto x = test::random_activations(static_cast<size_t>(x_by_token ? n_tokens : n_slots) * cols, 17);

  DeviceBuffer<uint8_t> d_w(w.bytes.size());
  DeviceBuffer<int32_t> d_ids(ids.size()), d_sorted(ids.size()), d_rows(ids.size());
  DeviceBuffer<ExpertItem> d_items(static_cast<size_t>(n_items));
  DeviceBuffer<float> d_x(x.size()), d_y(static_cast<size_t>(n_slots) * rows);
  M40_CUDA_CHECK(cudaMemcpy(d_w.get(), w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice));
  to_device(d_ids, ids);
  to_device(d_x, x);
  poison(d_y);
  group_by_expert(d_ids.get(), n_slots, n_expert, k, item_tokens, n_items, d_sorted.get(), d_rows.get(),
                  d_items.get(), nullptr);
  DeviceWeight dw{type, cols, rows * n_expert, w.row_bytes, d_w.get()};
  grouped_matmul(dw, n_expert, d_x.get(), x_by_token, item_tokens, d_items.get(), n_items, d_y.get(), nullptr);
  const auto y = from_device(d_y);
  const auto sorted = from_device(d_sorted);

  std::vector<float> want(y.size());
  std::vector<double> abs_sum(y.size());  // Σ |w x| of each output: the size of what it is summed from
  for (int r = 0; r < n_slots; ++r) {
    const int e = ids[sorted[r]];
    model::WeightView view;
    view.type = type;
    view.rows = static_cast<uint64_t>(rows);
    view.cols = static_cast<uint64_t>(cols);
    view.row_bytes = w.row_bytes;
    view.data = w.bytes.data() + static_cast<size_t>(e) * rows * w.row_bytes;
    const float* x_row = x.data() + static_cast<size_t>(x_by_token ? sorted[r] / k : r) * cols;
    cpu::matmul(view, x_row, 1, want.data() + static_cast<size_t>(r) * rows, pool);
    for (int64_t i = 0; i < rows; ++i) {
      double sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) sum += std::fabs(w.values[(e * rows + i) * cols + c] * x_row[c]);
      abs_sum[static_cast<size_t>(r) * rows + i] = sum;
    }
  }
  // Rounding only, as in test_matmul.cpp: a few units of FP32 rounding
  // times sqrt(cols) times the output's Σ |w x|. A wrong expert, row or
  // block is off by about Σ |w x| / cols, far above it; NaN (unwritten) fails.
  constexpr double kUnitRoundoff = 1.0 / (1 << 24);
  int failures = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double bound = 4.0 * kUnitRoundoff * std::sqrt(static_cast<double>(cols)) * abs_sum[i] +
                         2.0 * kUnitRoundoff * std::fabs(want[i]);
    const double diff = std::fabs(static_cast<double>(y[i]) - want[i]);
    if (!(diff <= bound) && ++failures <= 5) {
      ADD_FAILURE() << "sorted row " << i / rows << " (expert " << ids[sorted[i / rows]] << ") row " << i % rows
                    << ": GPU " << y[i] << ", CPU " << want[i] << ", |diff| " << diff << " > " << bound;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(MoeCuda, GroupedProductsMatchTheCpuInEveryType) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  cpu::ThreadPool pool(2);
  for (const test::TensorType type : test::all_types()) {
    const int64_t cols = gguf::tensor_type_traits(type).block_size <= 32 ? 96 : 512;
    // Items of 1 token (the wide decoders; x gathered or read in place),
    // 2 and 4 (experts chosen more often than that split into several
    // items), and the gemm tiles: of 32 (16 experts of 2 chosen at 160
    // tokens, Mixtral-like 4 of 2 at 40: shares of 20), of 64 (16 of 2 at
    // 300: 38), and on a GPU of many SMs of 16 (16 of 2 at 40: 5); rows not
    // a multiple of the tiles.
    expect_grouped_product(type, 64, cols, 16, 1, 2, pool);
    expect_grouped_product(type, 64, cols, 16, 1, 2, pool, true);
    expect_grouped_product(type, 64, cols, 16, 3, 4, pool, true);  // some experts chosen twice: items of one token
    expect_grouped_product(type, 64, cols, 16, 12, 2, pool);
    expect_grouped_product(type, 96, cols, 16, 32, 4, pool);
    expect_grouped_product(type, 130, cols, 16, 160, 2, pool);
    expect_grouped_product(type, 64, cols, 4, 40, 2, pool);
    expect_grouped_product(type, 130, cols, 16, 300, 2, pool);
    expect_grouped_product(type, 130, cols, 16, 40, 2, pool, false, kMaxExpertMatvecTokens);
    // Rows of every width class of the decode kernel's lane groups (16, 32,
    // 64 or 128 lanes a row by its units; an expert's down product of
    // Qwen3-30B-A3B has 768 columns), at items of one and two tokens.
    for (const int64_t wide_cols : {int64_t{768}, int64_t{2048}, int64_t{2304}}) {
      expect_grouped_product(type, 64, wide_cols, 16, 1, 2, pool, true);
      expect_grouped_product(type, 64, wide_cols, 16, 12, 2, pool);
    }
  }
}

TEST(MoeCuda, GroupedProductsOfOddShapesTakeTheScalarKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  cpu::ThreadPool pool(2);
  // 40 columns: no 16-value units, so neither the decode nor the gemm kernel.
  for (const int n_tokens : {1, 9, 100}) expect_grouped_product(test::TensorType::F32, 24, 40, 6, n_tokens, 3, pool);
  expect_grouped_product(test::TensorType::F32, 24, 40, 6, 5, 3, pool, true);
}

// combine_experts for n_tokens tokens of k slots: plain, into the residual,
// with a shared expert, and with the next layer's norm.
void check_combine(int n_tokens, int k, int n_embd) {
  SCOPED_TRACE(std::to_string(n_tokens) + " tokens, k " + std::to_string(k));
  const int n_slots = n_tokens * k;
  // Rounding of k products summed in slot order (the GPU may fuse a product
  // into its add): a unit of FP32 rounding per slot of sums of a few units.
  const double tol = 1e-6 * std::max(1, k / 3);
  const auto out = test::random_floats(static_cast<size_t>(n_slots) * n_embd, -2.0f, 2.0f, 1);
  const auto weights = test::random_floats(n_slots, 0.05f, 1.0f, 2);
  const auto residual = test::random_floats(static_cast<size_t>(n_tokens) * n_embd, -1.0f, 1.0f, 3);
  std::vector<int32_t> slot_rows(n_slots);
  for (int s = 0; s < n_slots; ++s) slot_rows[s] = s;
  std::shuffle(slot_rows.begin(), slot_rows.end(), std::mt19937(4));
  std::vector<float> want(residual.size()), want_plain(residual.size());
  for (int t = 0; t < n_tokens; ++t) {
    for (int j = 0; j < n_embd; ++j) {
      float sum = 0.0f;
      for (int s = 0; s < k; ++s) sum += weights[t * k + s] * out[static_cast<size_t>(slot_rows[t * k + s]) * n_embd + j];
      want_plain[t * n_embd + j] = sum;
      want[t * n_embd + j] = residual[t * n_embd + j] + sum;
    }
  }
  DeviceBuffer<float> d_out(out.size()), d_weights(weights.size()), d_y(residual.size());
  DeviceBuffer<int32_t> d_rows(slot_rows.size());
  to_device(d_out, out);
  to_device(d_weights, weights);
  to_device(d_rows, slot_rows);
  poison(d_y);
  combine_experts(d_out.get(), d_rows.get(), d_weights.get(), n_tokens, k, n_embd, {}, d_y.get(), nullptr, nullptr);
  test::expect_close(from_device(d_y), want_plain, tol, tol, "combine");
  to_device(d_y, residual);
  combine_experts(d_out.get(), d_rows.get(), d_weights.get(), n_tokens, k, n_embd, {}, d_y.get(), d_y.get(), nullptr);
  test::expect_close(from_device(d_y), want, tol, tol, "combine into the residual");

  // A shared expert's output (qwen2moe), gated by sigmoid of its logit.
  const auto shared_out = test::random_floats(residual.size(), -2.0f, 2.0f, 7);
  const auto gate_logit = test::random_floats(n_tokens, -3.0f, 3.0f, 8);
  std::vector<float> want_shared(residual.size());
  for (int t = 0; t < n_tokens; ++t) {
    const float scale = 1.0f / (1.0f + std::exp(-gate_logit[t]));
    for (int j = 0; j < n_embd; ++j) {
      want_shared[t * n_embd + j] = residual[t * n_embd + j] + (want_plain[t * n_embd + j] + shared_out[t * n_embd + j] * scale);
    }
  }
  DeviceBuffer<float> d_shared(shared_out.size()), d_logit(gate_logit.size());
  to_device(d_shared, shared_out);
  to_device(d_logit, gate_logit);
  to_device(d_y, residual);
  combine_experts(d_out.get(), d_rows.get(), d_weights.get(), n_tokens, k, n_embd, {d_shared.get(), d_logit.get()},
                  d_y.get(), d_y.get(), nullptr);
  test::expect_close(from_device(d_y), want_shared, tol, tol, "combine with a shared expert");
  EXPECT_THROW(combine_experts(d_out.get(), d_rows.get(), d_weights.get(), n_tokens, k, n_embd, {d_shared.get(), nullptr},
                               d_y.get(), nullptr, nullptr),
               Error);

  // With the next layer's norm (one block a token): y as above, and
  // rms_norm(y) * weight, against cpu::rms_norm of the CPU's y.
  const float eps = 1e-6f;
  const auto norm_w = test::random_floats(n_embd, 0.5f, 1.5f, 9);
  std::vector<float> want_norm(residual.size());
  for (int t = 0; t < n_tokens; ++t) {
    cpu::rms_norm(want_shared.data() + t * n_embd, norm_w.data(), want_norm.data() + t * n_embd, n_embd, eps);
  }
  DeviceBuffer<float> d_norm_w(norm_w.size()), d_next(residual.size());
  to_device(d_norm_w, norm_w);
  to_device(d_y, residual);
  poison(d_next);
  combine_experts(d_out.get(), d_rows.get(), d_weights.get(), n_tokens, k, n_embd, {d_shared.get(), d_logit.get()},
                  d_y.get(), d_y.get(), nullptr, NextNorm{d_norm_w.get(), d_next.get()}, eps);
  test::expect_close(from_device(d_y), want_shared, tol, tol, "combine, then the next norm: y");
  test::expect_close(from_device(d_next), want_norm, 1e-5, tol, "combine, then the next norm: its output");
}

TEST(MoeCuda, CombineAddsTheWeightedSlotsToTheResidual) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  check_combine(37, 3, 72);
  check_combine(1, 8, 2048);  // a Qwen3-30B-A3B decode step
  check_combine(2, 8, 4096);  // Mixtral's width: the widest row the fused norm keeps in registers
  check_combine(2, 4, 5120);  // wider: the row read back for the norm
  check_combine(2, 70, 72);   // more slots than the fused norm keeps: the norm on its own
}

TEST(MoeCuda, GatherCopiesEachSlotsTokenRow) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  const int n_tokens = 11, k = 4, n_embd = 64, n_slots = n_tokens * k;
  const auto x = test::random_floats(static_cast<size_t>(n_tokens) * n_embd, -1.0f, 1.0f, 5);
  std::vector<int32_t> sorted(n_slots);
  for (int s = 0; s < n_slots; ++s) sorted[s] = s;
  std::shuffle(sorted.begin(), sorted.end(), std::mt19937(6));
  DeviceBuffer<float> d_x(x.size()), d_out(static_cast<size_t>(n_slots) * n_embd);
  DeviceBuffer<int32_t> d_sorted(sorted.size());
  to_device(d_x, x);
  to_device(d_sorted, sorted);
  poison(d_out);
  gather_expert_rows(d_x.get(), d_sorted.get(), k, n_slots, n_embd, d_out.get(), nullptr);
  const auto out = from_device(d_out);
  for (int r = 0; r < n_slots; ++r) {
    for (int j = 0; j < n_embd; ++j) {
      ASSERT_EQ(out[static_cast<size_t>(r) * n_embd + j], x[static_cast<size_t>(sorted[r] / k) * n_embd + j]) << r;
    }
  }
}

}  // namespace
}  // namespace m40::cuda

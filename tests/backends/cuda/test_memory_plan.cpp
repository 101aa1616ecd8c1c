// The memory plan is computed and checked on the host, before any GPU work:
// these tests need no GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "backends/cuda/memory_plan.h"
#include "common/memory_size.h"
#include "model/loaded_model.h"
#include "test_paths.h"

using namespace m40;

TEST(MemoryPlan, ParsesSizesInBinaryUnits) {
  EXPECT_EQ(parse_memory_size("24G"), 24ull << 30);
  EXPECT_EQ(parse_memory_size("24GiB"), 24ull << 30);
  EXPECT_EQ(parse_memory_size("512m"), 512ull << 20);
  EXPECT_EQ(parse_memory_size("1.5G"), 3ull << 29);
  EXPECT_EQ(parse_memory_size("4096"), 4096u);
  EXPECT_THROW(parse_memory_size("lots"), Error);
  EXPECT_THROW(parse_memory_size("12X"), Error);
  EXPECT_THROW(parse_memory_size("-3G"), Error);
}

TEST(MemoryPlan, CountsWeightsKvCacheAndScratch) {
  auto path = test::shared_model("synthetic/tiny-llama-rand-Q4_K_M.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  auto model = model::LoadedModel::open(path.string());
  cuda::PlanShape shape{512, 4, 64, 8};
  auto plan = cuda::plan_memory(model->hparams, model->weights, shape);
  uint64_t tensor_bytes = 0;
  for (const auto& t : model->file.tensors()) tensor_bytes += t.byte_size;  // norms are F32 already
  EXPECT_GE(plan.weights, tensor_bytes);
  EXPECT_LE(plan.weights, tensor_bytes + 256 * model->file.tensors().size());
  // K and V in FP16: 2 tensors x 2 layers x 4 sequences x 512 positions x (2 KV heads x 64) x 2 bytes.
  // (By default the pool holds one whole context per sequence: 4 x 32 blocks of 16.)
  EXPECT_EQ(plan.kv_cache, 2ull * 2 * 4 * 512 * 128 * 2);
  EXPECT_GT(plan.scratch, 64ull * 768 * 4);
  EXPECT_EQ(plan.total(), plan.weights + plan.kv_cache + plan.scratch + plan.reserve);
  // A pool of 50 blocks of 16 positions (paged: fewer than 4 whole contexts).
  cuda::PlanShape paged = shape;
  paged.kv_blocks = 50;
  EXPECT_EQ(paged.kv_pool_blocks(), 50);
  EXPECT_EQ(cuda::plan_memory(model->hparams, model->weights, paged).kv_cache, 2ull * 2 * 50 * 16 * 128 * 2);
  EXPECT_EQ(cuda::plan_memory(model->hparams, model->weights, paged).scratch, plan.scratch);  // the same tables
}

// Every tensor the forward pass reads is counted, the architectures' vectors
// included (Q/K/V biases, per-head Q/K norms, post-norms), the routers and
// every expert's matrices of MoE layers, and of LongRoPE's two factor sets
// the one the context selects.
TEST(MemoryPlan, CountsTheArchitecturesVectors) {
  for (const char* name : {"arch/tiny-qwen2-Q8_0.gguf", "arch/tiny-gemma3-Q8_0.gguf", "arch/tiny-phi3-Q8_0.gguf",
                           "arch/tiny-qwen3moe-Q8_0.gguf", "arch/tiny-mixtral-F32.gguf"}) {
    SCOPED_TRACE(name);
    auto path = test::shared_model(name);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    auto model = model::LoadedModel::open(path.string());
    const auto& w = model->weights;
    for (const int n_ctx : {512, 8192}) {
      SCOPED_TRACE("n_ctx " + std::to_string(n_ctx));
      const auto plan = cuda::plan_memory(model->hparams, w, cuda::PlanShape{n_ctx, 1, 64, 8});
      uint64_t read = w.total_bytes();  // both LongRoPE sets: one stays on the host
      if (w.rope_factors_long.present()) {
        const model::WeightView* used = w.rope_factors(model->hparams, static_cast<uint32_t>(n_ctx));
        const model::WeightView& unused = used == &w.rope_factors_long ? w.rope_factors_short : w.rope_factors_long;
        read -= unused.row_bytes * unused.rows;
      }
      const uint64_t views = 17 * w.layers.size() + 4;  // each rounded up to the arena's 256 bytes
      EXPECT_GE(plan.weights, read);
      EXPECT_LE(plan.weights, read + 256 * views);
    }
  }
}

TEST(MemoryPlan, ARefusalSaysWhatIsNeededAndWhatIsThere) {
  cuda::MemoryPlan plan;
  plan.weights = 26ull << 30;
  plan.kv_cache = 1ull << 30;
  try {
    cuda::check_plan_fits(plan, 24ull << 30, "GPU 0 (Tesla M40 24GB)");
    FAIL() << "a 27 GiB plan must not fit in 24 GiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("weights 26.00 GiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("24.00 GiB is available"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Tesla M40"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(cuda::check_plan_fits(plan, 28ull << 30, "GPU 0"));
}

// MoE layers' scratch: per token the router's logits, per chosen expert the
// gathered x, gate/up, activation and output rows (the backend takes them
// from the plan's scratch arena, which throws if the plan undercounted).
TEST(MemoryPlan, CountsTheExpertScratch) {
  auto path = test::shared_model("arch/tiny-qwen3moe-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  auto model = model::LoadedModel::open(path.string());
  const auto& hp = model->hparams;
  cuda::PlanShape shape{512, 1, 64, 8};
  auto with_experts = cuda::plan_memory(hp, model->weights, shape);
  auto dense_hp = hp;
  dense_hp.n_expert = 0;
  auto without = cuda::plan_memory(dense_hp, model->weights, shape);
  const uint64_t slots = 64ull * hp.n_expert_used;
  EXPECT_GE(with_experts.scratch - without.scratch,
            (64ull * hp.n_expert + slots * (2ull * hp.n_embd + 3ull * hp.n_ff_expert)) * sizeof(float));
}

// A model divided by rows over GPUs (cuda::make_row_split_backend,
// model/row_split.h) answers as
// the whole model does on the CPU, within the CUDA tests' tolerance: a
// prompt read at once (logits at every position), a second sequence,
// decode steps of both (one graph over the shards), a step mixing a decode
// token with a prompt chunk, and a block copied on write. Two shards on one GPU
// stand in for two GPUs (the exchange's copies are then device-local);
// with two GPUs the shards also run on both. The shards' memory plans
// divide the KV cache between them (runs without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/memory_plan.h"
#include "backends/cuda/row_split.h"
#include "common/error.h"
#include "engine/backend_factory.h"
#include "model/loaded_model.h"
#include "model/row_split.h"
#include "split_logits.h"
#include "test_paths.h"

using namespace m40;

namespace {

struct RowSplitCase {
  std::string model;
  bool two_gpus;
};

void PrintTo(const RowSplitCase& c, std::ostream* os) { *os << c.model << (c.two_gpus ? ", GPUs 0 and 1" : ", GPU 0 twice"); }

class CudaRowSplit : public ::testing::TestWithParam<RowSplitCase> {
 protected:
  void SetUp() override {
    const int needed = GetParam().two_gpus ? 2 : 1;
    if (cuda::device_count() < needed) GTEST_SKIP() << "fewer than " << needed << " CUDA GPUs";
    const auto path = test::shared_model(GetParam().model);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model missing: " << path;
    model_ = model::LoadedModel::open(path.string());
  }
  void expect_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) const {
    test::expect_rows_close(want, got, model_->hparams.n_vocab, test::split_tolerance_for(GetParam().model), what);
  }
  static std::vector<float> run(backend::Backend& b, const backend::Batch& batch) { return test::forward_logits(b, batch); }
  std::unique_ptr<model::LoadedModel> model_;
};

TEST_P(CudaRowSplit, GivesTheWholeModelsLogits) {
  cpu::CpuBackendOptions co;
  co.n_ctx = 64;
  co.n_seq = 2;
  cpu::CpuBackend reference(model_->hparams, model_->weights, co);
  cuda::CudaBackendOptions o;
  o.n_ctx = 64;
  o.n_seq = 2;
  const std::vector<int> devices = GetParam().two_gpus ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
  const auto split_backend = cuda::make_row_split_backend(model_->hparams, model_->weights, o, devices, {1, 1});
  backend::RowSplitBackend& split = *split_backend;
  ASSERT_EQ(split.n_shards(), 2u);
  EXPECT_EQ(split.name(), GetParam().two_gpus ? "CUDA:0 + CUDA:1 (row split)" : "CUDA:0 + CUDA:0 (row split)");
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams.n_vocab);
  auto token = [&](int i) { return static_cast<int32_t>((1 + 7919ull * i * i + 104729ull * i) % n_vocab); };

  backend::Batch batch;
  for (int p = 0; p < 20; ++p) batch.add(token(p), p, 0, true);
  expect_close(run(reference, batch), run(split, batch), "the prompt");
  batch.clear();
  for (int p = 0; p < 5; ++p) batch.add(token(100 + p), p, 1, p == 4);
  expect_close(run(reference, batch), run(split, batch), "the second prompt");
  for (int step = 0; step < 4; ++step) {
    batch.clear();
    batch.add(token(200 + step), 20 + step, 0, true);
    batch.add(token(300 + step), 5 + step, 1, true);
    expect_close(run(reference, batch), run(split, batch), "decode step " + std::to_string(step));
  }
  // A mixed step: sequence 0's decode token, then a chunk of sequence 1.
  batch.clear();
  batch.add(token(500), 24, 0, true);
  for (int p = 9; p < 12; ++p) batch.add(token(600 + p), p, 1, p == 11);
  expect_close(run(reference, batch), run(split, batch), "a mixed step");
  // Sequence 1 continues from a copy of sequence 0's first block (copy on
  // write of a shared prefix): both backends copy, then read it.
  const int per_seq = backend::kv_blocks_for(64);
  const std::vector<int32_t> blocks = {per_seq + 1, per_seq};  // block 0's copy first, then its own second
  for (backend::Backend* b : {static_cast<backend::Backend*>(&reference), static_cast<backend::Backend*>(&split)}) {
    b->copy_block(0, per_seq + 1);
    b->set_blocks(1, blocks, backend::kKvBlockSize);
  }
  batch.clear();
  for (int p = backend::kKvBlockSize; p < backend::kKvBlockSize + 3; ++p) batch.add(token(400 + p), p, 1, true);
  expect_close(run(reference, batch), run(split, batch), "after the block copy");
}

TEST_P(CudaRowSplit, ABadBatchIsRefusedByEveryShardAndTheNextStepRuns) {
  cuda::CudaBackendOptions o;
  o.n_ctx = 64;
  const std::vector<int> devices = GetParam().two_gpus ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
  const auto split_backend = cuda::make_row_split_backend(model_->hparams, model_->weights, o, devices, {1, 1});
  backend::RowSplitBackend& split = *split_backend;
  const size_t n_vocab = model_->hparams.n_vocab;
  backend::Batch bad;
  bad.add(static_cast<int32_t>(n_vocab), 0, 0, true);  // outside the vocabulary
  std::vector<float> out(n_vocab, NAN);
  EXPECT_THROW(split.forward(bad, out), Error);
  backend::Batch good;
  good.add(1, 0, 0, true);
  good.add(2, 1, 0, true);
  std::vector<float> small(n_vocab, NAN);  // room for one row of two: shard 0 refuses, the other waits in vain
  EXPECT_THROW(split.forward(good, small), Error);
  std::vector<float> logits(2 * n_vocab, NAN);
  split.forward(good, logits);
  EXPECT_TRUE(std::none_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); }));
}

std::vector<RowSplitCase> row_split_cases() {
  std::vector<RowSplitCase> cases;
  for (const char* m : {"TinyStories-656K-Q8_0.gguf", "synthetic/tiny-llama-rand-Q4_0.gguf", "synthetic/tiny-llama-rand-Q8_0.gguf",
                        "synthetic/tiny-llama-rand-F16.gguf", "arch/tiny-qwen2-Q8_0.gguf", "arch/tiny-qwen3-Q8_0.gguf",
                        "arch/tiny-gemma2-F32.gguf", "arch/tiny-gemma3-Q8_0.gguf", "arch/tiny-phi3-F32.gguf",
                        "arch/tiny-mistral3-F32.gguf"}) {
    for (bool two : {false, true}) cases.push_back({m, two});
  }
  return cases;
}

std::string row_split_case_name(const ::testing::TestParamInfo<RowSplitCase>& info) {
  std::string name = std::filesystem::path(info.param.model).stem().string() + (info.param.two_gpus ? "_gpu0_gpu1" : "_gpu0_twice");
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(SharedModels, CudaRowSplit, ::testing::ValuesIn(row_split_cases()), row_split_case_name);

// The shards' plans divide the KV cache between them and each holds less
// of the weights than the whole model; only shard 0 holds the output head.
TEST(CudaRowSplitPlan, ShardsDivideTheKvCacheAndTheLayers) {
  const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  const auto model = model::LoadedModel::open(path.string());
  const std::vector<double> shares = {3, 1};
  const auto shards = model::plan_row_split(model->hparams, model->weights, shares);
  cuda::PlanShape shape{64, 2, 32, 8, 0, backend::KvType::F16};
  const cuda::MemoryPlan whole = cuda::plan_memory(model->hparams, model->weights, shape);
  shape.shard = shards[0];
  const cuda::MemoryPlan first = cuda::plan_memory(model->hparams, model->weights, shape);
  shape.shard = shards[1];
  const cuda::MemoryPlan second = cuda::plan_memory(model->hparams, model->weights, shape);
  EXPECT_EQ(first.kv_cache, whole.kv_cache / 4 * 3);
  EXPECT_EQ(first.kv_cache + second.kv_cache, whole.kv_cache);
  EXPECT_LT(first.weights, whole.weights);
  EXPECT_LT(second.weights, first.weights);
  const auto& w = model->weights;
  const uint64_t head = w.tied_output ? 0 : cuda::Arena::aligned(w.output.rows * w.output.row_bytes);
  EXPECT_GT(first.weights, second.weights + head / 2) << "shard 0 holds the output head";
}

// make_backend with --split-mode row over two GPUs; with one GPU the model
// runs there whole; --gpu-layers and --cpu do not go with it. By default
// (auto) a model split over two GPUs is divided by rows where it can be,
// by layers where asked or where its heads cannot be divided.
TEST(CudaRowSplitFactory, SplitModeRowDividesTheModelOverTheGpus) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  const auto model = model::LoadedModel::open(path.string());
  engine::BackendOptions o;
  o.n_ctx = 64;
  o.split_mode = engine::SplitMode::Row;
  o.gpus = {0};
  EXPECT_EQ(engine::make_backend(*model, o)->name(), "CUDA");
  o.gpu_layers = 1;
  EXPECT_THROW(engine::make_backend(*model, o), Error);
  o.gpu_layers = -1;
  o.force_cpu = true;
  EXPECT_THROW(engine::make_backend(*model, o), Error);
  if (cuda::device_count() < 2) GTEST_SKIP() << "fewer than two CUDA GPUs";
  o.force_cpu = false;
  o.gpus = {0, 1};
  EXPECT_EQ(engine::make_backend(*model, o)->name(), "CUDA:0 + CUDA:1 (row split)");
  o.split_mode = engine::SplitMode::Auto;
  o.tensor_split = {1, 1};
  EXPECT_EQ(engine::make_backend(*model, o)->name(), "CUDA:0 + CUDA:1 (row split)");
  o.split_mode = engine::SplitMode::Layer;
  EXPECT_EQ(engine::make_backend(*model, o)->name(), "CUDA:0 (layers 0-0) + CUDA:1 (layers 1-1)");
  const auto granite_path = test::shared_model("arch/tiny-granite-F32.gguf");  // one KV head: no row split
  const auto granite = model::LoadedModel::open(granite_path.string());
  o.split_mode = engine::SplitMode::Auto;
  EXPECT_EQ(engine::make_backend(*granite, o)->name(), "CUDA:0 (layers 0-1) + CUDA:1 (layers 2-2)");
  o.split_mode = engine::SplitMode::Row;
  EXPECT_THROW(engine::make_backend(*granite, o), Error);
}

}  // namespace

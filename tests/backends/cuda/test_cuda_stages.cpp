// The CUDA backend as one stage of a model split by layers
// (backends/pipeline): CUDA then CPU (the CPU offload of the last layers),
// CPU then CUDA, and two CUDA stages on one GPU (the stand-in for two GPUs)
// give the whole CPU model's logits within the CUDA tests' tolerance, for a
// prompt read at once (the eager path, logits at every position) and decode
// steps of two sequences (the graphs). The memory plan of a stage counts
// only its layers, and the token embedding or output head where it holds
// them (runs without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/memory_plan.h"
#include "backends/pipeline/pipeline_backend.h"
#include "engine/backend_factory.h"
#include "common/error.h"
#include "model/loaded_model.h"
#include "split_logits.h"
#include "test_paths.h"

using namespace m40;

namespace {

using backend::LayerRange;

enum class Layout { CudaThenCpu, CpuThenCuda, CudaThenCuda };

struct StageCase {
  std::string model;
  Layout layout;
};

void PrintTo(const StageCase& c, std::ostream* os) {
  static const char* names[] = {"CUDA then CPU", "CPU then CUDA", "CUDA then CUDA"};
  *os << c.model << ", " << names[static_cast<int>(c.layout)];
}

class CudaStages : public ::testing::TestWithParam<StageCase> {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    const auto path = test::shared_model(GetParam().model);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model missing: " << path;
    model_ = model::LoadedModel::open(path.string());
  }
  std::unique_ptr<backend::Backend> cpu(LayerRange layers) const {
    cpu::CpuBackendOptions o;
    o.n_ctx = 64;
    o.n_seq = 2;
    o.layers = layers;
    return std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights, o);
  }
  std::unique_ptr<backend::Backend> gpu(LayerRange layers) const {
    cuda::CudaBackendOptions o;
    o.n_ctx = 64;
    o.n_seq = 2;
    o.layers = layers;
    return std::make_unique<cuda::CudaBackend>(model_->hparams, model_->weights, o);
  }
  std::unique_ptr<backend::PipelineBackend> split() const {
    const int n = static_cast<int>(model_->hparams.n_layer);
    const int cut = n / 2;
    std::vector<std::unique_ptr<backend::Backend>> stages;
    switch (GetParam().layout) {
      case Layout::CudaThenCpu: stages.push_back(gpu({0, cut})), stages.push_back(cpu({cut, n})); break;
      case Layout::CpuThenCuda: stages.push_back(cpu({0, cut})), stages.push_back(gpu({cut, n})); break;
      case Layout::CudaThenCuda: stages.push_back(gpu({0, cut})), stages.push_back(gpu({cut, n})); break;
    }
    return std::make_unique<backend::PipelineBackend>(std::move(stages), n);
  }
  void expect_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) const {
    test::expect_rows_close(want, got, model_->hparams.n_vocab, test::split_tolerance_for(GetParam().model), what);
  }
  static std::vector<float> run(backend::Backend& b, const backend::Batch& batch) { return test::forward_logits(b, batch); }
  std::unique_ptr<model::LoadedModel> model_;
};

TEST_P(CudaStages, GiveTheWholeModelsLogits) {
  if (model_->hparams.n_layer < 2) GTEST_SKIP() << "one layer: nothing to split";
  auto reference = cpu({});
  auto pipeline = split();
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams.n_vocab);
  auto token = [&](int i) { return static_cast<int32_t>((1 + 7919ull * i * i + 104729ull * i) % n_vocab); };

  backend::Batch batch;
  for (int p = 0; p < 20; ++p) batch.add(token(p), p, 0, true);
  expect_close(run(*reference, batch), run(*pipeline, batch), "the prompt");
  batch.clear();
  for (int p = 0; p < 5; ++p) batch.add(token(100 + p), p, 1, p == 4);
  expect_close(run(*reference, batch), run(*pipeline, batch), "the second prompt");
  for (int step = 0; step < 6; ++step) {  // decode steps of both sequences: the graphs
    batch.clear();
    batch.add(token(200 + step), 20 + step, 0, true);
    batch.add(token(300 + step), 5 + step, 1, true);
    expect_close(run(*reference, batch), run(*pipeline, batch), "decode step " + std::to_string(step));
  }
}

std::vector<StageCase> stage_cases() {
  std::vector<StageCase> cases;
  for (const char* m : {"TinyStories-656K-Q8_0.gguf", "synthetic/tiny-llama-rand-Q4_K_M.gguf", "arch/tiny-qwen3-Q8_0.gguf",
                        "arch/tiny-gemma2-F32.gguf", "arch/tiny-phi3-F32.gguf", "arch/tiny-qwen3moe-Q8_0.gguf"}) {
    for (Layout l : {Layout::CudaThenCpu, Layout::CpuThenCuda, Layout::CudaThenCuda}) cases.push_back({m, l});
  }
  return cases;
}

std::string stage_case_name(const ::testing::TestParamInfo<StageCase>& info) {
  static const char* layouts[] = {"_cuda_cpu", "_cpu_cuda", "_cuda_cuda"};
  std::string name = std::filesystem::path(info.param.model).stem().string() + layouts[static_cast<int>(info.param.layout)];
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(SharedModels, CudaStages, ::testing::ValuesIn(stage_cases()), stage_case_name);

// The stages' plans hold every tensor once (a tied head's embedding in the
// last stage too) and every layer's K/V once.
TEST(CudaStagePlan, CountsOnlyTheStagesLayersAndEnds) {
  for (const char* name : {"TinyStories-656K-Q8_0.gguf", "arch/tiny-granite-F32.gguf", "arch/tiny-qwen3moe-Q8_0.gguf"}) {
    const auto path = test::shared_model(name);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    const auto model = model::LoadedModel::open(path.string());
    const int n = static_cast<int>(model->hparams.n_layer);
    cuda::PlanShape shape{64, 2, 32, 8, 0, backend::KvType::F16};
    const cuda::MemoryPlan whole = cuda::plan_memory(model->hparams, model->weights, shape);
    shape.layers = {0, 1};
    const cuda::MemoryPlan first = cuda::plan_memory(model->hparams, model->weights, shape);
    shape.layers = {1, n};
    const cuda::MemoryPlan rest = cuda::plan_memory(model->hparams, model->weights, shape);
    const auto& w = model->weights;
    const uint64_t embedding = cuda::Arena::aligned(w.token_embd.rows * w.token_embd.row_bytes);
    const model::WeightView* factors = w.rope_factors(model->hparams, 64);
    const uint64_t rope = factors != nullptr ? cuda::Arena::aligned(factors->cols * sizeof(float)) : 0;
    EXPECT_EQ(first.weights + rest.weights, whole.weights + (w.tied_output ? embedding : 0) + rope) << name;
    EXPECT_EQ(first.kv_cache * static_cast<uint64_t>(n), whole.kv_cache) << name;
    EXPECT_EQ(first.kv_cache + rest.kv_cache, whole.kv_cache) << name;
    EXPECT_GT(first.weights, embedding) << name << ": the first stage embeds the tokens";
    shape.layers = {0, n + 1};
    EXPECT_THROW(cuda::plan_memory(model->hparams, model->weights, shape), Error) << name;
  }
}

}  // namespace

namespace {

// make_backend's offload: --gpu-layers splits where asked, and a --vram
// budget that holds the last layer's stage but not the whole model takes
// just that one to the GPU; both answer as the CPU does.
TEST(CudaOffload, MakeBackendSplitsWhereAskedOrWhereTheBudgetEnds) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const auto path = test::shared_model("arch/tiny-granite-F32.gguf");  // 3 layers
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  const auto model = model::LoadedModel::open(path.string());
  engine::BackendOptions o;
  o.n_ctx = 64;
  o.gpus = {0};  // one GPU and the CPU, on a machine with more GPUs too
  o.gpu_layers = 2;
  auto asked = engine::make_backend(*model, o);
  EXPECT_EQ(asked->name(), "CPU (layers 0-0) + CUDA:0 (layers 1-2)");
  EXPECT_GT(asked->gpu_memory_bytes(), 0u);
  EXPECT_LT(asked->gpu_memory_bytes(), asked->memory_bytes());

  cuda::PlanShape one{64, 1, cuda::CudaBackendOptions{}.max_batch, 32, 0, backend::KvType::F16, {2, 3}};
  one.kv_blocks = one.kv_pool_blocks();
  o.gpu_layers = -1;
  o.vram_budget = cuda::plan_memory(model->hparams, model->weights, one).total();
  auto budgeted = engine::make_backend(*model, o);
  EXPECT_EQ(budgeted->name(), "CPU (layers 0-1) + CUDA:0 (layers 2-2)");

  engine::BackendOptions on_cpu;
  on_cpu.n_ctx = 64;
  on_cpu.force_cpu = true;
  auto reference = engine::make_backend(*model, on_cpu);
  backend::Batch batch;
  for (int p = 0; p < 9; ++p) batch.add(static_cast<int32_t>(3 + 11 * p), p, 0, true);
  const size_t n_vocab = model->hparams.n_vocab;
  std::vector<float> want(9 * n_vocab), got(9 * n_vocab, NAN), got2(9 * n_vocab, NAN);
  reference->forward(batch, want);
  asked->forward(batch, got);
  budgeted->forward(batch, got2);
  float worst = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max({worst, std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]),
                      std::isnan(got2[i]) ? INFINITY : std::abs(got2[i] - want[i])});
  }
  EXPECT_LE(worst, test::split_tolerance_for("arch/"));
}

// --gpus 0,1 --tensor-split 1,1: the layers over two GPUs (2 and 1 of
// granite's 3), answering as the CPU does. Needs two GPUs.
TEST(CudaOffload, TwoGpusSplitTheLayers) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "fewer than two CUDA GPUs";
  const auto path = test::shared_model("arch/tiny-granite-F32.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  const auto model = model::LoadedModel::open(path.string());
  engine::BackendOptions o;
  o.n_ctx = 64;
  o.n_seq = 2;
  o.gpus = {0, 1};
  o.tensor_split = {1, 1};
  auto split = engine::make_backend(*model, o);
  EXPECT_EQ(split->name(), "CUDA:0 (layers 0-1) + CUDA:1 (layers 2-2)");
  engine::BackendOptions on_cpu;
  on_cpu.n_ctx = 64;
  on_cpu.n_seq = 2;
  on_cpu.force_cpu = true;
  auto reference = engine::make_backend(*model, on_cpu);
  const size_t n_vocab = model->hparams.n_vocab;
  for (int step = 0; step < 5; ++step) {  // a prompt of both sequences, then decode steps (the graphs)
    backend::Batch batch;
    if (step == 0) {
      for (int p = 0; p < 4; ++p) batch.add(static_cast<int32_t>(5 + 13 * p), p, 0, true);
      for (int p = 0; p < 3; ++p) batch.add(static_cast<int32_t>(7 + 17 * p), p, 1, true);
    } else {
      batch.add(static_cast<int32_t>(40 + step), 3 + step, 0, true);
      batch.add(static_cast<int32_t>(90 + step), 2 + step, 1, true);
    }
    std::vector<float> want(batch.logits_count() * n_vocab), got(batch.logits_count() * n_vocab, NAN);
    reference->forward(batch, want);
    split->forward(batch, got);
    float worst = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]));
    EXPECT_LE(worst, test::split_tolerance_for("arch/")) << "step " << step;
  }
}

}  // namespace

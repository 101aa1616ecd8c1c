// Batch::output_embeddings on the CUDA backend against the CPU backend (its
// twin) on the shared tiny models: the final hidden states (after the final
// norm, no output head) of every prompt position, of a few positions, of a
// prompt longer than one chunk, of several sequences in one batch and of a
// one-token batch (which a logits batch would replay from a graph); and a
// batch of hidden states leaves the KV cache as a logits batch does (the
// next token's logits match). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "common/error.h"
#include "model/loaded_model.h"
#include "test_paths.h"

using namespace m40;

namespace {

bool have_gpu() { return cuda::device_count() > 0; }

// As the logits twin tests (test_cuda_backend.cpp): the same FP32 math in
// another summation order and FP16 K/V; the architectures' random models
// amplify those differences more. The hidden states are RMS-normalized
// (values of order 1), well below the logits' scale.
constexpr float kTolerance = 2e-3f;
constexpr float kArchitectureTolerance = 6e-3f;

class CudaHiddenStates : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
    const auto path = test::shared_model(GetParam());
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model missing: " << path;
    model_ = model::LoadedModel::open(path.string());
    n_embd_ = static_cast<int>(model_->hparams.n_embd);
    tolerance_ = GetParam().rfind("arch/", 0) == 0 ? kArchitectureTolerance : kTolerance;
  }
  std::unique_ptr<cpu::CpuBackend> cpu_backend(int n_ctx, int n_seq = 1) const {
    cpu::CpuBackendOptions o;
    o.n_ctx = n_ctx;
    o.n_seq = n_seq;
    return std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights, o);
  }
  std::unique_ptr<cuda::CudaBackend> gpu_backend(int n_ctx, int n_seq = 1, int max_batch = 512) const {
    cuda::CudaBackendOptions o;
    o.n_ctx = n_ctx;
    o.n_seq = n_seq;
    o.max_batch = max_batch;
    return std::make_unique<cuda::CudaBackend>(model_->hparams, model_->weights, o);
  }
  std::vector<int32_t> prompt(int n) const {
    std::vector<int32_t> ids;
    const auto n_vocab = static_cast<uint64_t>(model_->hparams.n_vocab);
    for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((1 + 7919ull * i * i + 104729ull * i) % n_vocab));
    return ids;
  }
  // Every output row of the GPU within the tolerance of the CPU's.
  void expect_rows_close(const std::vector<float>& cpu, const std::vector<float>& gpu, const std::string& what) const {
    ASSERT_EQ(cpu.size(), gpu.size());
    for (size_t r = 0; r < cpu.size() / n_embd_; ++r) {
      float worst = 0;
      int at = 0;
      for (int j = 0; j < n_embd_; ++j) {
        const float c = cpu[r * n_embd_ + j], g = gpu[r * n_embd_ + j];
        const float d = std::isnan(g) ? INFINITY : std::abs(c - g);
        if (d > worst) worst = d, at = j;
      }
      EXPECT_LE(worst, tolerance_) << what << ", row " << r << ": value " << at << " GPU " << gpu[r * n_embd_ + at]
                                   << ", CPU " << cpu[r * n_embd_ + at];
    }
  }
  // Runs `batch` (hidden states) on both backends.
  void compare(backend::Backend& cpu, backend::Backend& gpu, const backend::Batch& batch, const std::string& what) const {
    std::vector<float> c(batch.logits_count() * n_embd_), g(batch.logits_count() * n_embd_, NAN);
    cpu.forward(batch, c);
    gpu.forward(batch, g);
    expect_rows_close(c, g, what);
  }
  std::unique_ptr<model::LoadedModel> model_;
  int n_embd_ = 0;
  float tolerance_ = kTolerance;
};

backend::Batch hidden_batch() {
  backend::Batch b;
  b.output_embeddings = true;
  return b;
}

}  // namespace

TEST_P(CudaHiddenStates, EveryPromptPosition) {
  auto cpu = cpu_backend(64);
  auto gpu = gpu_backend(64);
  EXPECT_EQ(gpu->n_embd(), n_embd_);
  const auto ids = prompt(24);
  backend::Batch batch = hidden_batch();
  for (size_t i = 0; i < ids.size(); ++i) batch.add(ids[i], static_cast<int>(i), 0, true);
  compare(*cpu, *gpu, batch, "every position");
}

TEST_P(CudaHiddenStates, SomePositionsThenTheCacheServesTheNextToken) {
  const int n_vocab = static_cast<int>(model_->hparams.n_vocab);
  auto cpu = cpu_backend(64);
  auto gpu = gpu_backend(64);
  const auto ids = prompt(21);
  backend::Batch batch = hidden_batch();
  for (int i = 0; i < 20; ++i) batch.add(ids[i], i, 0, i == 0 || i == 7 || i == 8 || i == 19);
  compare(*cpu, *gpu, batch, "positions 0, 7, 8, 19");
  // The K and V that batch appended: the next token's logits agree.
  backend::Batch next;
  next.add(ids[20], 20, 0, true);
  std::vector<float> lc(n_vocab), lg(n_vocab, NAN);
  cpu->forward(next, lc);
  gpu->forward(next, lg);
  float worst = 0;
  for (int v = 0; v < n_vocab; ++v) worst = std::max(worst, std::isnan(lg[v]) ? INFINITY : std::abs(lc[v] - lg[v]));
  EXPECT_LE(worst, 2 * tolerance_) << "logits after a hidden-state batch";
}

TEST_P(CudaHiddenStates, OneTokenBatchesAreNotReplayedAsLogits) {
  // Each token alone wants its output: a logits step of this shape replays
  // a decode graph (whose output is logits); a hidden-state one must not.
  auto cpu = cpu_backend(32);
  auto gpu = gpu_backend(32);
  const auto ids = prompt(6);
  for (int i = 0; i < 6; ++i) {
    backend::Batch batch = hidden_batch();
    batch.add(ids[i], i, 0, true);
    compare(*cpu, *gpu, batch, "token " + std::to_string(i));
  }
}

TEST_P(CudaHiddenStates, APromptLongerThanOneChunk) {
  auto cpu = cpu_backend(64);
  auto gpu = gpu_backend(64, 1, 16);  // chunks of 16 tokens
  const auto ids = prompt(45);
  backend::Batch batch = hidden_batch();
  for (size_t i = 0; i < ids.size(); ++i) batch.add(ids[i], static_cast<int>(i), 0, i % 3 != 1);
  compare(*cpu, *gpu, batch, "45 tokens in chunks of 16");
}

TEST_P(CudaHiddenStates, SeveralSequencesInOneBatch) {
  auto cpu = cpu_backend(64, 3);
  auto gpu = gpu_backend(64, 3);
  const auto ids = prompt(40);
  backend::Batch batch = hidden_batch();
  const int lengths[3] = {13, 5, 22};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < lengths[s]; ++i) batch.add(ids[(s * 11 + i) % 40], i, s, s != 1 || i + 1 == lengths[s]);
  }
  compare(*cpu, *gpu, batch, "three sequences");
}

INSTANTIATE_TEST_SUITE_P(SharedModels, CudaHiddenStates,
                         ::testing::Values("synthetic/tiny-llama-rand-F32.gguf", "synthetic/tiny-llama-rand-Q8_0.gguf",
                                           "synthetic/tiny-llama-rand-Q4_K_M.gguf", "TinyStories-656K-Q8_0.gguf",
                                           "arch/tiny-qwen3-F32.gguf", "arch/tiny-qwen3-Q8_0.gguf", "arch/tiny-qwen2-F32.gguf",
                                           "arch/tiny-gemma2-F32.gguf", "arch/tiny-gemma3-F32.gguf", "arch/tiny-phi3-F32.gguf",
                                           "arch/tiny-granite-F32.gguf", "arch/tiny-smollm3-F32.gguf"),
                         [](const auto& param_info) {
                           std::string s = std::filesystem::path(param_info.param).stem().string();
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(CudaHiddenStatesBuffer, ABufferTooSmallIsRefusedBeforeAnyGpuWork) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  const auto path = test::shared_model("arch/tiny-qwen3-F32.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model missing: " << path;
  auto model = model::LoadedModel::open(path.string());
  cuda::CudaBackendOptions o;
  o.n_ctx = 16;
  cuda::CudaBackend gpu(model->hparams, model->weights, o);
  backend::Batch batch = hidden_batch();
  batch.add(1, 0, 0, true);
  batch.add(2, 1, 0, true);
  std::vector<float> small(2 * model->hparams.n_embd - 1);
  EXPECT_THROW(gpu.forward(batch, small), Error);
  // Nothing was cached: the batch can run again from position 0.
  std::vector<float> enough(2 * model->hparams.n_embd);
  EXPECT_NO_THROW(gpu.forward(batch, enough));
}

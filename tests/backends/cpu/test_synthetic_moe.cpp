// gen-model's mixture-of-experts shapes run: a tiny qwen3moe and a tiny
// Mixtral written in each weight recipe load, and the CPU backend's
// forward over a prompt gives finite logits that differ from position to
// position (the experts and the router are read, not skipped).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gguf/file.h"
#include "model/loaded_model.h"
#include "model/synthetic_llama.h"
#include "test_paths.h"

namespace m40 {
namespace {

TEST(SyntheticMoe, TinyExpertShapesRunOnTheCpu) {
  const auto tokenizer_path = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(tokenizer_path)) GTEST_SKIP() << "shared models not found";
  const gguf::File tokenizer = gguf::File::open(tokenizer_path.string());
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("m40_moe_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const char* shape : {"tiny-qwen3moe", "tiny-mixtral"}) {
    for (const char* recipe : {"f32", "q8_0", "q4_k_m"}) {
      model::SyntheticOptions o;
      o.shape = *model::synthetic_shape(shape);
      o.recipe = recipe;
      o.threads = 2;
      o.tokenizer_source = &tokenizer;
      const auto path = dir / (std::string(shape) + "-" + recipe + ".gguf");
      model::write_synthetic_llama(o, path.string());
      auto model = model::LoadedModel::open(path.string());
      ASSERT_GT(model->hparams.n_expert, 0u) << shape;
      cpu::CpuBackendOptions co;
      co.n_ctx = 64;
      co.threads = 2;
      cpu::CpuBackend backend(model->hparams, model->weights, co);
      const int n_vocab = backend.n_vocab();
      backend::Batch batch;
      for (int i = 0; i < 6; ++i) batch.add((17 + 31 * i) % n_vocab, i, 0, true);
      std::vector<float> logits(batch.size() * static_cast<size_t>(n_vocab), NAN);
      backend.forward(batch, logits);
      for (float l : logits) ASSERT_TRUE(std::isfinite(l)) << shape << " " << recipe;
      EXPECT_NE(logits[0], logits[static_cast<size_t>(n_vocab)]) << shape << " " << recipe;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace m40

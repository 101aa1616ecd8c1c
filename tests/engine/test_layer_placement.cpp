// The CPU offload's choices (engine/layer_placement.h, make_backend's
// gpu_layers): the most layers whose GPU plan fits, the message that says
// where they run, and the refusals of --gpu-layers without a GPU or beside
// --cpu.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/backend_factory.h"
#include "engine/layer_placement.h"
#include "model/loaded_model.h"
#include "test_paths.h"

namespace m40 {
namespace {

using engine::gpu_layers_that_fit;

TEST(LayerPlacement, TakesTheMostLayersThatFit) {
  // 1 GB for the head and scratch, 100 MB a layer.
  const auto plan = [](int g) { return 1000ull + 100ull * static_cast<uint64_t>(g); };
  EXPECT_EQ(gpu_layers_that_fit(32, plan, 4200), 32);
  EXPECT_EQ(gpu_layers_that_fit(32, plan, 1000 + 100 * 32), 32) << "exactly full";
  EXPECT_EQ(gpu_layers_that_fit(32, plan, 1000 + 100 * 32 - 1), 31);
  EXPECT_EQ(gpu_layers_that_fit(32, plan, 2599), 15);
  EXPECT_EQ(gpu_layers_that_fit(32, plan, 1100), 1);
  EXPECT_EQ(gpu_layers_that_fit(32, plan, 1099), 0) << "not one layer";
  EXPECT_EQ(gpu_layers_that_fit(1, plan, 5000), 1);
}

TEST(LayerPlacement, AsksOnlyForCountsItCanUse) {
  std::vector<int> asked;
  const auto plan = [&](int g) {
    asked.push_back(g);
    return static_cast<uint64_t>(g);
  };
  EXPECT_EQ(gpu_layers_that_fit(80, plan, 57), 57);
  for (int g : asked) {
    EXPECT_GE(g, 1);
    EXPECT_LE(g, 80);
  }
  EXPECT_LE(asked.size(), 8u) << "halving, not one plan per count";
}

TEST(LayerPlacement, SaysWhereTheLayersRun) {
  EXPECT_EQ(engine::describe_offload(32, 22, 0), "layers 0-9 on the CPU, layers 10-31 and the output head on GPU 0");
  EXPECT_EQ(engine::describe_offload(32, 31, 1), "layer 0 on the CPU, layers 1-31 and the output head on GPU 1");
  EXPECT_EQ(engine::describe_offload(32, 1, 0), "layers 0-30 on the CPU, layer 31 and the output head on GPU 0");
  EXPECT_EQ(engine::describe_offload(32, 0, 0), "every layer on the CPU");
  EXPECT_EQ(engine::describe_offload(32, 40, 0), "every layer on GPU 0");
}

std::string make_backend_error(const engine::BackendOptions& options) {
  const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
  const auto model = model::LoadedModel::open(path.string());
  try {
    engine::make_backend(*model, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LayerPlacement, GpuLayersBesideCpuIsRefused) {
  if (!std::filesystem::exists(test::shared_model("TinyStories-656K-Q8_0.gguf"))) GTEST_SKIP() << "shared models not found";
  engine::BackendOptions o;
  o.n_ctx = 64;
  o.force_cpu = true;
  o.gpu_layers = 3;
  EXPECT_NE(make_backend_error(o).find("--cpu runs no layer on the GPU and --gpu-layers 3 asks for some"), std::string::npos);
  o.gpu_layers = 0;
  EXPECT_EQ(make_backend_error(o), "") << "--gpu-layers 0 is the CPU";
}

TEST(LayerPlacement, GpuLayersWithoutAGpuIsRefused) {
  if (!std::filesystem::exists(test::shared_model("TinyStories-656K-Q8_0.gguf"))) GTEST_SKIP() << "shared models not found";
  if (engine::gpu_available()) GTEST_SKIP() << "a GPU is present";
  engine::BackendOptions o;
  o.n_ctx = 64;
  o.gpu_layers = 1;
  EXPECT_NE(make_backend_error(o).find("--gpu-layers was given but no CUDA GPU is available"), std::string::npos);
  o.gpu_layers = 0;
  EXPECT_EQ(make_backend_error(o), "");
}

}  // namespace
}  // namespace m40

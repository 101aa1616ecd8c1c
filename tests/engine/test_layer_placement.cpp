// Where a split model's layers run (engine/layer_placement.h): the most
// layers whose plan fits, filled from the last GPU back and the rest on the
// CPU, or the asked layers divided in proportion; the message that says
// where they run; make_backend's refusals of the GPU options without a GPU
// or beside --cpu.
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/backend_factory.h"
#include "engine/layer_placement.h"
#include "model/loaded_model.h"
#include "test_paths.h"

namespace m40 {
namespace {

using backend::LayerRange;
using engine::layers_that_fit;
using engine::PlacedStage;
using engine::place_layers;

}  // namespace
namespace engine {
void PrintTo(const PlacedStage& s, std::ostream* os) {
  *os << (s.gpu < 0 ? std::string("CPU") : "GPU#" + std::to_string(s.gpu)) << " [" << s.layers.first << ", " << s.layers.end
      << ")";
}
}  // namespace engine
namespace {

TEST(LayerPlacement, TakesTheMostLayersThatFit) {
  // 1 GB for the head and scratch, 100 MB a layer.
  const auto plan = [](int g) { return 1000ull + 100ull * static_cast<uint64_t>(g); };
  EXPECT_EQ(layers_that_fit(32, plan, 4200), 32);
  EXPECT_EQ(layers_that_fit(32, plan, 1000 + 100 * 32), 32) << "exactly full";
  EXPECT_EQ(layers_that_fit(32, plan, 1000 + 100 * 32 - 1), 31);
  EXPECT_EQ(layers_that_fit(32, plan, 2599), 15);
  EXPECT_EQ(layers_that_fit(32, plan, 1100), 1);
  EXPECT_EQ(layers_that_fit(32, plan, 1099), 0) << "not one layer";
  EXPECT_EQ(layers_that_fit(1, plan, 5000), 1);
}

TEST(LayerPlacement, AsksOnlyForCountsItCanUse) {
  std::vector<int> asked;
  const auto plan = [&](int g) {
    asked.push_back(g);
    return static_cast<uint64_t>(g);
  };
  EXPECT_EQ(layers_that_fit(80, plan, 57), 57);
  for (int g : asked) {
    EXPECT_GE(g, 1);
    EXPECT_LE(g, 80);
  }
  EXPECT_LE(asked.size(), 8u) << "halving, not one plan per count";
}

// A stage's bytes: 50 a layer, 200 more for the output head, 30 for the
// token embedding, 100 of scratch and reserve.
uint64_t stage_bytes(int, LayerRange r, int n_layer) {
  return 100 + 50ull * static_cast<uint64_t>(r.size()) + (r.end == n_layer ? 200 : 0) + (r.first == 0 ? 30 : 0);
}

TEST(LayerPlacement, FillsTheLastGpuFirstAndLeavesTheRestToTheCpu) {
  const auto bytes = [](int gpu, LayerRange r) { return stage_bytes(gpu, r, 32); };
  // One GPU of 1,000: head + scratch 300, then 14 layers.
  EXPECT_EQ(place_layers(32, -1, {1000}, {}, bytes),
            (std::vector<PlacedStage>{{-1, {0, 18}}, {0, {18, 32}}}));
  // Two: the second holds the head and 14 layers, the first 18 layers (with
  // the embedding: 100 + 900 + 30 = 1,030 > 1,000: 17).
  EXPECT_EQ(place_layers(32, -1, {1000, 1000}, {}, bytes),
            (std::vector<PlacedStage>{{-1, {0, 1}}, {0, {1, 18}}, {1, {18, 32}}}));
  // Room for everything: no CPU stage. The last GPU holds 24 layers and the
  // head (100 + 200 + 1,200), the first the other 8 and the embedding.
  EXPECT_EQ(place_layers(32, -1, {5000, 1500}, {}, bytes),
            (std::vector<PlacedStage>{{0, {0, 8}}, {1, {8, 32}}}));
  // One GPU that holds the whole model takes it all.
  EXPECT_EQ(place_layers(32, -1, {5000, 2000}, {}, bytes), (std::vector<PlacedStage>{{1, {0, 32}}}));
  // The last GPU cannot hold the head with a layer: the one before does.
  EXPECT_EQ(place_layers(32, -1, {1000, 340}, {}, bytes),
            (std::vector<PlacedStage>{{-1, {0, 18}}, {0, {18, 32}}}));
  // No GPU holds a layer: all on the CPU.
  EXPECT_EQ(place_layers(32, -1, {200}, {}, bytes), (std::vector<PlacedStage>{{-1, {0, 32}}}));
}

TEST(LayerPlacement, DividesAskedLayersInProportion) {
  const auto never = [](int, LayerRange) -> uint64_t {
    ADD_FAILURE() << "a division is not checked against the budgets";
    return 0;
  };
  // --tensor-split 3,1 over all 32 layers.
  EXPECT_EQ(place_layers(32, -1, {10, 10}, {3, 1}, never), (std::vector<PlacedStage>{{0, {0, 24}}, {1, {24, 32}}}));
  // --gpu-layers 20: in proportion to the budgets (2:1:1), the rest on the CPU.
  EXPECT_EQ(place_layers(32, 20, {2000, 1000, 1000}, {}, never),
            (std::vector<PlacedStage>{{-1, {0, 12}}, {0, {12, 22}}, {1, {22, 27}}, {2, {27, 32}}}));
  // Largest remainders: 10 layers as 1:1:1 -> 4, 3, 3.
  EXPECT_EQ(place_layers(10, -1, {1, 1, 1}, {1, 1, 1}, never),
            (std::vector<PlacedStage>{{0, {0, 4}}, {1, {4, 7}}, {2, {7, 10}}}));
  // A GPU whose share rounds to nothing gets no stage.
  EXPECT_EQ(place_layers(4, -1, {1, 1}, {10, 1}, never), (std::vector<PlacedStage>{{0, {0, 4}}}));
  // --gpu-layers above the layer count: all of them.
  EXPECT_EQ(place_layers(4, 99, {1}, {}, never), (std::vector<PlacedStage>{{0, {0, 4}}}));
}

TEST(LayerPlacement, RefusesSplitsThatSayNothing) {
  const auto bytes = [](int, LayerRange) -> uint64_t { return 0; };
  EXPECT_THROW(place_layers(32, -1, {1, 1}, {0, 0}, bytes), Error);
  EXPECT_THROW(place_layers(32, -1, {1, 1}, {1, -1}, bytes), Error);
  EXPECT_THROW(place_layers(32, -1, {1, 1}, {1, 1, 1}, bytes), Error);
}

TEST(LayerPlacement, SaysWhereTheLayersRun) {
  const std::vector<int> devices = {2, 0};
  EXPECT_EQ(engine::describe_placement({{-1, {0, 10}}, {0, {10, 31}}, {1, {31, 32}}}, 32, devices),
            "layers 0-9 on the CPU, layers 10-30 on GPU 2, layer 31 and the output head on GPU 0");
  EXPECT_EQ(engine::describe_placement({{-1, {0, 32}}}, 32, devices), "layers 0-31 and the output head on the CPU");
}

TEST(LayerPlacement, SaysWhatADecodeTokenReadsAndTheSpeedItAllows) {
  const uint64_t gib = 1ull << 30;
  // 2 GiB on an M40 (288 GB/s): 7.5 ms, at most 134 tokens/s.
  EXPECT_EQ(engine::describe_decode_reads({{-1, {0, 8}}, {0, {8, 32}}}, {gib / 2, 2 * gib}, {288.0}, {1}),
            "a decode token reads 512.00 MiB on the CPU and 2.00 GiB on GPU 1 (7.5 ms at 288 GB/s): at most 134 tokens/s, "
            "less the CPU's part at its memory bandwidth");
  // Two GPUs, no CPU stage: their times add up (3.7 + 7.5 ms).
  EXPECT_EQ(engine::describe_decode_reads({{0, {0, 8}}, {1, {8, 32}}}, {gib, 2 * gib}, {288.0, 288.0}, {0, 1}),
            "a decode token reads 1.00 GiB on GPU 0 (3.7 ms at 288 GB/s) and 2.00 GiB on GPU 1 (7.5 ms at 288 GB/s): at most "
            "89 tokens/s");
  // A row split: the GPUs read their shares at once, the slower bounds (7.5 ms).
  EXPECT_EQ(engine::describe_decode_reads({{0, {0, 32}}, {1, {0, 32}}}, {gib, 2 * gib}, {288.0, 288.0}, {0, 1}, true),
            "a decode token reads 1.00 GiB on GPU 0 (3.7 ms at 288 GB/s) and 2.00 GiB on GPU 1 (7.5 ms at 288 GB/s): at most "
            "134 tokens/s");
  // A bandwidth the driver does not give: no speed.
  EXPECT_EQ(engine::describe_decode_reads({{0, {0, 32}}}, {gib}, {0.0}, {0}), "a decode token reads 1.00 GiB on GPU 0");
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
  o.gpu_layers = -1;
  o.split_mode = engine::SplitMode::Row;
  EXPECT_NE(make_backend_error(o).find("--cpu runs no layer on the GPU and --split-mode row divides them"), std::string::npos);
}

TEST(LayerPlacement, GpuOptionsWithoutAGpuAreRefused) {
  if (!std::filesystem::exists(test::shared_model("TinyStories-656K-Q8_0.gguf"))) GTEST_SKIP() << "shared models not found";
  if (engine::gpu_available()) GTEST_SKIP() << "a GPU is present";
  engine::BackendOptions o;
  o.n_ctx = 64;
  o.gpu_layers = 1;
  EXPECT_NE(make_backend_error(o).find("--gpu-layers was given but no CUDA GPU is available"), std::string::npos);
  o.gpu_layers = -1;
  o.gpus = {0, 1};
  EXPECT_NE(make_backend_error(o).find("--gpus was given but no CUDA GPU is available"), std::string::npos);
  o.gpus.clear();
  o.tensor_split = {3, 1};
  EXPECT_NE(make_backend_error(o).find("--tensor-split was given but no CUDA GPU is available"), std::string::npos);
  o.gpu_layers = 0;
  EXPECT_EQ(make_backend_error(o), "") << "--gpu-layers 0: the CPU, whatever the split";
  o.tensor_split.clear();
  EXPECT_EQ(make_backend_error(o), "");
  o.gpu_layers = -1;
  o.split_mode = engine::SplitMode::Row;
  EXPECT_NE(make_backend_error(o).find("--split-mode row was given but no CUDA GPU is available"), std::string::npos);
  o.split_mode = engine::SplitMode::Auto;
  EXPECT_EQ(make_backend_error(o), "") << "auto asks for nothing";
}

TEST(LayerPlacement, SplitModesByName) {
  EXPECT_EQ(engine::split_mode_from_name("auto"), engine::SplitMode::Auto);
  EXPECT_EQ(engine::split_mode_from_name("layer"), engine::SplitMode::Layer);
  EXPECT_EQ(engine::split_mode_from_name("row"), engine::SplitMode::Row);
  EXPECT_THROW(engine::split_mode_from_name("diagonal"), Error);
}

}  // namespace
}  // namespace m40

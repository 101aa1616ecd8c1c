// Weight loading refuses incomplete or misshapen models by name, before any
// computation.
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/writer.h"
#include "model/loaded_model.h"
#include "test_paths.h"

using namespace m40;

namespace {

// A copy of a shared model with `edit` applied to each tensor's shape (or
// the tensor dropped when edit returns false).
// `edit_metadata` (optional) then changes the metadata.
std::string rewritten(const std::string& name,
                      const std::function<bool(const gguf::TensorInfo&, std::vector<uint64_t>&, gguf::TensorType&)>& edit,
                      const std::function<void(gguf::Metadata&)>& edit_metadata = {}) {
  auto original = gguf::File::open(test::shared_model(name).string());
  gguf::Writer w(original.alignment());
  for (const auto& [key, value] : original.metadata().entries()) w.metadata().set(key, value);
  if (edit_metadata) edit_metadata(w.metadata());
  for (const auto& t : original.tensors()) {
    std::vector<uint64_t> dims = t.dims;
    gguf::TensorType type = t.type;
    if (!edit(t, dims, type)) continue;
    const uint64_t bytes = gguf::tensor_byte_size(type, dims);
    w.add_tensor(t.name, type, dims, [bytes](std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0x3c); });
    (void)bytes;
  }
  const auto path = std::filesystem::temp_directory_path() / ("m40_weights_" + std::to_string(::getpid()) + ".gguf");
  w.write(path.string());
  return path.string();
}

void expect_load_error(const std::string& path, const std::string& fragment) {
  try {
    model::LoadedModel::open(path);
    FAIL() << "expected an error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

class ModelWeightsLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::shared_model("synthetic/tiny-llama-rand-F32.gguf"))) GTEST_SKIP();
  }
};

}  // namespace

TEST_F(ModelWeightsLoad, EveryRunnableSharedModelLoads) {
  for (const char* name : {"synthetic/tiny-llama-rand-F32.gguf", "synthetic/tiny-llama-rand-Q4_K_M.gguf",
                           "TinyStories-656K-Q8_0.gguf", "TinyStories-656K-Q2_K.gguf", "llama-2-tiny-random.gguf"}) {
    auto m = model::LoadedModel::open(test::shared_model(name).string());
    EXPECT_EQ(m->weights.layers.size(), m->hparams.n_layer) << name;
    EXPECT_GT(m->weights.total_bytes(), 0u) << name;
  }
  EXPECT_TRUE(model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string())->weights.tied_output);
}

TEST_F(ModelWeightsLoad, AMissingTensorIsNamed) {
  expect_load_error(rewritten("synthetic/tiny-llama-rand-F32.gguf",
                              [](const gguf::TensorInfo& t, auto&, auto&) { return t.name != "blk.1.ffn_up.weight"; }),
                    "lacks tensor 'blk.1.ffn_up.weight'");
}

TEST_F(ModelWeightsLoad, AWrongShapeIsNamedWithBothShapes) {
  expect_load_error(rewritten("synthetic/tiny-llama-rand-F32.gguf",
                              [](const gguf::TensorInfo& t, std::vector<uint64_t>& dims, auto&) {
                                if (t.name == "blk.0.attn_k.weight") dims[1] = 64;
                                return true;
                              }),
                    "tensor 'blk.0.attn_k.weight' has shape [256, 64], expected [256, 128]");
}

TEST_F(ModelWeightsLoad, ATypeWithoutKernelsIsNamed) {
  expect_load_error(rewritten("synthetic/tiny-llama-rand-F32.gguf",
                              [](const gguf::TensorInfo& t, auto&, gguf::TensorType& type) {
                                if (t.name == "blk.0.attn_q.weight") type = gguf::TensorType::IQ2_XXS;
                                return true;
                              }),
                    "has type IQ2_XXS, which m40-llm cannot compute with yet");
}

namespace {

// Repro of a crafted file: 65536 heads of 65536 wrap n_head * head_dim to 0 in
// 32 bits, and the attention tensors are stored empty to match. Before the
// hyperparameters were bounded this loaded into a division by zero (SIGFPE).
std::string empty_attention_model() {
  return rewritten(
      "synthetic/tiny-llama-rand-F32.gguf",
      [](const gguf::TensorInfo& t, std::vector<uint64_t>& dims, auto&) {
        if (t.name.find(".attn_q.weight") != std::string::npos || t.name.find(".attn_k.weight") != std::string::npos ||
            t.name.find(".attn_v.weight") != std::string::npos) {
          dims[1] = 0;
        }
        if (t.name.find(".attn_output.weight") != std::string::npos) dims[0] = 0;
        return true;
      },
      [](gguf::Metadata& m) {
        m.set("llama.attention.head_count", uint32_t{65536});
        m.set("llama.attention.head_count_kv", uint32_t{65536});
        m.set("llama.attention.key_length", uint32_t{65536});
      });
}

}  // namespace

TEST_F(ModelWeightsLoad, HeadCountsThatWrapTheQueryWidthAreRefused) {
  expect_load_error(empty_attention_model(), "gives a query width of 4294967296");
}

// The weight check stands on its own: hyperparameters that ask for an empty
// matrix (however they came about) are refused, not divided by.
TEST_F(ModelWeightsLoad, AnEmptyMatrixIsRefused) {
  const std::string path = empty_attention_model();
  const auto file = gguf::File::open(path);
  auto hp = model::ModelHparams::from_file(
      gguf::File::open(test::shared_model("synthetic/tiny-llama-rand-F32.gguf").string()));
  hp.n_head = hp.n_head_kv = hp.n_embd_head = 65536;  // q_dim() == 0
  try {
    model::ModelWeights::load(file, hp);
    ADD_FAILURE() << "expected an m40::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.0.attn_q.weight' would be an empty [256, 0] matrix"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

// A block count the file's tensors cannot back is refused before the layers
// are allocated: 20 million made a 340 KB file take 13 GB, 4 billion threw
// std::bad_alloc.
TEST_F(ModelWeightsLoad, ABlockCountBeyondTheTensorsIsRefusedBeforeAllocating) {
  for (uint32_t n_layer : {3u, 20'000'000u, 4'000'000'000u}) {
    expect_load_error(rewritten(
                          "synthetic/tiny-llama-rand-F32.gguf", [](auto&, auto&, auto&) { return true; },
                          [n_layer](gguf::Metadata& m) { m.set("llama.block_count", n_layer); }),
                      "llama.block_count is " + std::to_string(n_layer) + ", but the file holds only 21 tensors");
  }
}

// Mixture-of-experts files: each expert tensor holds expert_count slices of
// the expert's shape; a missing one, a wrong slice count and routers without
// an expert count are named.
TEST_F(ModelWeightsLoad, ExpertTensorsAreCheckedSliceBySlice) {
  const std::string moe = "arch/tiny-mixtral-F32.gguf";
  if (!std::filesystem::exists(test::shared_model(moe))) GTEST_SKIP() << "shared data missing";
  {
    auto m = model::LoadedModel::open(test::shared_model(moe).string());
    const auto& l = m->weights.layers[1];
    ASSERT_EQ(l.down_exps.size(), 4u);
    EXPECT_EQ(l.down_exps[3].cols, 64u);
    EXPECT_EQ(l.down_exps[3].rows, 128u);
    EXPECT_EQ(l.down_exps[3].data, l.down_exps[0].data + 3 * 128 * l.down_exps[0].row_bytes);
  }
  expect_load_error(rewritten(moe, [](const gguf::TensorInfo& t, auto&, auto&) {
                      return t.name != "blk.1.ffn_up_exps.weight";
                    }),
                    "lacks tensor 'blk.1.ffn_up_exps.weight'");
  expect_load_error(rewritten(moe,
                              [](const gguf::TensorInfo& t, std::vector<uint64_t>& dims, auto&) {
                                if (t.name == "blk.0.ffn_gate_exps.weight") dims[2] = 3;
                                return true;
                              }),
                    "tensor 'blk.0.ffn_gate_exps.weight' has shape [128, 64, 3], expected [128, 64, 4]");
  expect_load_error(rewritten(
                        moe, [](const gguf::TensorInfo&, auto&, auto&) { return true; },
                        [](gguf::Metadata& md) { md.set("llama.expert_count", uint32_t{0}); }),
                    "llama.expert_count");
}

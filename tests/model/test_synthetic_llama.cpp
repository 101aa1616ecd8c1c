// Synthetic models: valid files of the asked shape, types laid out as
// llama-quantize lays them out, weights with the intended statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <utility>

#include "gguf/file.h"
#include "model/synthetic_llama.h"
#include "quant/dequantize.h"
#include "test_paths.h"

using namespace m40;
using gguf::TensorType;

namespace {

std::filesystem::path temp_model(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("m40_synth_" + name + ".gguf");
}

std::vector<uint8_t> read_whole(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class SyntheticLlama : public ::testing::Test {
 protected:
  void SetUp() override {
    auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    tokenizer_ = std::make_unique<gguf::File>(gguf::File::open(path.string()));
  }
  model::SyntheticOptions options(const std::string& recipe) {
    model::SyntheticOptions o;
    o.shape = *model::synthetic_shape("tiny");
    o.recipe = recipe;
    o.tokenizer_source = tokenizer_.get();
    return o;
  }
  std::unique_ptr<gguf::File> tokenizer_;
};

}  // namespace

// The shared tiny-llama-rand files were made by llama-quantize from a model
// of the same shape: our recipes must choose the same type for every tensor.
TEST_F(SyntheticLlama, TensorTypesMatchLlamaQuantizeOnTheSameShape) {
  for (const auto& [recipe, reference] : std::vector<std::pair<std::string, std::string>>{
           {"q4_k_m", "Q4_K_M"}, {"q4_0", "Q4_0"}, {"q8_0", "Q8_0"}, {"f16", "F16"}, {"f32", "F32"}}) {
    SCOPED_TRACE(recipe);
    auto ref_path = test::shared_model("synthetic/tiny-llama-rand-" + reference + ".gguf");
    if (!std::filesystem::exists(ref_path)) GTEST_SKIP() << "shared synthetic models not found";
    gguf::File ref = gguf::File::open(ref_path.string());
    auto path = temp_model(recipe);
    model::write_synthetic_llama(options(recipe), path.string());
    gguf::File ours = gguf::File::open(path.string());
    ASSERT_EQ(ours.tensors().size(), ref.tensors().size());
    for (const auto& t : ref.tensors()) {
      const gguf::TensorInfo& mine = ours.tensor(t.name);
      EXPECT_EQ(mine.type, t.type) << t.name;
      EXPECT_EQ(mine.dims, t.dims) << t.name;
    }
    for (const char* key : {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                            "llama.attention.head_count", "llama.attention.head_count_kv",
                            "llama.rope.dimension_count", "llama.context_length", "general.file_type"}) {
      EXPECT_EQ(ours.metadata().get<uint32_t>(key), ref.metadata().get<uint32_t>(key)) << key;
    }
    std::filesystem::remove(path);
  }
}

// llama-quantize's mixes (llama_tensor_get_type in llama.cpp's
// src/llama-quant.cpp) on 32 layers, as llama2-7b has: which matrices get more
// bits in which layers, and the file type each recipe records.
TEST_F(SyntheticLlama, MixesRaiseTheMatricesLlamaQuantizeRaises) {
  struct Expect {
    const char* recipe;
    uint32_t kv_heads;  // of 4 heads: 4 is plain attention, 1 puts 4 query heads on each KV head
    const char* tensor;
    TensorType type;
  };
  const Expect expectations[] = {
      {"q2_k", 4, "token_embd.weight", TensorType::Q2_K},
      {"q2_k", 4, "blk.5.attn_q.weight", TensorType::Q2_K},
      {"q2_k", 4, "blk.5.ffn_up.weight", TensorType::Q2_K},
      {"q2_k", 4, "blk.5.attn_v.weight", TensorType::Q3_K},
      {"q2_k", 4, "blk.5.attn_output.weight", TensorType::Q3_K},
      {"q2_k", 4, "blk.5.ffn_down.weight", TensorType::Q3_K},
      {"q2_k", 4, "output.weight", TensorType::Q6_K},
      {"q2_k", 1, "blk.5.attn_v.weight", TensorType::Q4_K},
      {"q3_k_s", 4, "blk.0.attn_v.weight", TensorType::Q3_K},
      {"q3_k_s", 4, "blk.0.ffn_down.weight", TensorType::Q3_K},
      {"q3_k_s", 4, "output.weight", TensorType::Q6_K},
      {"q3_k_m", 4, "blk.1.attn_v.weight", TensorType::Q5_K},
      {"q3_k_m", 4, "blk.2.attn_v.weight", TensorType::Q4_K},
      {"q3_k_m", 4, "blk.1.ffn_down.weight", TensorType::Q5_K},  // the first 32 / 16 layers
      {"q3_k_m", 4, "blk.2.ffn_down.weight", TensorType::Q4_K},
      {"q3_k_m", 4, "blk.31.attn_output.weight", TensorType::Q4_K},
      {"q3_k_m", 4, "blk.9.ffn_gate.weight", TensorType::Q3_K},
      {"q3_k_l", 4, "blk.9.attn_v.weight", TensorType::Q5_K},
      {"q3_k_l", 4, "blk.9.attn_output.weight", TensorType::Q5_K},
      {"q3_k_l", 4, "blk.9.ffn_down.weight", TensorType::Q5_K},
      {"q3_k_l", 4, "blk.9.attn_k.weight", TensorType::Q3_K},
      {"iq4_nl", 4, "blk.3.ffn_down.weight", TensorType::Q5_K},  // the first 32 / 8 layers
      {"iq4_nl", 4, "blk.4.ffn_down.weight", TensorType::IQ4_NL},
      {"iq4_nl", 4, "blk.0.attn_v.weight", TensorType::IQ4_NL},
      {"iq4_nl", 1, "blk.0.attn_v.weight", TensorType::Q5_K},
      {"iq4_nl", 4, "output.weight", TensorType::Q6_K},
      {"iq4_xs", 4, "blk.3.ffn_down.weight", TensorType::Q5_K},
      {"iq4_xs", 4, "blk.4.ffn_down.weight", TensorType::IQ4_XS},
      {"iq4_xs", 1, "blk.9.attn_v.weight", TensorType::Q5_K},
      {"iq4_xs", 4, "blk.9.attn_q.weight", TensorType::IQ4_XS},
      {"q4_k", 4, "blk.3.attn_v.weight", TensorType::Q5_K},  // Q4_K_S: attn_v of layers 0-3
      {"q4_k", 4, "blk.4.attn_v.weight", TensorType::Q4_K},
      {"q4_k", 4, "blk.3.ffn_down.weight", TensorType::Q5_K},  // and ffn_down of the first 32 / 8
      {"q4_k", 4, "blk.4.ffn_down.weight", TensorType::Q4_K},
      {"q4_k", 4, "blk.4.attn_output.weight", TensorType::Q4_K},
      {"q4_k_m", 4, "blk.3.attn_v.weight", TensorType::Q6_K},  // use_more_bits: layers 0-3, 28-31, 6, 9, ...
      {"q4_k_m", 4, "blk.4.attn_v.weight", TensorType::Q4_K},
      {"q4_k_m", 4, "blk.6.ffn_down.weight", TensorType::Q6_K},
      {"q4_k_m", 4, "blk.7.ffn_down.weight", TensorType::Q4_K},
      {"q4_k_m", 4, "blk.28.ffn_down.weight", TensorType::Q6_K},
      {"q4_1", 4, "blk.0.ffn_down.weight", TensorType::Q4_1},
      {"q4_1", 4, "output.weight", TensorType::Q6_K},
      {"q5_0", 4, "blk.0.attn_v.weight", TensorType::Q5_0},
      {"q5_1", 4, "blk.0.attn_v.weight", TensorType::Q5_1},
      {"q5_1", 4, "output.weight", TensorType::Q6_K},
  };
  const std::map<std::string, uint32_t> file_types = {
      {"q4_1", 3},    {"q5_0", 8},    {"q5_1", 9},    {"q2_k", 10},   {"q3_k_s", 11},
      {"q3_k_m", 12}, {"q3_k_l", 13}, {"q4_k", 14},   {"q4_k_m", 15}, {"iq4_nl", 25}, {"iq4_xs", 30},
  };
  std::map<std::pair<std::string, uint32_t>, std::unique_ptr<gguf::File>> files;
  auto file = [&](const std::string& recipe, uint32_t kv_heads) -> const gguf::File& {
    auto& f = files[{recipe, kv_heads}];
    if (!f) {
      auto o = options(recipe);
      o.shape.n_layer = 32;
      o.shape.n_ff = 256;
      o.shape.n_head_kv = kv_heads;
      auto path = temp_model("mix_" + recipe);
      model::write_synthetic_llama(o, path.string());
      f = std::make_unique<gguf::File>(gguf::File::open(path.string()));
      std::filesystem::remove(path);  // the open file keeps its mapping
    }
    return *f;
  };
  for (const Expect& e : expectations) {
    EXPECT_EQ(file(e.recipe, e.kv_heads).tensor(e.tensor).type, e.type)
        << e.recipe << " " << e.tensor << " with " << e.kv_heads << " KV heads";
  }
  for (const auto& [recipe, file_type] : file_types) {
    EXPECT_EQ(file(recipe, 4).metadata().get<uint32_t>("general.file_type"), file_type) << recipe;
  }
}

TEST_F(SyntheticLlama, CopiesTheTokenizerAndIsDeterministic) {
  auto a = temp_model("det_a"), b = temp_model("det_b"), c = temp_model("det_c");
  auto o = options("q4_k");
  model::write_synthetic_llama(o, a.string());
  model::write_synthetic_llama(o, b.string());
  o.seed = 99;
  model::write_synthetic_llama(o, c.string());
  EXPECT_EQ(read_whole(a), read_whole(b));
  EXPECT_NE(read_whole(a), read_whole(c));
  gguf::File f = gguf::File::open(a.string());
  for (const auto& [key, value] : tokenizer_->metadata().entries()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    EXPECT_EQ(*f.metadata().find(key), value) << key;
  }
  EXPECT_EQ(f.metadata().get<uint32_t>("llama.vocab_size"), 2048u);
  for (const auto& p : {a, b, c}) std::filesystem::remove(p);
}

// Dequantized weights have the spread the recipe asks for, with no
// non-finite value and no all-zero block.
TEST_F(SyntheticLlama, WeightsHaveRealisticMagnitudes) {
  for (const std::string recipe : {"f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs", "q2_k", "q3_k_s",
                                   "q4_k", "q5_k", "q6_k"}) {
    SCOPED_TRACE(recipe);
    auto path = temp_model("stats_" + recipe);
    model::write_synthetic_llama(options(recipe), path.string());
    gguf::File f = gguf::File::open(path.string());
    struct Expect { const char* name; double mean; double sd; };
    for (const Expect& e : {Expect{"blk.0.attn_q.weight", 0.0, 1.0 / 16},
                            Expect{"blk.1.ffn_down.weight", 0.0, 1.0 / std::sqrt(768.0)},
                            Expect{"token_embd.weight", 0.0, 1.0},
                            Expect{"blk.0.attn_norm.weight", 1.0, 0.1}}) {
      const gguf::TensorInfo& t = f.tensor(e.name);
      std::vector<float> values(t.element_count);
      quant::dequantize_row(t.type, f.tensor_data(t).data(), values.data(), static_cast<int64_t>(t.element_count));
      double sum = 0, sum2 = 0;
      for (float v : values) {
        ASSERT_TRUE(std::isfinite(v)) << e.name;
        sum += v;
        sum2 += static_cast<double>(v) * v;
      }
      const double n = static_cast<double>(values.size());
      const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
      EXPECT_NEAR(mean, e.mean, 0.05 * e.sd + 0.01 * std::abs(e.mean)) << e.name;
      EXPECT_NEAR(sd, e.sd, 0.12 * e.sd) << e.name;
    }
    std::filesystem::remove(path);
  }
}

TEST_F(SyntheticLlama, CustomShapesFallBackWhereBlocksDoNotFit) {
  auto o = options("q4_k");
  o.shape.n_embd = 96;  // not a multiple of 256: K-quants cannot hold its rows
  o.shape.n_head = 3;
  o.shape.n_head_kv = 1;
  o.shape.n_ff = 256;
  auto path = temp_model("fallback");
  auto report = model::write_synthetic_llama(o, path.string());
  EXPECT_FALSE(report.notes.empty());
  gguf::File f = gguf::File::open(path.string());
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, TensorType::Q8_0);
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, TensorType::Q4_K);  // rows of 256 fit
  std::filesystem::remove(path);
}

TEST_F(SyntheticLlama, BadShapesAndRecipesAreRefused) {
  auto o = options("q9_9");
  EXPECT_THROW(model::write_synthetic_llama(o, temp_model("bad").string()), Error);
  o = options("f16");
  o.shape.n_head = 5;  // 256 is not divisible by 5
  EXPECT_THROW(model::write_synthetic_llama(o, temp_model("bad").string()), Error);
  o = options("f16");
  o.tokenizer_source = nullptr;
  EXPECT_THROW(model::write_synthetic_llama(o, temp_model("bad").string()), Error);
  o = options("f16");
  EXPECT_THROW(model::write_synthetic_llama(o, "/nonexistent-dir/x.gguf"), Error);
  EXPECT_FALSE(std::filesystem::exists(temp_model("bad")));
}

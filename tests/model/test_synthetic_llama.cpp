// Synthetic models: valid files of the asked shape, types laid out as
// llama-quantize lays them out, weights with the intended statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "gguf/file.h"
#include "model/loaded_model.h"
#include "model/synthetic_llama.h"
#include "quant/dequantize.h"
#include "test_paths.h"

using namespace m40;
using gguf::TensorType;

namespace m40::gguf {
// Failures name the type rather than dumping its bytes.
static void PrintTo(TensorType type, std::ostream* os) { *os << tensor_type_name(type); }
}  // namespace m40::gguf

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

// ---------------------------------------------------------------------------
// Architectures besides llama. The oracle for each is the tiny model of the
// same architecture in models/arch/, which llama.cpp's gguf writer made and
// llama.cpp loads and runs: our tiny-<arch> shape has its dimensions, so the
// two files must hold the same tensors, shapes, types and hyperparameter keys.

namespace {

std::filesystem::path arch_model(const std::string& file) { return test::shared_model("arch/" + file); }

// The keys that describe the model (not its tokenizer, name or provenance).
std::map<std::string, gguf::Value> hparam_entries(const gguf::File& f) {
  std::map<std::string, gguf::Value> out;
  for (const auto& [key, value] : f.metadata().entries()) {
    if (key.rfind("general.", 0) == 0 || key.rfind("tokenizer.", 0) == 0 || key.rfind("m40.", 0) == 0) continue;
    out.emplace(key, value);
  }
  return out;
}

std::set<std::string> tensor_names(const gguf::File& f) {
  std::set<std::string> names;
  for (const auto& t : f.tensors()) names.insert(t.name);
  return names;
}

struct ArchCase {
  std::string shape;      // our tiny shape
  std::string reference;  // models/arch/<reference>-F32.gguf (and -Q8_0 where it exists)
  // What the reference has that ours must not, and the reverse, with why.
  std::set<std::string> reference_only_tensors, our_only_tensors, reference_only_keys;
  std::set<std::string> keys_with_other_values;
};

const std::vector<ArchCase>& arch_cases() {
  static const std::vector<ArchCase> cases = {
      {"tiny-qwen2", "tiny-qwen2", {}, {}, {}, {}},
      {"tiny-qwen3", "tiny-qwen3", {}, {}, {}, {}},
      {"tiny-gemma2", "tiny-gemma2", {}, {}, {}, {}},
      {"tiny-gemma3", "tiny-gemma3", {}, {}, {}, {}},
      // tiny-phi3 of models/arch/ is a Phi-3.5-mini (LongRoPE factors, 128K
      // context, tied head); ours is a small Phi-4, which has none of these.
      {"tiny-phi3",
       "tiny-phi3",
       {"rope_factors_long.weight", "rope_factors_short.weight"},
       {"output.weight"},
       {"phi3.rope.scaling.attn_factor"},
       {"phi3.context_length", "phi3.rope.freq_base", "phi3.attention.sliding_window",
        "phi3.rope.scaling.original_context_length"}},
      {"tiny-qwen3moe", "tiny-qwen3moe", {}, {}, {}, {}},
      {"tiny-mixtral", "tiny-mixtral", {}, {}, {}, {}},
  };
  return cases;
}

}  // namespace

TEST(SyntheticArchitectures, TinyModelsHoldWhatLlamaCppWrites) {
  for (const ArchCase& c : arch_cases()) {
    for (const auto& [recipe, suffix] : std::vector<std::pair<std::string, std::string>>{{"f32", "F32"},
                                                                                          {"q8_0", "Q8_0"}}) {
      SCOPED_TRACE(c.shape + " " + recipe);
      const auto ref_path = arch_model(c.reference + "-" + suffix + ".gguf");
      if (!std::filesystem::exists(ref_path)) {
        if (suffix == "F32") GTEST_SKIP() << "models/arch not found";
        continue;  // not every architecture has a Q8_0 reference
      }
      gguf::File ref = gguf::File::open(ref_path.string());
      model::SyntheticOptions o;
      o.shape = *model::synthetic_shape(c.shape);
      o.recipe = recipe;
      o.tokenizer_source = &ref;  // the same vocabulary, so token_embd has the same shape
      auto path = temp_model("arch_" + c.shape + "_" + recipe);
      model::write_synthetic_llama(o, path.string());
      gguf::File ours = gguf::File::open(path.string());

      EXPECT_EQ(ours.metadata().get<std::string>("general.architecture"),
                ref.metadata().get<std::string>("general.architecture"));

      // Tensors: the same names (apart from the listed ones), shapes and types.
      std::set<std::string> expected_names = tensor_names(ref);
      for (const auto& n : c.reference_only_tensors) EXPECT_EQ(expected_names.erase(n), 1u) << n;
      expected_names.insert(c.our_only_tensors.begin(), c.our_only_tensors.end());
      EXPECT_EQ(tensor_names(ours), expected_names);
      for (const auto& t : ref.tensors()) {
        const gguf::TensorInfo* mine = ours.find_tensor(t.name);
        if (mine == nullptr) continue;
        EXPECT_EQ(mine->dims, t.dims) << t.name;
        EXPECT_EQ(mine->type, t.type) << t.name;
      }

      // Hyperparameter keys: the same set; the same values unless listed.
      const auto ref_keys = hparam_entries(ref), our_keys = hparam_entries(ours);
      std::set<std::string> expected_keys, actual_keys;
      for (const auto& [key, value] : ref_keys) {
        if (!c.reference_only_keys.count(key)) expected_keys.insert(key);
      }
      for (const auto& [key, value] : our_keys) actual_keys.insert(key);
      EXPECT_EQ(actual_keys, expected_keys);
      for (const auto& [key, value] : our_keys) {
        auto it = ref_keys.find(key);
        if (it == ref_keys.end() || c.keys_with_other_values.count(key)) continue;
        EXPECT_EQ(value, it->second) << key << ": ours " << value.to_display_string() << ", llama.cpp's "
                                     << it->second.to_display_string();
      }
      std::filesystem::remove(path);
    }
  }
}

// The named shapes are the published models: their parameter counts (with
// the models' own vocabulary sizes; gemma3's converter keeps 262144 of the
// 262208 embedding rows) equal the totals of the released checkpoints.
TEST(SyntheticArchitectures, NamedShapesHaveThePublishedParameterCounts) {
  struct Expect {
    const char* shape;
    const char* architecture;
    uint64_t n_vocab;
    uint64_t parameters;
  };
  for (const Expect& e : {Expect{"llama2-7b", "llama", 32000, 6738415616ull},
                          Expect{"llama3-8b", "llama", 128256, 8030261248ull},
                          Expect{"qwen2.5-7b", "qwen2", 152064, 7615616512ull},
                          Expect{"qwen3-8b", "qwen3", 151936, 8190735360ull},
                          Expect{"qwen3-14b", "qwen3", 151936, 14768307200ull},
                          Expect{"gemma2-9b", "gemma2", 256000, 9241705984ull},
                          Expect{"gemma3-12b", "gemma3", 262144, 11765788416ull},
                          Expect{"phi4-14b", "phi3", 100352, 14659507200ull}}) {
    SCOPED_TRACE(e.shape);
    auto shape = model::synthetic_shape(e.shape);
    ASSERT_TRUE(shape.has_value());
    EXPECT_EQ(shape->architecture, e.architecture);
    EXPECT_EQ(model::plan_synthetic_model(*shape, "f16", e.n_vocab).parameter_count, e.parameters);
  }
}

TEST(SyntheticArchitectures, NamedShapesHaveTheRealTensorShapes) {
  auto dims_of = [](const std::string& shape, const std::string& tensor) {
    const auto plan = model::plan_synthetic_model(*model::synthetic_shape(shape), "q4_k_m", 1024);
    for (const auto& t : plan.tensors) {
      if (t.name == tensor) return t.dims;
    }
    return std::vector<uint64_t>{};
  };
  using D = std::vector<uint64_t>;
  EXPECT_EQ(dims_of("qwen2.5-7b", "blk.27.attn_k.bias"), D({512}));
  EXPECT_EQ(dims_of("qwen2.5-7b", "output.weight"), D({3584, 1024}));
  EXPECT_EQ(dims_of("qwen3-8b", "blk.0.attn_k_norm.weight"), D({128}));
  EXPECT_EQ(dims_of("qwen3-14b", "blk.39.attn_output.weight"), D({5120, 5120}));
  EXPECT_EQ(dims_of("gemma2-9b", "blk.41.attn_q.weight"), D({3584, 4096}));  // 16 heads of 256, not n_embd
  EXPECT_EQ(dims_of("gemma2-9b", "blk.0.attn_output.weight"), D({4096, 3584}));
  EXPECT_EQ(dims_of("gemma2-9b", "output.weight"), D{});  // tied
  EXPECT_EQ(dims_of("gemma3-12b", "blk.47.post_ffw_norm.weight"), D({3840}));
  EXPECT_EQ(dims_of("gemma3-12b", "blk.0.attn_v.weight"), D({3840, 2048}));
  EXPECT_EQ(dims_of("phi4-14b", "blk.0.attn_qkv.weight"), D({5120, 5120 + 2 * 1280}));
  EXPECT_EQ(dims_of("phi4-14b", "blk.0.ffn_up.weight"), D({5120, 2 * 17920}));
  EXPECT_EQ(dims_of("phi4-14b", "blk.0.ffn_gate.weight"), D{});
  EXPECT_EQ(dims_of("phi4-14b", "output.weight"), D({5120, 1024}));
}

// llama_tensor_get_type (llama.cpp src/llama-quant.cpp) on the new tensors:
// attn_qkv is in attn_v's category, a tied token_embd is typed as the output
// head, and vectors (biases, Q/K norms, post norms) stay F32.
TEST(SyntheticArchitectures, NewTensorsAreTypedAsLlamaQuantizeTypesThem) {
  auto type_of = [](model::SyntheticShape shape, const std::string& recipe, const std::string& tensor) {
    for (const auto& t : model::plan_synthetic_model(shape, recipe, 1024).tensors) {
      if (t.name == tensor) return t.type;
    }
    ADD_FAILURE() << "no " << tensor;
    return TensorType::F32;
  };
  auto phi3 = *model::synthetic_shape("tiny-phi3");
  phi3.n_layer = 32;
  phi3.n_embd = 256;
  phi3.n_ff = 256;
  phi3.n_head_kv = 4;  // one query head per KV head
  EXPECT_EQ(type_of(phi3, "q4_k_m", "blk.3.attn_qkv.weight"), TensorType::Q6_K);  // use_more_bits as attn_v
  EXPECT_EQ(type_of(phi3, "q4_k_m", "blk.4.attn_qkv.weight"), TensorType::Q4_K);
  EXPECT_EQ(type_of(phi3, "q4_k_m", "blk.6.attn_qkv.weight"), TensorType::Q6_K);
  EXPECT_EQ(type_of(phi3, "q4_k_m", "blk.4.ffn_up.weight"), TensorType::Q4_K);
  EXPECT_EQ(type_of(phi3, "q4_k_m", "blk.28.ffn_down.weight"), TensorType::Q6_K);
  EXPECT_EQ(type_of(phi3, "q4_k_m", "token_embd.weight"), TensorType::Q4_K);  // untied: the recipe's type
  EXPECT_EQ(type_of(phi3, "q4_k_m", "output.weight"), TensorType::Q6_K);
  EXPECT_EQ(type_of(phi3, "q3_k_m", "blk.1.attn_qkv.weight"), TensorType::Q5_K);
  EXPECT_EQ(type_of(phi3, "q3_k_m", "blk.2.attn_qkv.weight"), TensorType::Q4_K);
  EXPECT_EQ(type_of(phi3, "q3_k_l", "blk.9.attn_qkv.weight"), TensorType::Q5_K);
  EXPECT_EQ(type_of(phi3, "q2_k", "blk.9.attn_qkv.weight"), TensorType::Q3_K);
  EXPECT_EQ(type_of(phi3, "q4_k", "blk.3.attn_qkv.weight"), TensorType::Q5_K);
  phi3.n_head_kv = 1;  // 4 query heads per KV head (n_gqa() >= 4)
  EXPECT_EQ(type_of(phi3, "q2_k", "blk.9.attn_qkv.weight"), TensorType::Q4_K);
  EXPECT_EQ(type_of(phi3, "iq4_xs", "blk.9.attn_qkv.weight"), TensorType::Q5_K);

  auto gemma3 = *model::synthetic_shape("tiny-gemma3");
  gemma3.n_embd = 256;
  gemma3.n_ff = 256;
  gemma3.head_dim = 64;
  EXPECT_EQ(type_of(gemma3, "q4_k_m", "token_embd.weight"), TensorType::Q6_K);  // tied: the head's type
  EXPECT_EQ(type_of(gemma3, "q4_0", "token_embd.weight"), TensorType::Q6_K);
  EXPECT_EQ(type_of(gemma3, "q8_0", "token_embd.weight"), TensorType::Q8_0);
  EXPECT_EQ(type_of(gemma3, "f16", "token_embd.weight"), TensorType::F16);
  EXPECT_EQ(type_of(gemma3, "q4_k_m", "blk.0.attn_q_norm.weight"), TensorType::F32);
  EXPECT_EQ(type_of(gemma3, "q4_k_m", "blk.0.post_attention_norm.weight"), TensorType::F32);
  EXPECT_EQ(type_of(gemma3, "q4_k_m", "blk.2.post_ffw_norm.weight"), TensorType::F32);
  gemma3.n_embd = 64;  // rows that do not fit Q4_K blocks: llama.cpp takes Q8_0 for the head
  EXPECT_EQ(type_of(gemma3, "q4_k_m", "token_embd.weight"), TensorType::Q8_0);

  auto qwen2 = *model::synthetic_shape("tiny-qwen2");
  qwen2.n_embd = 256;
  qwen2.n_ff = 256;
  EXPECT_EQ(type_of(qwen2, "q4_k_m", "token_embd.weight"), TensorType::Q6_K);
  EXPECT_EQ(type_of(qwen2, "q4_k_m", "blk.0.attn_q.bias"), TensorType::F32);
  qwen2.tied_output = false;  // as Qwen2.5-7B
  EXPECT_EQ(type_of(qwen2, "q4_k_m", "token_embd.weight"), TensorType::Q4_K);
  EXPECT_EQ(type_of(qwen2, "q4_k_m", "output.weight"), TensorType::Q6_K);
}

// Biases are drawn small around 0, the extra norms near 1, and a tied
// token_embd at the output head's scale (it is the head).
TEST(SyntheticArchitectures, NewTensorsHaveTheirIntendedStatistics) {
  const auto tok_path = arch_model("tiny-qwen2-F32.gguf");
  if (!std::filesystem::exists(tok_path)) GTEST_SKIP() << "models/arch not found";
  gguf::File tokenizer = gguf::File::open(tok_path.string());
  struct Expect {
    const char* shape;
    const char* tensor;
    double mean, sd;
  };
  std::map<std::string, std::unique_ptr<gguf::File>> files;
  for (const Expect& e : {Expect{"tiny-qwen2", "blk.0.attn_q.bias", 0.0, 0.02},
                          Expect{"tiny-qwen2", "blk.1.attn_k.bias", 0.0, 0.02},
                          Expect{"tiny-qwen2", "token_embd.weight", 0.0, 4.0 / std::sqrt(1024.0)},
                          Expect{"tiny-gemma3", "blk.0.post_attention_norm.weight", 1.0, 0.1},
                          Expect{"tiny-gemma3", "blk.2.attn_k_norm.weight", 1.0, 0.1},
                          Expect{"tiny-gemma3", "blk.1.attn_output.weight", 0.0, 1.0 / std::sqrt(1024.0)},
                          Expect{"tiny-phi3", "blk.0.attn_qkv.weight", 0.0, 1.0 / std::sqrt(1024.0)}}) {
    SCOPED_TRACE(std::string(e.shape) + " " + e.tensor);
    auto& f = files[e.shape];
    if (!f) {
      model::SyntheticOptions o;
      o.shape = *model::synthetic_shape(e.shape);
      // Wide enough for every checked vector to hold 256+ values, with
      // projections 1024 wide (gemma3: 4 heads of 256).
      o.shape.n_embd = 1024;
      if (o.shape.architecture == "gemma3") o.shape.head_dim = 256;
      o.recipe = "f32";
      o.tokenizer_source = &tokenizer;
      auto path = temp_model(std::string("stats_") + e.shape);
      model::write_synthetic_llama(o, path.string());
      f = std::make_unique<gguf::File>(gguf::File::open(path.string()));
      std::filesystem::remove(path);
    }
    const gguf::TensorInfo& t = f->tensor(e.tensor);
    ASSERT_EQ(t.type, TensorType::F32);
    const auto bytes = f->tensor_data(t);
    std::vector<float> values(t.element_count);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    double sum = 0, sum2 = 0;
    for (float v : values) {
      sum += v;
      sum2 += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(values.size());
    const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
    EXPECT_NEAR(mean, e.mean, 4 * e.sd / std::sqrt(n) + 1e-6);
    EXPECT_NEAR(sd, e.sd, 0.15 * e.sd);
  }
}

TEST(SyntheticArchitectures, InconsistentShapesAreRefused) {
  auto shape = *model::synthetic_shape("tiny-qwen2");
  shape.architecture = "gpt5";
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
  shape = *model::synthetic_shape("tiny-qwen2");
  shape.head_dim = 64;  // qwen2 takes its head dimension from n_embd / n_head (32)
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
  shape = *model::synthetic_shape("tiny-gemma2");
  shape.tied_output = false;  // llama.cpp would never read gemma2's output.weight
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
  shape = *model::synthetic_shape("tiny-gemma3");
  shape.n_embd = 100;  // gemma takes key_length, so n_embd need not divide into heads
  EXPECT_NO_THROW(model::plan_synthetic_model(shape, "f16", 1024));
  shape.head_dim = 33;
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
}

TEST(SyntheticArchitectures, EveryArchitectureHasATinyShape) {
  const auto names = model::synthetic_shape_names();
  for (const auto& arch : model::synthetic_architectures()) {
    bool found = false;
    for (const auto& name : names) {
      const auto shape = model::synthetic_shape(name);
      found |= shape->architecture == arch && shape->n_embd <= 256 && shape->n_layer <= 3;
    }
    EXPECT_TRUE(found) << arch;
  }
}

// The mixture-of-experts shapes load as the loader reads llama.cpp's files:
// their experts counted, each expert a slice of the 3-D *_exps tensors, the
// router in F32 whatever the recipe.
TEST(SyntheticExperts, TinyShapesLoadWithTheirExperts) {
  const auto tok_path = test::shared_model("TinyStories-656K-Q8_0.gguf");
  if (!std::filesystem::exists(tok_path)) GTEST_SKIP() << "shared models not found";
  gguf::File tokenizer = gguf::File::open(tok_path.string());
  struct Case {
    const char* shape;
    const char* architecture;
    uint32_t n_expert, n_used, n_ff_expert;
  };
  for (const Case c : {Case{"tiny-qwen3moe", "qwen3moe", 8, 2, 32}, Case{"tiny-mixtral", "llama", 4, 2, 64}}) {
    for (const char* recipe : {"f32", "f16", "q8_0", "q4_k_m"}) {
      SCOPED_TRACE(std::string(c.shape) + " " + recipe);
      model::SyntheticOptions o;
      o.shape = *model::synthetic_shape(c.shape);
      o.recipe = recipe;
      o.tokenizer_source = &tokenizer;
      auto path = temp_model(std::string("moe_") + c.shape + "_" + recipe);
      model::write_synthetic_llama(o, path.string());
      const auto model = model::LoadedModel::open(path.string());
      EXPECT_EQ(model->hparams.architecture, c.architecture);
      EXPECT_EQ(model->hparams.n_expert, c.n_expert);
      EXPECT_EQ(model->hparams.n_expert_used, c.n_used);
      EXPECT_EQ(model->hparams.n_ff_expert, c.n_ff_expert);
      ASSERT_TRUE(model->weights.has_experts());
      for (const auto& l : model->weights.layers) {
        ASSERT_EQ(l.gate_exps.size(), c.n_expert);
        ASSERT_EQ(l.down_exps.size(), c.n_expert);
        EXPECT_EQ(l.ffn_gate_inp.type, TensorType::F32);
        EXPECT_FALSE(l.w_gate.present());
      }
      EXPECT_TRUE(model->weights.unused_tensors.empty());
      std::filesystem::remove(path);
    }
  }
}

// Qwen3-30B-A3B and Mixtral 8x7B with their own vocabularies have the
// released checkpoints' parameter counts.
TEST(SyntheticExperts, NamedShapesHaveThePublishedParameterCounts) {
  struct Expect {
    const char* shape;
    const char* architecture;
    uint64_t n_vocab;
    uint64_t parameters;
  };
  for (const Expect& e : {Expect{"qwen3-30b-a3b", "qwen3moe", 151936, 30532122624ull},
                          Expect{"mixtral-8x7b", "llama", 32000, 46702792704ull}}) {
    SCOPED_TRACE(e.shape);
    auto shape = model::synthetic_shape(e.shape);
    ASSERT_TRUE(shape.has_value());
    EXPECT_EQ(shape->architecture, e.architecture);
    EXPECT_EQ(model::plan_synthetic_model(*shape, "f16", e.n_vocab).parameter_count, e.parameters);
  }
}

// The expert tensors are typed by their role, as llama-quantize types the
// dense matrices; the router stays F32; an 8-expert model (Mixtral) gets
// llama.cpp's extra bits on attn_k, attn_v (Q8_0) and attn_output (Q5_K).
TEST(SyntheticExperts, ExpertTensorsHaveTheRealShapesAndTypes) {
  auto find = [](const model::SyntheticPlan& plan, const std::string& name) {
    for (const auto& t : plan.tensors) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no " << name;
    return model::SyntheticTensor{};
  };
  using D = std::vector<uint64_t>;
  const auto qwen = model::plan_synthetic_model(*model::synthetic_shape("qwen3-30b-a3b"), "q4_k_m", 151936);
  EXPECT_EQ(find(qwen, "blk.0.ffn_gate_inp.weight").dims, D({2048, 128}));
  EXPECT_EQ(find(qwen, "blk.0.ffn_gate_inp.weight").type, TensorType::F32);
  EXPECT_EQ(find(qwen, "blk.47.ffn_gate_exps.weight").dims, D({2048, 768, 128}));
  EXPECT_EQ(find(qwen, "blk.47.ffn_up_exps.weight").type, TensorType::Q4_K);
  EXPECT_EQ(find(qwen, "blk.0.ffn_down_exps.weight").dims, D({768, 2048, 128}));
  EXPECT_EQ(find(qwen, "blk.0.ffn_down_exps.weight").type, TensorType::Q6_K);  // use_more_bits
  EXPECT_EQ(find(qwen, "blk.7.ffn_down_exps.weight").type, TensorType::Q4_K);
  EXPECT_EQ(find(qwen, "blk.0.attn_q.weight").dims, D({2048, 4096}));  // 32 heads of 128
  EXPECT_EQ(find(qwen, "blk.0.attn_k_norm.weight").dims, D({128}));
  EXPECT_EQ(find(qwen, "blk.7.attn_k.weight").type, TensorType::Q4_K);
  EXPECT_EQ(find(qwen, "output.weight").type, TensorType::Q6_K);
  EXPECT_TRUE(qwen.notes.empty());

  const auto mixtral = model::plan_synthetic_model(*model::synthetic_shape("mixtral-8x7b"), "q4_k_m", 32000);
  EXPECT_EQ(find(mixtral, "blk.31.ffn_up_exps.weight").dims, D({4096, 14336, 8}));
  EXPECT_EQ(find(mixtral, "blk.31.ffn_up_exps.weight").type, TensorType::Q4_K);
  EXPECT_EQ(find(mixtral, "blk.31.ffn_down_exps.weight").type, TensorType::Q6_K);
  EXPECT_EQ(find(mixtral, "blk.0.ffn_gate_inp.weight").type, TensorType::F32);
  EXPECT_EQ(find(mixtral, "blk.7.attn_k.weight").type, TensorType::Q8_0);
  EXPECT_EQ(find(mixtral, "blk.7.attn_v.weight").type, TensorType::Q8_0);
  EXPECT_EQ(find(mixtral, "blk.7.attn_output.weight").type, TensorType::Q5_K);
  EXPECT_EQ(find(mixtral, "blk.7.attn_q.weight").type, TensorType::Q4_K);
  const auto mixtral_q3_l = model::plan_synthetic_model(*model::synthetic_shape("mixtral-8x7b"), "q3_k_l", 32000);
  EXPECT_EQ(find(mixtral_q3_l, "blk.7.attn_output.weight").type, TensorType::Q3_K);  // not in the 8-expert list
  const auto mixtral_f16 = model::plan_synthetic_model(*model::synthetic_shape("mixtral-8x7b"), "f16", 32000);
  EXPECT_EQ(find(mixtral_f16, "blk.7.attn_v.weight").type, TensorType::F16);  // only quantized files are mixed
}

TEST(SyntheticExperts, InconsistentExpertsAreRefused) {
  auto shape = *model::synthetic_shape("tiny-qwen3moe");
  shape.n_expert = 0;  // qwen3moe has no dense FFN
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
  shape = *model::synthetic_shape("tiny-qwen3moe");
  shape.n_expert_used = 9;
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
  shape.n_expert_used = 0;
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
  shape = *model::synthetic_shape("tiny-qwen3");
  shape.n_expert = 4;  // llama.cpp's qwen3 reads no experts
  shape.n_expert_used = 2;
  EXPECT_THROW(model::plan_synthetic_model(shape, "f16", 1024), Error);
}

// ModelHparams: the hyperparameters of every shared model match the values in
// shared/models/README.md and synthetic/README.md (written independently of
// this code, so they are hard-coded here), defaults apply where keys are
// absent, and every missing, mistyped or inconsistent key is named.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <vector>
#include <ostream>
#include <string>

#include "gguf/file.h"
#include "model/hparams.h"
#include "test_paths.h"

using namespace m40;
using namespace m40::model;

namespace {

struct Expected {
  const char* file;
  uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx, n_vocab, head_dim, n_rot;
  float rms_eps;
  bool tied;
};

// From shared/models/README.md and shared/models/synthetic/README.md.
const Expected kModels[] = {
    {"TinyStories-656K-Q8_0.gguf", 2, 128, 8, 4, 384, 512, 2048, 16, 16, 1e-6f, true},
    {"TinyStories-656K-Q2_K.gguf", 2, 128, 8, 4, 384, 512, 2048, 16, 16, 1e-6f, true},
    {"llama-2-tiny-random.gguf", 1, 8, 2, 2, 32, 4096, 32000, 4, 4, 1e-5f, false},
    {"synthetic/tiny-llama-rand-F32.gguf", 2, 256, 4, 2, 768, 512, 2048, 64, 64, 1e-5f, false},
    {"synthetic/tiny-llama-rand-F16.gguf", 2, 256, 4, 2, 768, 512, 2048, 64, 64, 1e-5f, false},
    {"synthetic/tiny-llama-rand-Q8_0.gguf", 2, 256, 4, 2, 768, 512, 2048, 64, 64, 1e-5f, false},
    {"synthetic/tiny-llama-rand-Q4_0.gguf", 2, 256, 4, 2, 768, 512, 2048, 64, 64, 1e-5f, false},
    {"synthetic/tiny-llama-rand-Q4_K_M.gguf", 2, 256, 4, 2, 768, 512, 2048, 64, 64, 1e-5f, false},
};

void PrintTo(const Expected& e, std::ostream* os) { *os << e.file; }

class SharedModel : public testing::TestWithParam<Expected> {};

// A complete llama metadata set for the error tests; each test breaks one key.
gguf::Metadata minimal_llama() {
  gguf::Metadata m;
  m.set("general.architecture", "llama");
  m.set("llama.block_count", uint32_t{2});
  m.set("llama.embedding_length", uint32_t{128});
  m.set("llama.feed_forward_length", uint32_t{384});
  m.set("llama.attention.head_count", uint32_t{8});
  m.set("llama.context_length", uint32_t{512});
  m.set("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  m.set("llama.vocab_size", uint32_t{100});
  return m;
}

// The message of the HparamsError that reading `m` throws.
std::string error_of(const gguf::Metadata& m) {
  try {
    ModelHparams::from_metadata(m);
  } catch (const HparamsError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an HparamsError";
  return {};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_P(SharedModel, HyperparametersMatchTheReadme) {
  const Expected& e = GetParam();
  const auto file = gguf::File::open(test::shared_model(e.file).string());
  const auto hp = ModelHparams::from_file(file);
  EXPECT_EQ(hp.architecture, "llama");
  EXPECT_EQ(hp.n_layer, e.n_layer);
  EXPECT_EQ(hp.n_embd, e.n_embd);
  EXPECT_EQ(hp.n_head, e.n_head);
  EXPECT_EQ(hp.n_head_kv, e.n_head_kv);
  EXPECT_EQ(hp.n_ff, e.n_ff);
  EXPECT_EQ(hp.n_ctx_train, e.n_ctx);
  EXPECT_EQ(hp.n_vocab, e.n_vocab);
  EXPECT_EQ(hp.head_dim(), e.head_dim);
  EXPECT_EQ(hp.n_rot, e.n_rot);
  EXPECT_EQ(hp.n_gqa(), e.n_head / e.n_head_kv);
  EXPECT_EQ(hp.q_dim(), e.n_embd);
  EXPECT_EQ(hp.kv_dim(), e.n_head_kv * e.head_dim);
  EXPECT_FLOAT_EQ(hp.rms_eps, e.rms_eps);
  EXPECT_FLOAT_EQ(hp.rope_freq_base, 10000.0f);  // given, or the default where absent
  EXPECT_EQ(hp.rope_scaling, RopeScaling::None);
  EXPECT_FLOAT_EQ(hp.rope_scaling_factor, 1.0f);
  EXPECT_EQ(hp.rope_style(), RopeStyle::Normal);
  EXPECT_TRUE(hp.desc->runnable());
  EXPECT_EQ(file.find_tensor("output.weight") == nullptr, e.tied);
}

INSTANTIATE_TEST_SUITE_P(AllModels, SharedModel, testing::ValuesIn(kModels),
                         [](const testing::TestParamInfo<Expected>& param_info) {
                           std::string name = param_info.param.file;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(ModelHparams, Llama2TinyRandomHasNoFreqBaseKeySoTheDefaultApplies) {
  const auto file = gguf::File::open(test::shared_model("llama-2-tiny-random.gguf").string());
  ASSERT_FALSE(file.metadata().contains("llama.rope.freq_base"));
  EXPECT_FLOAT_EQ(ModelHparams::from_file(file).rope_freq_base, 10000.0f);
}

TEST(ModelHparams, VocabularyOnlyLlamaFileReadsFromMetadataAlone) {
  const auto file = gguf::File::open(test::shared_model("vocab/ggml-vocab-llama-spm.gguf").string());
  ASSERT_TRUE(file.tensors().empty());
  EXPECT_EQ(ModelHparams::from_file(file).n_vocab, 32000u);
}

TEST(ModelHparams, NonLlamaVocabularyFileIsRefusedByArchitecture) {
  const auto file = gguf::File::open(test::shared_model("vocab/ggml-vocab-bert-bge.gguf").string());
  try {
    ModelHparams::from_file(file);
    FAIL() << "expected an HparamsError";
  } catch (const HparamsError& e) {
    EXPECT_TRUE(contains(e.what(), "unsupported architecture bert")) << e.what();
    EXPECT_TRUE(contains(e.what(), "llama")) << e.what();
  }
}

TEST(ModelHparams, DefaultsApplyWhereOptionalKeysAreAbsent) {
  const auto hp = ModelHparams::from_metadata(minimal_llama());
  EXPECT_EQ(hp.n_head_kv, 8u);   // head_count_kv defaults to head_count
  EXPECT_EQ(hp.head_dim(), 16u);
  EXPECT_EQ(hp.n_rot, 16u);      // rope.dimension_count defaults to the head dim
  EXPECT_FLOAT_EQ(hp.rope_freq_base, 10000.0f);
  EXPECT_EQ(hp.rope_scaling, RopeScaling::None);
  EXPECT_EQ(hp.rope_scaling_orig_ctx, 512u);  // the trained context, as llama.cpp defaults it
}

TEST(ModelHparams, EachRequiredKeyIsNamedWhenMissing) {
  for (const char* key : {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                          "llama.attention.head_count", "llama.context_length",
                          "llama.attention.layer_norm_rms_epsilon", "general.architecture"}) {
    auto m = minimal_llama();
    m.erase(key);
    const std::string message = error_of(m);
    EXPECT_TRUE(contains(message, std::string("'") + key + "'")) << key << ": " << message;
    EXPECT_TRUE(contains(message, "missing")) << message;
  }
}

TEST(ModelHparams, MistypedKeysAreNamedWithTheirType) {
  auto m = minimal_llama();
  m.set("llama.block_count", "two");
  std::string message = error_of(m);
  EXPECT_TRUE(contains(message, "'llama.block_count'")) << message;
  EXPECT_TRUE(contains(message, "string")) << message;

  m = minimal_llama();
  m.set("llama.attention.layer_norm_rms_epsilon", uint32_t{1});
  message = error_of(m);
  EXPECT_TRUE(contains(message, "'llama.attention.layer_norm_rms_epsilon'")) << message;
  EXPECT_TRUE(contains(message, "uint32")) << message;

  m = minimal_llama();
  m.set("llama.attention.head_count_kv", int32_t{-4});
  message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.attention.head_count_kv")) << message;

  m = minimal_llama();
  m.set("general.architecture", uint32_t{1});
  message = error_of(m);
  EXPECT_TRUE(contains(message, "general.architecture")) << message;
}

TEST(ModelHparams, InconsistentShapesNameTheKeys) {
  auto m = minimal_llama();
  m.set("llama.attention.head_count_kv", uint32_t{3});
  std::string message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.attention.head_count_kv")) << message;
  EXPECT_TRUE(contains(message, "llama.attention.head_count")) << message;

  m = minimal_llama();
  m.set("llama.embedding_length", uint32_t{130});
  message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.embedding_length")) << message;

  m = minimal_llama();
  m.set("llama.rope.dimension_count", uint32_t{32});  // more than the head dim of 16
  EXPECT_TRUE(contains(error_of(m), "llama.rope.dimension_count"));

  m = minimal_llama();
  m.set("llama.block_count", uint32_t{0});
  EXPECT_TRUE(contains(error_of(m), "llama.block_count"));

  m = minimal_llama();
  m.set("llama.attention.layer_norm_rms_epsilon", 0.0f);
  EXPECT_TRUE(contains(error_of(m), "llama.attention.layer_norm_rms_epsilon"));

  m = minimal_llama();
  m.set("llama.rope.scaling.type", "sideways");
  message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.rope.scaling.type")) << message;
  EXPECT_TRUE(contains(message, "sideways")) << message;
}

TEST(ModelHparams, UnknownArchitectureListsTheKnownOnes) {
  auto m = minimal_llama();
  m.set("general.architecture", "mamba");
  const std::string message = error_of(m);
  EXPECT_TRUE(contains(message, "unsupported architecture mamba")) << message;
  for (const auto& arch : known_architectures()) EXPECT_TRUE(contains(message, std::string(arch.name))) << message;
}

TEST(ModelHparams, KeysAreReadUnderTheArchitecturePrefix) {
  gguf::Metadata m;
  m.set("general.architecture", "qwen2");
  m.set("qwen2.block_count", uint32_t{24});
  m.set("qwen2.embedding_length", uint32_t{896});
  m.set("qwen2.feed_forward_length", uint32_t{4864});
  m.set("qwen2.attention.head_count", uint32_t{14});
  m.set("qwen2.attention.head_count_kv", uint32_t{2});
  m.set("qwen2.context_length", uint32_t{32768});
  m.set("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  m.set("qwen2.rope.freq_base", 1000000.0f);
  m.set("llama.block_count", uint32_t{99});  // another prefix: ignored
  gguf::Array tokens;
  tokens.element_type = gguf::ValueType::STRING;
  tokens.items.assign(151936, gguf::Value("t"));
  m.set("tokenizer.ggml.tokens", gguf::Value(std::move(tokens)));

  const auto hp = ModelHparams::from_metadata(m);
  EXPECT_EQ(hp.n_layer, 24u);
  EXPECT_EQ(hp.head_dim(), 64u);
  EXPECT_EQ(hp.n_gqa(), 7u);
  EXPECT_EQ(hp.n_vocab, 151936u);  // from the token list, as there is no qwen2.vocab_size
  EXPECT_FLOAT_EQ(hp.rope_freq_base, 1e6f);
  EXPECT_EQ(hp.rope_style(), RopeStyle::NeoX);
  EXPECT_TRUE(hp.desc->qkv_bias);
  EXPECT_TRUE(hp.desc->runnable());
}

TEST(ModelHparams, KeyLengthOverridesTheDerivedHeadDim) {
  auto m = minimal_llama();
  m.set("llama.attention.key_length", uint32_t{32});
  m.set("llama.attention.value_length", uint32_t{32});
  const auto hp = ModelHparams::from_metadata(m);
  EXPECT_EQ(hp.head_dim(), 32u);
  EXPECT_EQ(hp.q_dim(), 256u);
  EXPECT_EQ(hp.n_rot, 32u);

  m.set("llama.attention.value_length", uint32_t{16});
  EXPECT_TRUE(contains(error_of(m), "llama.attention.value_length"));
}

TEST(ModelHparams, VocabularySizeFallsBackToTheTokenEmbedding) {
  auto m = minimal_llama();
  m.erase("llama.vocab_size");
  EXPECT_TRUE(contains(error_of(m), "vocabulary size"));

  gguf::TensorInfo token_embd;
  token_embd.name = "token_embd.weight";
  token_embd.dims = {128, 777};
  EXPECT_EQ(ModelHparams::from_metadata(m, &token_embd).n_vocab, 777u);
}

TEST(ModelHparams, RopeScalingIsRead) {
  auto m = minimal_llama();
  m.set("llama.rope.scaling.type", "yarn");
  m.set("llama.rope.scaling.factor", 4.0f);
  m.set("llama.rope.scaling.original_context_length", uint32_t{8192});
  auto hp = ModelHparams::from_metadata(m);
  EXPECT_EQ(hp.rope_scaling, RopeScaling::Yarn);
  EXPECT_FLOAT_EQ(hp.rope_scaling_factor, 4.0f);
  EXPECT_EQ(hp.rope_scaling_orig_ctx, 8192u);
  EXPECT_EQ(rope_scaling_name(hp.rope_scaling), "yarn");

  // A factor without a type is linear scaling, as llama.cpp reads it.
  m = minimal_llama();
  m.set("llama.rope.scaling.factor", 2.0f);
  hp = ModelHparams::from_metadata(m);
  EXPECT_EQ(hp.rope_scaling, RopeScaling::Linear);
  EXPECT_FLOAT_EQ(hp.rope_scaling_factor, 2.0f);
}

TEST(ModelHparams, ErrorsAreMetadataErrors) {
  auto m = minimal_llama();
  m.erase("llama.block_count");
  EXPECT_THROW(ModelHparams::from_metadata(m), gguf::MetadataError);
  EXPECT_THROW(ModelHparams::from_metadata(m), m40::Error);
}

// n_head * head_dim in 32 bits wraps: 65536 * 65536 = 0 (an empty projection,
// then a division by zero) and 65537 * 65536 = 65536 (a projection narrower
// than the heads, then RoPE beyond its buffer). Both are refused at load.
TEST(ModelHparams, ProjectionWidthsThatOverflowAreRefused) {
  auto m = minimal_llama();
  m.set("llama.attention.head_count", uint32_t{65536});
  m.set("llama.attention.head_count_kv", uint32_t{65536});
  m.set("llama.attention.key_length", uint32_t{65536});
  std::string message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.attention.head_count (65536)")) << message;
  EXPECT_TRUE(contains(message, "4294967296")) << message;

  m.set("llama.attention.head_count", uint32_t{65537});
  m.set("llama.attention.head_count_kv", uint32_t{1});
  message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.attention.head_count (65537)")) << message;
  EXPECT_TRUE(contains(message, "query width")) << message;

  // Wide but real: Llama 3.1 405B's 128 heads of 128.
  m = minimal_llama();
  m.set("llama.attention.head_count", uint32_t{128});
  m.set("llama.attention.key_length", uint32_t{128});
  EXPECT_EQ(ModelHparams::from_metadata(m).q_dim(), 16384u);
}

// A model that scores more ids than the tokenizer has would, sooner or later,
// sample one that cannot be decoded and fail mid-answer. llama.cpp's converter
// pads the token list to the model's vocabulary, so equal sizes are the norm.
TEST(ModelHparams, AVocabularyLargerThanTheTokenizersIsRefused) {
  auto m = minimal_llama();
  gguf::Array tokens;
  tokens.element_type = gguf::ValueType::STRING;
  tokens.items.assign(100, gguf::Value("t"));
  m.set("tokenizer.ggml.tokens", gguf::Value(tokens));
  EXPECT_EQ(ModelHparams::from_metadata(m).n_vocab, 100u);

  m.set("llama.vocab_size", uint32_t{200});
  const std::string message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.vocab_size (200) exceeds the tokenizer's vocabulary (100")) << message;

  // A tokenizer larger than the model is left to the engine, which refuses it.
  m.set("llama.vocab_size", uint32_t{50});
  EXPECT_EQ(ModelHparams::from_metadata(m).n_vocab, 50u);
}

// The features each tiny architecture file resolves to, as
// shared/models/arch/README.md describes them (written independently of this
// code from llama.cpp's source, so the values are hard-coded here).
namespace {
ModelHparams arch_hparams(const char* stem) {
  const auto path = test::shared_model(std::string("arch/") + stem + ".gguf");
  if (!std::filesystem::exists(path)) return {};
  return ModelHparams::from_file(gguf::File::open(path.string()));
}
}  // namespace

TEST(ArchitectureFeatures, Gemma2SoftCapsWindowsAndScales) {
  const auto hp = arch_hparams("tiny-gemma2-F32");
  if (hp.desc == nullptr) GTEST_SKIP() << "shared data missing";
  EXPECT_FLOAT_EQ(hp.embedding_scale, 8.0f);  // sqrt(64)
  EXPECT_FLOAT_EQ(hp.attention_scale, 1.0f / std::sqrt(32.0f));
  EXPECT_FLOAT_EQ(hp.attn_softcap, 5.0f);
  EXPECT_FLOAT_EQ(hp.final_softcap, 30.0f);
  EXPECT_EQ(hp.sliding_window, 8u);
  EXPECT_EQ(hp.swa_layers, (std::vector<uint8_t>{1, 0}));  // pattern 2 by default: layer 0 local
  EXPECT_FLOAT_EQ(hp.rope_local.freq_base, 10000.0f);     // the global base when freq_base_swa is absent
  EXPECT_EQ(hp.desc->activation, FfnActivation::GeluTanh);
}

TEST(ArchitectureFeatures, Gemma3LocalLayersUseTheirOwnRopeBaseWithoutScaling) {
  const auto hp = arch_hparams("tiny-gemma3-F32");
  if (hp.desc == nullptr) GTEST_SKIP() << "shared data missing";
  EXPECT_EQ(hp.swa_layers, (std::vector<uint8_t>{1, 1, 0}));  // pattern 3
  EXPECT_FLOAT_EQ(hp.attn_softcap, 0.0f);
  EXPECT_FLOAT_EQ(hp.final_softcap, 0.0f);
  EXPECT_FLOAT_EQ(hp.rope_for_layer(2).freq_base, 1e6f);
  EXPECT_FLOAT_EQ(hp.rope_for_layer(2).freq_scale, 1.0f / 8.0f);
  EXPECT_FLOAT_EQ(hp.rope_for_layer(0).freq_base, 10000.0f);
  EXPECT_FLOAT_EQ(hp.rope_for_layer(0).freq_scale, 1.0f);
}

TEST(ArchitectureFeatures, Mistral3YarnAndTemperature) {
  const auto hp = arch_hparams("tiny-mistral3-F32");
  if (hp.desc == nullptr) GTEST_SKIP() << "shared data missing";
  const auto r = hp.rope_for_layer(0);
  EXPECT_FLOAT_EQ(r.freq_scale, 1.0f / 16.0f);
  EXPECT_FLOAT_EQ(r.ext_factor, 1.0f);
  EXPECT_FLOAT_EQ(r.corr_low, 2.0f);  // the README: the ramp spans pairs 2-9
  EXPECT_FLOAT_EQ(r.corr_high, 9.0f);
  EXPECT_NEAR(r.magnitude, 1.1218f, 1e-4f);  // (1 + 0.1 ln 16) / (1 + 0.05 ln 16)
  EXPECT_FLOAT_EQ(hp.attention_temperature(15), 1.0f);
  EXPECT_NEAR(hp.attention_temperature(16), 1.0693f, 1e-4f);
  EXPECT_NEAR(hp.attention_temperature(47), 1.1099f, 1e-4f);
}

TEST(ArchitectureFeatures, GraniteMultipliers) {
  const auto hp = arch_hparams("tiny-granite-F32");
  if (hp.desc == nullptr) GTEST_SKIP() << "shared data missing";
  EXPECT_FLOAT_EQ(hp.embedding_scale, 12.0f);
  EXPECT_FLOAT_EQ(hp.residual_scale, 0.22f);
  EXPECT_FLOAT_EQ(hp.attention_scale, 0.03125f);
  EXPECT_FLOAT_EQ(hp.logit_scale, 1.0f / 8.0f);
  EXPECT_EQ(hp.rope_layers, (std::vector<uint8_t>{1, 1, 1}));
}

TEST(ArchitectureFeatures, SmolLm3SkipsRopeOnEveryFourthLayer) {
  const auto hp = arch_hparams("tiny-smollm3-F32");
  if (hp.desc == nullptr) GTEST_SKIP() << "shared data missing";
  EXPECT_EQ(hp.rope_layers, (std::vector<uint8_t>{1, 1, 1, 0, 1}));
}

TEST(ArchitectureFeatures, Phi3LongRopeAttentionFactor) {
  const auto hp = arch_hparams("tiny-phi3-F32");
  if (hp.desc == nullptr) GTEST_SKIP() << "shared data missing";
  EXPECT_NEAR(hp.rope_for_layer(0).magnitude, 1.190238f, 1e-6f);
  EXPECT_EQ(hp.rope_scaling_orig_ctx, 4096u);
  EXPECT_FALSE(hp.use_long_rope_factors(4096));
  EXPECT_TRUE(hp.use_long_rope_factors(4097));
  EXPECT_EQ(hp.sliding_window, 0u);  // phi3.attention.sliding_window is ignored, as llama.cpp does
  EXPECT_EQ(hp.n_rot, 32u);
}

TEST(ArchitectureFeatures, QwenYarnWithoutTheMistralKeysUsesLlamaCppsDefaults) {
  gguf::Metadata m = minimal_llama();
  m.set("general.architecture", "qwen2");
  for (const char* k : {"block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                        "context_length", "attention.layer_norm_rms_epsilon", "vocab_size"}) {
    m.set(std::string("qwen2.") + k, *m.find(std::string("llama.") + k));
  }
  m.set("qwen2.rope.freq_base", 1000000.0f);
  m.set("qwen2.rope.scaling.type", "yarn");
  m.set("qwen2.rope.scaling.factor", 4.0f);
  m.set("qwen2.rope.scaling.original_context_length", uint32_t{32768});
  m.set("qwen2.rope.scaling.yarn_beta_fast", 99.0f);  // read by mistral3 only, as in llama.cpp
  const auto hp = ModelHparams::from_metadata(m);
  const auto r = hp.rope_for_layer(0);
  EXPECT_FLOAT_EQ(r.ext_factor, 1.0f);
  EXPECT_FLOAT_EQ(hp.yarn_beta_fast, 32.0f);
  EXPECT_NEAR(r.magnitude, 1.0f + 0.1f * std::log(4.0f), 1e-6f);
  // head_dim 16, n_rot 16: corr(32) = 16 ln(32768 / (64 pi)) / (2 ln 1e6) = 2.95 -> 2; corr(1) = 4.96 -> 5.
  EXPECT_FLOAT_EQ(r.corr_low, 2.0f);
  EXPECT_FLOAT_EQ(r.corr_high, 5.0f);
}

// Experts: llama with expert_count (Mixtral) uses feed_forward_length as the
// expert width; qwen3moe reads expert_feed_forward_length (default
// feed_forward_length / expert_used_count) and needs experts at all.
TEST(ArchitectureFeatures, ExpertCountsAndWidths) {
  auto m = minimal_llama();
  EXPECT_FALSE(ModelHparams::from_metadata(m).has_experts());
  m.set("llama.expert_count", uint32_t{8});
  m.set("llama.expert_used_count", uint32_t{2});
  ModelHparams hp = ModelHparams::from_metadata(m);
  EXPECT_EQ(hp.n_expert, 8u);
  EXPECT_EQ(hp.n_expert_used, 2u);
  EXPECT_EQ(hp.n_ff_expert, 384u);

  m.set("llama.expert_used_count", uint32_t{9});
  std::string message = error_of(m);
  EXPECT_TRUE(contains(message, "llama.expert_used_count")) << message;
  m.set("llama.expert_used_count", uint32_t{0});
  EXPECT_TRUE(contains(error_of(m), "llama.expert_used_count"));

  gguf::Metadata q;
  q.set("general.architecture", "qwen3moe");
  q.set("qwen3moe.block_count", uint32_t{2});
  q.set("qwen3moe.embedding_length", uint32_t{64});
  q.set("qwen3moe.feed_forward_length", uint32_t{192});
  q.set("qwen3moe.attention.head_count", uint32_t{4});
  q.set("qwen3moe.context_length", uint32_t{512});
  q.set("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
  q.set("qwen3moe.vocab_size", uint32_t{100});
  EXPECT_TRUE(contains(error_of(q), "qwen3moe.expert_count"));
  q.set("qwen3moe.expert_count", uint32_t{8});
  q.set("qwen3moe.expert_used_count", uint32_t{2});
  EXPECT_EQ(ModelHparams::from_metadata(q).n_ff_expert, 96u);
  q.set("qwen3moe.expert_feed_forward_length", uint32_t{32});
  EXPECT_EQ(ModelHparams::from_metadata(q).n_ff_expert, 32u);
}

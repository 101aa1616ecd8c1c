// An embedding model's facts: `{arch}.pooling_type` read into the
// hyperparameters (llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last, 4 rank)
// and into `show`'s summary, a value llama.cpp does not define refused by
// name, and a file that asks for non-causal attention refused at load.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "gguf/file.h"
#include "gguf_copy.h"
#include "model/hparams.h"
#include "model/model_summary.h"
#include "test_paths.h"

#include <unistd.h>

using namespace m40;
using model::PoolingType;

namespace {

gguf::Metadata minimal_qwen3() {
  gguf::Metadata m;
  m.set("general.architecture", "qwen3");
  m.set("qwen3.block_count", uint32_t{2});
  m.set("qwen3.embedding_length", uint32_t{64});
  m.set("qwen3.feed_forward_length", uint32_t{128});
  m.set("qwen3.attention.head_count", uint32_t{4});
  m.set("qwen3.attention.head_count_kv", uint32_t{2});
  m.set("qwen3.context_length", uint32_t{512});
  m.set("qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
  m.set("qwen3.vocab_size", uint32_t{100});
  return m;
}

}  // namespace

TEST(PoolingType, AGenerativeModelDeclaresNone) {
  const auto hp = model::ModelHparams::from_metadata(minimal_qwen3());
  EXPECT_FALSE(hp.pooling.has_value());
  EXPECT_FALSE(hp.is_embedding_model());
}

TEST(PoolingType, EachValueIsReadAndNamedAsLlamaCppDoes) {
  const char* names[] = {"none", "mean", "cls", "last", "rank"};
  for (uint32_t v = 0; v <= 4; ++v) {
    auto m = minimal_qwen3();
    m.set("qwen3.pooling_type", v);
    const auto hp = model::ModelHparams::from_metadata(m);
    ASSERT_TRUE(hp.pooling.has_value());
    EXPECT_EQ(static_cast<uint32_t>(*hp.pooling), v);
    EXPECT_EQ(model::pooling_type_name(*hp.pooling), names[v]);
    EXPECT_TRUE(hp.is_embedding_model());
  }
}

TEST(PoolingType, AnUnknownValueIsRefusedByName) {
  auto m = minimal_qwen3();
  m.set("qwen3.pooling_type", uint32_t{7});
  try {
    model::ModelHparams::from_metadata(m);
    FAIL() << "pooling_type 7 was accepted";
  } catch (const model::HparamsError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3.pooling_type"), std::string::npos) << e.what();
  }
  m.set("qwen3.pooling_type", std::string("mean"));
  EXPECT_THROW(model::ModelHparams::from_metadata(m), model::HparamsError);
}

TEST(PoolingType, NonCausalAttentionIsRefusedAtLoad) {
  auto m = minimal_qwen3();
  m.set("qwen3.attention.causal", false);
  try {
    model::ModelHparams::from_metadata(m);
    FAIL() << "non-causal attention was accepted";
  } catch (const model::HparamsError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3.attention.causal"), std::string::npos) << e.what();
  }
  m.set("qwen3.attention.causal", true);
  EXPECT_NO_THROW(model::ModelHparams::from_metadata(m));
}

TEST(PoolingType, TheSummaryShowsAnEmbeddingModel) {
  const auto source = test::shared_model("arch/tiny-qwen3-F32.gguf");
  if (!std::filesystem::exists(source)) GTEST_SKIP() << "shared model not found: " << source;
  const auto out = std::filesystem::temp_directory_path() / ("m40-pooling-" + std::to_string(::getpid()) + ".gguf");
  test::copy_model(source, out, [](gguf::Metadata& m) { m.set("qwen3.pooling_type", uint32_t{3}); });
  {
    const auto s = model::summarize(gguf::File::open(out.string()));
    EXPECT_EQ(s.pooling_type, 3u);
    EXPECT_TRUE(s.embedding_model());
    EXPECT_TRUE(s.architecture_runnable) << s.not_runnable_reason;
    const auto plain = model::summarize(gguf::File::open(source.string()));
    EXPECT_FALSE(plain.pooling_type.has_value());
    EXPECT_FALSE(plain.embedding_model());
  }
  std::filesystem::remove(out);
}

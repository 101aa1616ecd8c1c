// Store names: NAME[:TAG], tag "latest" by default, '/'-separated parts of
// letters, digits, '.', '_', '-'.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "common/error.h"
#include "store/model_name.h"

namespace {

using m40::store::ModelName;
using m40::store::parse_model_name;

TEST(ModelName, NameAndTag) {
  EXPECT_EQ(parse_model_name("tinystories:q8_0"), (ModelName{"tinystories", "q8_0"}));
  EXPECT_EQ(parse_model_name("tinystories").tag, "latest");
  EXPECT_EQ(parse_model_name("tinystories").str(), "tinystories:latest");
}

TEST(ModelName, HuggingFaceNamesKeepTheirPathAndCase) {
  const ModelName n = parse_model_name("hf.co/TheOrg/Some-Model-GGUF:Q4_K_M");
  EXPECT_EQ(n.name, "hf.co/TheOrg/Some-Model-GGUF");
  EXPECT_EQ(n.tag, "Q4_K_M");
}

TEST(ModelName, RejectsWhatCannotBeAFolder) {
  for (const char* bad : {"", ":x", "a:", "../etc:x", "a/../b", "a//b", "/abs", "with space", "a:b/c", "tag:with:colon?",
                          "a/.:x"}) {
    EXPECT_THROW(parse_model_name(bad), m40::Error) << bad;
    EXPECT_FALSE(m40::store::try_parse_model_name(bad).has_value()) << bad;
  }
}

// A part or tag named like a file of a model's folder would collide with it.
TEST(ModelName, TheStoresOwnFileNamesAreReserved) {
  for (const char* bad : {"model.gguf", "a/manifest.json", "a:model.gguf.partial", "x/model.gguf.partial.json:latest",
                          "a:manifest.json.tmp", "a:model-00001-of-00003.gguf", "a/model-00002-of-00003.gguf.partial",
                          "a:model-00002-of-00003.gguf.partial.json", "a:verifying-00001-of-00002.gguf"}) {
    EXPECT_FALSE(m40::store::try_parse_model_name(bad).has_value()) << bad;
  }
  // Only the names the store makes: a model's own split file name is a fine tag.
  EXPECT_TRUE(m40::store::try_parse_model_name("a:m-00001-of-00003.gguf").has_value());
  try {
    parse_model_name("tiny:model.gguf");
    FAIL();
  } catch (const m40::Error& e) {
    EXPECT_STREQ(e.what(), "invalid model name 'tiny:model.gguf': 'model.gguf' as a tag (the store uses that file name)");
  }
  EXPECT_EQ(m40::store::sanitize_name_component("manifest.json"), "model");
}

TEST(ModelName, EmptyPartsAreNamedPlainly) {
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"a:", "an empty tag"}, {"a//b", "an empty name part"}, {"a/..", "'..' as a name part"}}) {
    try {
      parse_model_name(text);
      ADD_FAILURE() << text;
    } catch (const m40::Error& e) {
      EXPECT_EQ(std::string(e.what()), "invalid model name '" + text + "': " + why);
    }
  }
}

TEST(ModelName, TheErrorSaysWhy) {
  try {
    parse_model_name("my model");
    FAIL();
  } catch (const m40::Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid model name 'my model'"), std::string::npos) << e.what();
  }
}

TEST(ModelName, QuantFromFileName) {
  using m40::store::quant_from_file_name;
  EXPECT_EQ(quant_from_file_name("Llama-3-8B.Q4_K_M.gguf"), "Q4_K_M");
  EXPECT_EQ(quant_from_file_name("TinyStories-656K-Q8_0.gguf"), "Q8_0");
  EXPECT_EQ(quant_from_file_name("model-q2_k.gguf"), "Q2_K");
  EXPECT_EQ(quant_from_file_name("qwen2-0.5b-instruct-fp16.gguf"), "");
  EXPECT_EQ(quant_from_file_name("phi-3-f16.gguf"), "F16");
  EXPECT_EQ(quant_from_file_name("x-IQ4_XS.gguf"), "IQ4_XS");
  EXPECT_EQ(quant_from_file_name("model.gguf"), "");
}

TEST(ModelName, SanitizedComponents) {
  using m40::store::sanitize_name_component;
  EXPECT_EQ(sanitize_name_component("TinyStories-656K-Q8_0"), "tinystories-656k-q8_0");
  EXPECT_EQ(sanitize_name_component("my model (1)"), "my-model--1-");
  EXPECT_EQ(sanitize_name_component("..."), "model");
}

}  // namespace

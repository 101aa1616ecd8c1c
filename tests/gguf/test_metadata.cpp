// Typed metadata access: conversions that are allowed, and errors that name the key.
#include <gtest/gtest.h>

#include "gguf/metadata.h"

using namespace m40::gguf;

TEST(Metadata, TypedGetConvertsIntegerWidthsWhenTheValueFits) {
  Metadata m;
  m.set("llama.block_count", Value(uint32_t{32}));
  m.set("neg", Value(int32_t{-5}));
  m.set("big", Value(uint64_t{1} << 40));
  EXPECT_EQ(m.get<uint32_t>("llama.block_count"), 32u);
  EXPECT_EQ(m.get<int64_t>("llama.block_count"), 32);
  EXPECT_EQ(m.get<int8_t>("neg"), -5);
  EXPECT_THROW(m.get<uint32_t>("neg"), MetadataError);
  EXPECT_THROW(m.get<uint32_t>("big"), MetadataError);
  EXPECT_EQ(m.get<uint64_t>("big"), uint64_t{1} << 40);
}

TEST(Metadata, MissingAndMistypedKeysAreNamedInTheError) {
  Metadata m;
  m.set("general.name", Value("tiny"));
  try {
    m.get<uint32_t>("llama.block_count");
    FAIL() << "expected an error";
  } catch (const MetadataError& e) {
    EXPECT_NE(std::string(e.what()).find("llama.block_count"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  try {
    m.get<uint32_t>("general.name");
    FAIL() << "expected an error";
  } catch (const MetadataError& e) {
    EXPECT_NE(std::string(e.what()).find("general.name"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.get<bool>("general.name"), MetadataError);
}

TEST(Metadata, OptionalAndFallbackAccess) {
  Metadata m;
  m.set("eps", Value(1e-5f));
  EXPECT_FALSE(m.get_optional<float>("absent").has_value());
  EXPECT_FLOAT_EQ(*m.get_optional<float>("eps"), 1e-5f);
  EXPECT_DOUBLE_EQ(m.get<double>("eps"), static_cast<double>(1e-5f));
  EXPECT_EQ(m.get_or<uint32_t>("absent", 7u), 7u);
  EXPECT_THROW(m.get_optional<std::string>("eps"), MetadataError);
}

TEST(Metadata, ArraysConvertPerElementAndNameTheBadIndex) {
  Metadata m;
  Array tokens{ValueType::STRING, {Value("<s>"), Value("</s>"), Value("hi")}};
  m.set("tokenizer.ggml.tokens", Value(tokens));
  Array mixed{ValueType::INT32, {Value(int32_t{1}), Value(int32_t{-1})}};
  m.set("ids", Value(mixed));
  EXPECT_EQ(m.get_array<std::string>("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"<s>", "</s>", "hi"}));
  EXPECT_EQ(m.get_array<int64_t>("ids"), (std::vector<int64_t>{1, -1}));
  try {
    m.get_array<uint32_t>("ids");
    FAIL();
  } catch (const MetadataError& e) {
    EXPECT_NE(std::string(e.what()).find("ids'[1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.get_array<int32_t>("tokenizer.ggml.tokens"), MetadataError);
}

TEST(Metadata, SetReplacesAndEraseKeepsOrder) {
  Metadata m;
  m.set("a", Value(uint8_t{1}));
  m.set("b", Value(uint8_t{2}));
  m.set("c", Value(uint8_t{3}));
  m.set("a", Value(uint8_t{9}));
  m.erase("b");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.entries()[0].first, "a");
  EXPECT_EQ(m.get<uint8_t>("a"), 9);
  EXPECT_EQ(m.entries()[1].first, "c");
  EXPECT_EQ(m.get<uint8_t>("c"), 3);
}

TEST(Metadata, DisplayStringAbbreviatesLongArrays) {
  Array a{ValueType::UINT32, {}};
  for (uint32_t i = 0; i < 100; ++i) a.items.push_back(Value(i));
  std::string s = Value(a).to_display_string(3);
  EXPECT_EQ(s, "[0, 1, 2, ... (100 uint32 items)]");
  EXPECT_EQ(Value(true).to_display_string(), "true");
  EXPECT_EQ(Value("x").to_display_string(), "\"x\"");
}

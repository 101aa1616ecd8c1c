// ModelSummary: the facts `show` prints, against the shared models' READMEs,
// and its promise never to fail on odd or partial metadata.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "gguf/writer.h"
#include "model/model_summary.h"
#include "test_paths.h"

using namespace m40;
using namespace m40::model;

namespace {

ModelSummary summary_of(const std::string& relative) {
  return summarize(gguf::File::open(test::shared_model(relative).string()));
}

size_t count_of(const ModelSummary& s, gguf::TensorType type) {
  for (const auto& t : s.tensor_types) {
    if (t.type == type) return t.count;
  }
  return 0;
}

}  // namespace

TEST(FileTypeName, UsesLlamaCppEnumNames) {
  EXPECT_EQ(file_type_name(0), "ALL_F32");
  EXPECT_EQ(file_type_name(1), "MOSTLY_F16");
  EXPECT_EQ(file_type_name(2), "MOSTLY_Q4_0");
  EXPECT_EQ(file_type_name(7), "MOSTLY_Q8_0");
  EXPECT_EQ(file_type_name(10), "MOSTLY_Q2_K");
  EXPECT_EQ(file_type_name(15), "MOSTLY_Q4_K_M");
  EXPECT_EQ(file_type_name(18), "MOSTLY_Q6_K");
  EXPECT_EQ(file_type_name(25), "MOSTLY_IQ4_NL");
  EXPECT_EQ(file_type_name(30), "MOSTLY_IQ4_XS");
  EXPECT_EQ(file_type_name(32), "MOSTLY_BF16");
  EXPECT_EQ(file_type_name(36), "MOSTLY_TQ1_0");
  EXPECT_EQ(file_type_name(38), "MOSTLY_MXFP4_MOE");
  EXPECT_EQ(file_type_name(1024 + 15), "MOSTLY_Q4_K_M (guessed)");
  EXPECT_FALSE(file_type_name(999).has_value());
}

TEST(Format, ParameterCountsReadLikeModelSizes) {
  EXPECT_EQ(format_parameter_count(0), "0");
  EXPECT_EQ(format_parameter_count(999), "999");
  EXPECT_EQ(format_parameter_count(656000), "656.0K");
  EXPECT_EQ(format_parameter_count(656'612), "656.6K");
  EXPECT_EQ(format_parameter_count(999'960), "1.0M");
  EXPECT_EQ(format_parameter_count(124'439'808), "124.4M");
  EXPECT_EQ(format_parameter_count(6'738'415'616), "6.74B");
  EXPECT_EQ(format_parameter_count(70'553'706'496), "70.55B");
}

TEST(Format, BytesUseBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(749'728), "732.16 KiB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
}

TEST(Format, FloatsUseTheirShortestForm) {
  gguf::Value eps(1e-6f);
  EXPECT_EQ(format_float(*metadata_float(eps)), "1e-06");
  EXPECT_EQ(format_float(*metadata_float(gguf::Value(10000.0f))), "10000");
  EXPECT_EQ(format_float(*metadata_float(gguf::Value(0.1))), "0.1");
  EXPECT_FALSE(metadata_float(gguf::Value(uint32_t{1})).has_value());
}

TEST(Format, MetadataValuesAreEscapedAndShortened) {
  EXPECT_EQ(format_metadata_value(gguf::Value("a\nb\t\"c\"")), R"("a\nb\t\"c\"")");
  EXPECT_EQ(format_metadata_value(gguf::Value(std::string(100, 'x')), 8, 10),
            "\"xxxxxxxxxx\"... (100 bytes)");
  // A cut never splits a UTF-8 sequence: "▁" is 3 bytes.
  EXPECT_EQ(format_metadata_value(gguf::Value("ab\u2581cd"), 8, 3), "\"ab\"... (7 bytes)");
  EXPECT_EQ(format_metadata_value(gguf::Value(int8_t{-3})), "-3");
  EXPECT_EQ(format_metadata_value(gguf::Value(true)), "true");

  gguf::Array a;
  a.element_type = gguf::ValueType::UINT32;
  for (uint32_t i = 0; i < 5; ++i) a.items.emplace_back(i);
  EXPECT_EQ(format_metadata_value(gguf::Value(a), 3), "[0, 1, 2, ... (5 uint32 items)]");
  EXPECT_EQ(format_metadata_value(gguf::Value(a), 5), "[0, 1, 2, 3, 4]");
  EXPECT_EQ(escape_for_display("\x01<s>\n"), "\\x01<s>\\n");
}

// shared/models/README.md, "TinyStories-656K-Q8_0.gguf".
TEST(ModelSummary, TinyStoriesQ8_0MatchesTheReadme) {
  const auto s = summary_of("TinyStories-656K-Q8_0.gguf");
  EXPECT_EQ(s.file_size, 749'728u);
  EXPECT_EQ(s.gguf_version, 3u);
  EXPECT_EQ(s.architecture, "llama");
  EXPECT_TRUE(s.architecture_known);
  EXPECT_TRUE(s.architecture_runnable);
  EXPECT_EQ(s.name, "Raincandy U TinyStories 656K");
  EXPECT_EQ(s.license, "apache-2.0");
  EXPECT_EQ(s.file_type, 7u);
  EXPECT_EQ(s.tensor_count, 20u);
  EXPECT_EQ(count_of(s, gguf::TensorType::Q8_0), 15u);
  EXPECT_EQ(count_of(s, gguf::TensorType::F32), 5u);
  // Parameters from the README's shapes: embeddings, 2 layers, final norm.
  const uint64_t per_layer = 128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 384 + 2 * 128;
  EXPECT_EQ(s.parameter_count, 2048u * 128 + 2 * per_layer + 128);
  EXPECT_EQ(format_parameter_count(s.parameter_count), "656.0K");
  ASSERT_TRUE(s.bits_per_weight().has_value());
  EXPECT_GT(*s.bits_per_weight(), 8.0);  // Q8_0 is 8.5 bpw, the F32 norms add a little
  EXPECT_LT(*s.bits_per_weight(), 9.0);

  EXPECT_EQ(s.context_length, 512u);
  EXPECT_EQ(s.embedding_length, 128u);
  EXPECT_EQ(s.block_count, 2u);
  EXPECT_EQ(s.feed_forward_length, 384u);
  EXPECT_EQ(s.head_count, 8u);
  EXPECT_EQ(s.head_count_kv, 4u);
  EXPECT_EQ(s.head_dim, 16u);
  EXPECT_EQ(s.rope_dimension_count, 16u);
  EXPECT_EQ(s.rope_freq_base, 10000.0);
  EXPECT_EQ(s.rms_norm_eps, 1e-6);
  EXPECT_EQ(s.vocab_size, 2048u);
  EXPECT_EQ(s.output_tied, true);

  EXPECT_EQ(s.tokenizer_model, "llama");
  EXPECT_EQ(s.tokenizer_pre, "default");
  EXPECT_EQ(s.token_count, 2048u);
  ASSERT_NE(s.special_token("BOS"), nullptr);
  EXPECT_EQ(s.special_token("BOS")->id, 1);
  EXPECT_EQ(s.special_token("BOS")->text, "<|start_story|>");
  ASSERT_NE(s.special_token("EOS"), nullptr);
  EXPECT_EQ(s.special_token("EOS")->id, 2);
  EXPECT_EQ(s.special_token("EOS")->text, "<|end_story|>");
  ASSERT_NE(s.special_token("UNK"), nullptr);
  EXPECT_EQ(s.special_token("UNK")->id, 0);
  ASSERT_NE(s.special_token("PAD"), nullptr);
  EXPECT_EQ(s.special_token("PAD")->id, 0);
  EXPECT_EQ(s.add_bos, true);
  EXPECT_EQ(s.add_eos, false);
  EXPECT_FALSE(s.has_chat_template);
}

TEST(ModelSummary, FileTypeIsReportedAsWrittenNotAsTheTensorsAre) {
  const auto s = summary_of("TinyStories-656K-Q2_K.gguf");
  EXPECT_EQ(s.file_type, 10u);  // MOSTLY_Q2_K, though no tensor is Q2_K
  EXPECT_EQ(count_of(s, gguf::TensorType::Q2_K), 0u);
  EXPECT_EQ(count_of(s, gguf::TensorType::IQ4_NL), 14u);
  EXPECT_EQ(count_of(s, gguf::TensorType::Q8_0), 1u);
  EXPECT_EQ(count_of(s, gguf::TensorType::F32), 5u);
}

TEST(ModelSummary, SeparateOutputIsNotTied) {
  const auto s = summary_of("llama-2-tiny-random.gguf");
  EXPECT_EQ(s.output_tied, false);
  EXPECT_FALSE(s.rope_freq_base.has_value());  // the file has no such key
  EXPECT_FALSE(s.tokenizer_pre.has_value());
  EXPECT_EQ(s.name, "LLaMA v2");
}

TEST(ModelSummary, VocabularyOnlyFileOfAnotherArchitecture) {
  const auto s = summary_of("vocab/ggml-vocab-phi-3.gguf");
  EXPECT_EQ(s.architecture, "phi3");
  EXPECT_TRUE(s.architecture_known);  // m40-llm runs phi3, but this file has no weights
  EXPECT_FALSE(s.architecture_runnable);
  EXPECT_NE(s.not_runnable_reason.find("vocabulary-only"), std::string::npos) << s.not_runnable_reason;
  EXPECT_EQ(s.tensor_count, 0u);
  EXPECT_EQ(s.parameter_count, 0u);
  EXPECT_FALSE(s.bits_per_weight().has_value());
  EXPECT_FALSE(s.output_tied.has_value());  // nothing to tie without tensors
  EXPECT_TRUE(s.tensor_types.empty());
  EXPECT_EQ(s.token_count, 32064u);
  EXPECT_TRUE(s.has_chat_template);
  EXPECT_GT(s.chat_template_bytes, 0u);
}

TEST(ModelSummary, BpeVocabularyCountsItsMerges) {
  const auto s = summary_of("vocab/ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(s.tokenizer_model, "gpt2");
  EXPECT_EQ(s.token_count, 50257u);
  ASSERT_TRUE(s.merge_count.has_value());
  EXPECT_GT(*s.merge_count, 0u);
  EXPECT_EQ(tokenizer_kind("gpt2"), "BPE");
  EXPECT_EQ(tokenizer_kind("llama"), "SentencePiece");
}

TEST(ModelSummary, OddMetadataIsLeftOutNotAnError) {
  gguf::Writer w;
  w.metadata().set("general.architecture", "llama");
  w.metadata().set("llama.block_count", "many");               // mistyped
  w.metadata().set("llama.attention.head_count", gguf::Value(gguf::Array{gguf::ValueType::UINT32, {uint32_t{4}}}));
  w.metadata().set("llama.embedding_length", uint32_t{64});
  w.metadata().set("tokenizer.ggml.bos_token_id", uint32_t{7});  // no token list to look it up in
  w.metadata().set("general.file_type", uint32_t{999});           // unknown id
  const std::vector<float> weights(64 * 3, 0.0f);
  w.add_tensor("token_embd.weight", gguf::TensorType::F32, {64, 3},
               std::span(reinterpret_cast<const uint8_t*>(weights.data()), weights.size() * sizeof(float)));
  const auto bytes = w.to_bytes();
  const auto file = gguf::File::parse(bytes);

  const auto s = summarize(file);
  EXPECT_FALSE(s.block_count.has_value());
  EXPECT_FALSE(s.head_count.has_value());
  EXPECT_FALSE(s.head_dim.has_value());
  EXPECT_EQ(s.embedding_length, 64u);
  EXPECT_EQ(s.vocab_size, 3u);  // from token_embd, as nothing else gives it
  EXPECT_EQ(s.output_tied, true);
  ASSERT_NE(s.special_token("BOS"), nullptr);
  EXPECT_EQ(s.special_token("BOS")->id, 7);
  EXPECT_FALSE(s.special_token("BOS")->text.has_value());
  EXPECT_EQ(s.file_type, 999u);
  EXPECT_FALSE(file_type_name(999).has_value());
  EXPECT_EQ(s.parameter_count, 192u);
}

TEST(ModelSummary, EmptyFileHasNoFacts) {
  gguf::Writer w;
  const auto bytes = w.to_bytes();
  const auto s = summarize(gguf::File::parse(bytes));
  EXPECT_TRUE(s.architecture.empty());
  EXPECT_FALSE(s.vocab_size.has_value());
  EXPECT_FALSE(s.tokenizer_model.has_value());
  EXPECT_TRUE(s.special_tokens.empty());
}

// Runnable says what loading says: the loader's own reason when it refuses,
// and the tensors a runnable file holds that the forward pass leaves unread.
TEST(ModelSummary, RunnabilityIsWhatTheLoaderSays) {
  const auto unknown = summary_of("vocab/ggml-vocab-bert-bge.gguf");
  EXPECT_FALSE(unknown.architecture_known);
  EXPECT_FALSE(unknown.architecture_runnable);

  const auto path = m40::test::shared_model("arch/tiny-mixtral-F32.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data missing";
  for (const char* stem :
       {"qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral3", "granite", "smollm3", "qwen3moe", "mixtral"}) {
    const auto s = summary_of(std::string("arch/tiny-") + stem + "-F32.gguf");
    EXPECT_TRUE(s.architecture_runnable) << stem << ": " << s.not_runnable_reason;
    EXPECT_TRUE(s.unused_tensors.empty()) << stem << " leaves " << s.unused_tensors.front() << " unread";
  }
}

// A mixture-of-experts file lists its experts and the parameters one token
// computes with (the README's shapes: qwen3moe 2 layers of 8 experts
// 64 → 32 → 64, 2 used; Mixtral 2 layers of 4 experts 128 → 64 → 128, 2 used).
TEST(ModelSummary, ExpertsAndActiveParameters) {
  const auto path = m40::test::shared_model("arch/tiny-qwen3moe-F32.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data missing";
  const auto qwen = summary_of("arch/tiny-qwen3moe-F32.gguf");
  ASSERT_TRUE(qwen.has_experts());
  EXPECT_EQ(qwen.expert_count, 8u);
  EXPECT_EQ(qwen.expert_used_count, 2u);
  EXPECT_EQ(qwen.expert_feed_forward_length, 32u);
  EXPECT_EQ(qwen.parameter_count, 280000u);
  const uint64_t qwen_experts = 2 * 3 * 64 * 32 * 8;
  EXPECT_EQ(qwen.active_parameter_count, 280000u - qwen_experts + qwen_experts / 8 * 2);

  const auto mixtral = summary_of("arch/tiny-mixtral-Q8_0.gguf");
  EXPECT_EQ(mixtral.expert_count, 4u);
  EXPECT_EQ(mixtral.expert_used_count, 2u);
  EXPECT_EQ(mixtral.expert_feed_forward_length, 64u);  // llama: feed_forward_length is the expert width
  EXPECT_EQ(mixtral.parameter_count, 427648u);
  EXPECT_EQ(mixtral.active_parameter_count, 427648u - 2 * 3 * 128 * 64 * 4 / 2);

  const auto dense = summary_of("arch/tiny-qwen3-F32.gguf");
  EXPECT_FALSE(dense.has_experts());
  EXPECT_FALSE(dense.active_parameter_count);

  // Bytes a decode token reads, F32 files: 4 per active parameter, but of
  // qwen3moe's token_embd (1024 x 64; its head is output.weight) one row;
  // tiny-qwen3's head is token_embd itself, read whole.
  EXPECT_EQ(qwen.decode_bytes_per_token, 4u * (280000u - qwen_experts + qwen_experts / 8 * 2 - 1024 * 64 + 64));
  EXPECT_EQ(dense.decode_bytes_per_token, 4u * dense.parameter_count);
}

// The bytes a decode token reads (model/decode_reads.h), split by stages of
// a model split by layers: the stages' shares add up to the whole file's,
// the token embedding's row goes to the first stage, a tied head to the
// last, and expert tensors count their used share.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "gguf/file.h"
#include "model/decode_reads.h"
#include "model/loaded_model.h"
#include "test_paths.h"

namespace m40 {
namespace {

using model::decode_bytes_per_token;
using model::DecodeScope;

uint64_t tensor_bytes(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  return t != nullptr ? t->byte_size : 0;
}

TEST(DecodeReads, StagesAddUpToTheWholeModel) {
  for (const char* name : {"TinyStories-656K-Q8_0.gguf", "arch/tiny-gemma3-F32.gguf", "arch/tiny-qwen3moe-Q8_0.gguf",
                           "arch/tiny-phi3-F32.gguf"}) {
    const auto path = test::shared_model(name);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    const auto m = model::LoadedModel::open(path.string());
    const gguf::File& f = m->file;
    const uint64_t experts = m->hparams.n_expert, used = m->hparams.n_expert_used;
    const int n = static_cast<int>(m->hparams.n_layer);
    const uint64_t whole = decode_bytes_per_token(f, experts, used);
    const uint64_t first = decode_bytes_per_token(f, experts, used, DecodeScope{0, 1, true, false});
    const uint64_t rest = decode_bytes_per_token(f, experts, used, DecodeScope{1, n, false, true});
    const bool tied = f.find_tensor("output.weight") == nullptr;
    const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    const uint64_t row = embd->byte_size / embd->dims[1];
    // A tied head reads the embedding whole in the last stage; the first
    // stage reads its row besides.
    EXPECT_EQ(first + rest, whole + (tied ? row : 0)) << name;
    EXPECT_GT(first, row) << name << ": layer 0";
    EXPECT_GE(rest, tied ? embd->byte_size : tensor_bytes(f, "output.weight")) << name << ": the head";
    // The first stage: layer 0, the token's row, and what every layer
    // shares (RoPE factors).
    const uint64_t layer0 = decode_bytes_per_token(f, experts, used, DecodeScope{0, 1, false, false});
    uint64_t shared = 0;
    for (const auto& t : f.tensors()) {
      if (!t.name.starts_with("blk.") && !t.name.starts_with("output") && t.name != "token_embd.weight") shared += t.byte_size;
    }
    EXPECT_EQ(first, layer0 + row + shared) << name;
  }
}

TEST(DecodeReads, ExpertsCountTheirUsedShare) {
  const auto path = test::shared_model("arch/tiny-qwen3moe-Q8_0.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
  const auto m = model::LoadedModel::open(path.string());
  const gguf::File& f = m->file;
  const uint64_t experts = m->hparams.n_expert, used = m->hparams.n_expert_used;
  ASSERT_GT(experts, used);
  const DecodeScope layer0{0, 1, false, false};
  const uint64_t dense_view = decode_bytes_per_token(f, 0, 0, layer0);  // every expert read
  const uint64_t routed = decode_bytes_per_token(f, experts, used, layer0);
  uint64_t expert_tensors = 0;
  for (const char* t : {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"}) {
    expert_tensors += tensor_bytes(f, t);
  }
  ASSERT_GT(expert_tensors, 0u);
  EXPECT_EQ(dense_view - routed, expert_tensors - expert_tensors / experts * used);
}

}  // namespace
}  // namespace m40

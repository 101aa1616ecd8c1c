// A model split by layers (backends/pipeline/pipeline_backend.h) into CPU
// stages, the stand-in for two or more devices: the hand-over of hidden
// states between stages, each stage's own K/V of its layers, and the block
// tables and copies applied to every stage give the whole model's logits
// and hidden states bit for bit (the same arithmetic in the same order),
// on every architecture family of the shared tiny models. The chain is
// refused when its stages do not make one model.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/pipeline/pipeline_backend.h"
#include "common/error.h"
#include "model/loaded_model.h"
#include "test_paths.h"

namespace m40 {
namespace {

using backend::Batch;
using backend::LayerRange;
using backend::PipelineBackend;

constexpr int kCtx = 96;
constexpr int kSeq = 2;

struct SplitCase {
  std::string model;     // under ../shared/models
  std::vector<int> cuts; // where one stage ends and the next begins
};

void PrintTo(const SplitCase& c, std::ostream* os) {
  *os << c.model << " cut at";
  for (int cut : c.cuts) *os << " " << cut;
}

std::string case_name(const ::testing::TestParamInfo<SplitCase>& info) {
  std::string name = std::filesystem::path(info.param.model).stem().string();
  for (int c : info.param.cuts) name += "_at" + std::to_string(c);
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

class SplitModel : public ::testing::TestWithParam<SplitCase> {
 protected:
  void SetUp() override {
    const auto path = test::shared_model(GetParam().model);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    model_ = model::LoadedModel::open(path.string());
  }

  cpu::CpuBackendOptions options(LayerRange layers, int kv_blocks = 0) const {
    return {.n_ctx = kCtx, .n_seq = kSeq, .kv_blocks = kv_blocks, .kv_type = backend::KvType::F16, .threads = 2,
            .layers = layers};
  }
  std::unique_ptr<cpu::CpuBackend> whole(int kv_blocks = 0) const {
    return std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights, options({}, kv_blocks));
  }
  std::unique_ptr<PipelineBackend> split(int kv_blocks = 0) const {
    const int n_layer = static_cast<int>(model_->hparams.n_layer);
    std::vector<std::unique_ptr<backend::Backend>> stages;
    int first = 0;
    std::vector<int> ends = GetParam().cuts;
    ends.push_back(n_layer);
    for (int end : ends) {
      stages.push_back(std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights, options({first, end}, kv_blocks)));
      first = end;
    }
    return std::make_unique<PipelineBackend>(std::move(stages), n_layer);
  }

  std::vector<int32_t> random_tokens(size_t n, unsigned seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> out(n);
    for (auto& t : out) t = static_cast<int32_t>(rng() % model_->hparams.n_vocab);
    return out;
  }
  // The batch's outputs, poisoned first.
  static std::vector<float> run(backend::Backend& b, const Batch& batch) {
    const size_t row = static_cast<size_t>(batch.output_embeddings ? b.n_embd() : b.n_vocab());
    std::vector<float> out(batch.logits_count() * row, std::nanf(""));
    b.forward(batch, out);
    return out;
  }

  std::unique_ptr<model::LoadedModel> model_;
};

// Prompts with logits at every position, two sequences in one step (one
// reading its prompt, one decoding), decode steps, and hidden states.
TEST_P(SplitModel, GivesTheWholeModelsLogitsAndHiddenStates) {
  auto reference = whole();
  auto pipeline = split();
  ASSERT_EQ(pipeline->n_vocab(), reference->n_vocab());
  EXPECT_EQ(pipeline->n_kv_blocks(), reference->n_kv_blocks());
  const auto& w = model_->weights;
  const uint64_t tied_head = w.tied_output ? w.token_embd.rows * w.token_embd.row_bytes : 0;
  EXPECT_EQ(pipeline->memory_bytes(), reference->memory_bytes() + tied_head)
      << "each tensor and each layer's K/V in one stage (a tied head beside the embedding's stage)";

  const auto prompt0 = random_tokens(13, 1), prompt1 = random_tokens(7, 2);
  Batch batch;
  for (int p = 0; p < 13; ++p) batch.add(prompt0[p], p, 0, true);
  const auto expected = run(*reference, batch);
  ASSERT_FALSE(std::isnan(expected.front()));
  EXPECT_EQ(run(*pipeline, batch), expected) << "the first prompt";

  batch.clear();
  for (int p = 0; p < 7; ++p) batch.add(prompt1[p], p, 1, p == 6);
  batch.add(prompt0[3], 13, 0, true);
  EXPECT_EQ(run(*pipeline, batch), run(*reference, batch)) << "a prompt beside a decode step";

  const auto next = random_tokens(8, 3);
  for (int step = 0; step < 4; ++step) {
    batch.clear();
    batch.add(next[2 * step], 14 + step, 0, true);
    batch.add(next[2 * step + 1], 7 + step, 1, true);
    EXPECT_EQ(run(*pipeline, batch), run(*reference, batch)) << "decode step " << step;
  }

  batch.clear();
  batch.add(prompt1[0], 11, 1, true);
  batch.add(prompt1[1], 12, 1, true);
  batch.output_embeddings = true;
  const auto hidden = run(*reference, batch);
  ASSERT_FALSE(std::isnan(hidden.back()));
  EXPECT_EQ(run(*pipeline, batch), hidden) << "hidden states";
}

// Block tables and block copies reach every stage: a sequence that shares
// the other's full block and a copy of its partial block continues as the
// whole model does with the same tables.
TEST_P(SplitModel, BlockTablesAndCopiesApplyToEveryStage) {
  constexpr int B = backend::kKvBlockSize;
  auto reference = whole(12);
  auto pipeline = split(12);
  ASSERT_EQ(pipeline->n_kv_blocks(), 12);
  const auto tokens = random_tokens(B + 10, 4);
  for (backend::Backend* b : {static_cast<backend::Backend*>(reference.get()), static_cast<backend::Backend*>(pipeline.get())}) {
    b->set_blocks(0, std::vector<int32_t>{7, 2}, 0);
  }
  Batch batch;
  for (int p = 0; p < B + 6; ++p) batch.add(tokens[p], p, 0, p + 1 == B + 6);
  EXPECT_EQ(run(*pipeline, batch), run(*reference, batch));

  // Sequence 1: block 7 shared, block 2's first 6 positions copied to 9.
  for (backend::Backend* b : {static_cast<backend::Backend*>(reference.get()), static_cast<backend::Backend*>(pipeline.get())}) {
    b->copy_block(2, 9);
    b->set_blocks(1, std::vector<int32_t>{7, 9}, B + 6);
  }
  batch.clear();
  for (int p = B + 6; p < B + 10; ++p) batch.add(tokens[p], p, 1, true);
  const auto expected = run(*reference, batch);
  ASSERT_FALSE(std::isnan(expected.front()));
  EXPECT_EQ(run(*pipeline, batch), expected);
}

INSTANTIATE_TEST_SUITE_P(
    SharedModels, SplitModel,
    ::testing::Values(SplitCase{"TinyStories-656K-Q8_0.gguf", {1}}, SplitCase{"arch/tiny-qwen2-Q8_0.gguf", {1}},
                      SplitCase{"arch/tiny-qwen3-F32.gguf", {1}}, SplitCase{"arch/tiny-gemma2-Q8_0.gguf", {1}},
                      SplitCase{"arch/tiny-gemma3-F32.gguf", {1, 2}}, SplitCase{"arch/tiny-gemma3-F32.gguf", {2}},
                      SplitCase{"arch/tiny-phi3-F32.gguf", {1}}, SplitCase{"arch/tiny-granite-F32.gguf", {1, 2}},
                      SplitCase{"arch/tiny-qwen3moe-Q8_0.gguf", {1}}, SplitCase{"arch/tiny-mixtral-F32.gguf", {1}}),
    case_name);

class PipelineChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = test::shared_model("arch/tiny-granite-F32.gguf");  // 3 layers
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    model_ = model::LoadedModel::open(path.string());
  }
  std::unique_ptr<backend::Backend> stage(LayerRange layers, int n_ctx = kCtx, int kv_blocks = 0) const {
    return std::make_unique<cpu::CpuBackend>(
        model_->hparams, model_->weights,
        cpu::CpuBackendOptions{.n_ctx = n_ctx, .n_seq = kSeq, .kv_blocks = kv_blocks, .threads = 1, .layers = layers});
  }
  // The message of the error PipelineBackend's constructor throws.
  std::string refusal(std::vector<std::unique_ptr<backend::Backend>> stages) const {
    try {
      PipelineBackend p(std::move(stages), static_cast<int>(model_->hparams.n_layer));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  template <class... Ranges>
  std::vector<std::unique_ptr<backend::Backend>> stages(Ranges... r) const {
    std::vector<std::unique_ptr<backend::Backend>> out;
    (out.push_back(stage(r)), ...);
    return out;
  }
  std::unique_ptr<model::LoadedModel> model_;
};

TEST_F(PipelineChecks, StagesMustCoverTheLayersInOrder) {
  EXPECT_NE(refusal(stages(LayerRange{0, 1}, LayerRange{2, 3})).find("CPU (layers 2-2) does not begin at layer 1"),
            std::string::npos);
  EXPECT_NE(refusal(stages(LayerRange{1, 3}, LayerRange{0, 1})).find("does not begin at layer 0"), std::string::npos);
  EXPECT_NE(refusal(stages(LayerRange{0, 1}, LayerRange{1, 2})).find("end at layer 1 of 3"), std::string::npos);
  EXPECT_NE(refusal({}).find("at least one stage"), std::string::npos);
  EXPECT_EQ(refusal(stages(LayerRange{0, 1}, LayerRange{1, 3})), "");
  EXPECT_EQ(refusal(stages(LayerRange{})), "") << "one stage of the whole model";
}

TEST_F(PipelineChecks, StagesMustAgreeOnContextAndSequences) {
  std::vector<std::unique_ptr<backend::Backend>> s;
  s.push_back(stage({0, 1}));
  s.push_back(stage({1, 3}, kCtx * 2));
  EXPECT_NE(refusal(std::move(s)).find("differ in context, sequences, vocabulary or hidden width"), std::string::npos);
}

TEST_F(PipelineChecks, AStageRangeOutsideTheModelIsRefused) {
  for (LayerRange r : {LayerRange{0, 4}, LayerRange{2, 2}, LayerRange{-1, 1}, LayerRange{2, 1}}) {
    EXPECT_THROW(stage(r), Error) << r.first << "-" << r.end;
  }
}

// A stage alone is not a model: forward() needs the whole chain.
TEST_F(PipelineChecks, AStageRefusesAWholeStep) {
  auto s = stage({1, 3});
  Batch batch;
  batch.add(1, 0, 0, true);
  std::vector<float> logits(s->n_vocab());
  try {
    s->forward(batch, logits);
    ADD_FAILURE() << "a stage ran a whole step";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("computes layers 1 to 2 only"), std::string::npos) << e.what();
  }
}

// A block only the larger pools have is refused before any stage takes it,
// and a bad token before any stage computes.
TEST_F(PipelineChecks, BadBlocksAndTokensChangeNoStage) {
  std::vector<std::unique_ptr<backend::Backend>> s;
  s.push_back(stage({0, 1}, kCtx, 12));
  s.push_back(stage({1, 3}, kCtx, 8));
  PipelineBackend p(std::move(s), 3);
  EXPECT_EQ(p.n_kv_blocks(), 8);
  EXPECT_THROW(p.set_blocks(0, std::vector<int32_t>{3, 10}, 0), Error);
  EXPECT_THROW(p.copy_block(9, 1), Error);
  p.set_blocks(0, std::vector<int32_t>{3, 5}, 0);

  Batch bad;
  bad.add(static_cast<int32_t>(p.n_vocab()), 0, 0, true);
  std::vector<float> logits(p.n_vocab());
  EXPECT_THROW(p.forward(bad, logits), Error);
  Batch skipping;
  skipping.add(1, 1, 0, true);
  EXPECT_THROW(p.forward(skipping, logits), Error) << "position 0 was cached by the refused step";
  Batch good;
  good.add(1, 0, 0, true);
  logits.assign(logits.size(), std::nanf(""));
  p.forward(good, logits);
  EXPECT_FALSE(std::isnan(logits[0]));
}

TEST_F(PipelineChecks, StageWeightsAddUpToTheModel) {
  const auto& w = model_->weights;
  const size_t n = w.layers.size();
  const uint64_t tied_head = w.tied_output ? w.token_embd.rows * w.token_embd.row_bytes : 0;
  EXPECT_EQ(w.stage_bytes(0, 1) + w.stage_bytes(1, 2) + w.stage_bytes(2, n), w.total_bytes() + tied_head);
  EXPECT_EQ(w.stage_bytes(1, 2), w.layer_bytes(1));
  EXPECT_GT(w.stage_bytes(0, 1), w.layer_bytes(0)) << "the token embedding";
  EXPECT_GT(w.stage_bytes(2, n), w.layer_bytes(2)) << "the output norm and head";
  PipelineBackend p(stages(LayerRange{0, 2}, LayerRange{2, 3}), 3);
  EXPECT_EQ(p.name(), "CPU (layers 0-1) + CPU (layers 2-2)");
}

}  // namespace
}  // namespace m40

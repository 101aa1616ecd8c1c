// The engine over a model split by layers (backends/pipeline), CPU stages
// standing in for devices: concurrent requests sharing a prompt's blocks,
// second turns that reuse whole and partly filled blocks, forks of one
// prompt (n = 2) and more conversations than slots in a small pool answer
// exactly as over the whole model, with the same positions read from the
// cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/pipeline/pipeline_backend.h"
#include "engine/scheduler.h"
#include "model/loaded_model.h"
#include "scheduler_test_util.h"
#include "test_paths.h"
#include "tokenizer/vocab.h"

using namespace m40;

namespace {

constexpr int kSlots = 2;
constexpr int kCtx = 256;
constexpr int kBlocks = 24;  // fewer than two whole contexts (32): blocks are shared and reclaimed

struct Outcome {
  std::vector<std::string> texts;
  std::vector<int> cached;
};

class SplitModelScheduler : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    model_ = model::LoadedModel::open(path.string());
    vocab_ = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_file(path.string()));
  }
  cpu::CpuBackendOptions options(backend::LayerRange layers) const {
    return {.n_ctx = kCtx, .n_seq = kSlots, .kv_blocks = kBlocks, .kv_type = backend::KvType::F16, .threads = 2,
            .layers = layers};
  }
  std::unique_ptr<backend::Backend> whole() const {
    return std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights, options({}));
  }
  std::unique_ptr<backend::Backend> split() const {
    const int n = static_cast<int>(model_->hparams.n_layer);
    std::vector<std::unique_ptr<backend::Backend>> stages;
    stages.push_back(std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights, options({0, 1})));
    stages.push_back(std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights, options({1, n})));
    return std::make_unique<backend::PipelineBackend>(std::move(stages), n);
  }
  std::vector<int32_t> tokens(const std::string& text, bool bos) const { return vocab_->encode(text, {.add_special = bos}); }

  // The same workload on `backend`: three requests sharing a prompt (two
  // of them at once), a second turn of the first, two choices of one prompt, and four
  // conversations taking turns on the two slots.
  Outcome run(backend::Backend& backend) const {
    Outcome out;
    engine::Scheduler scheduler(backend, *vocab_);
    const auto record = [&](engine::RequestStream& stream) {
      const auto done = test::drain(stream);
      out.texts.push_back(done.text);
      out.cached.push_back(done.end.timings.cached_tokens);
      return done;
    };
    const auto shared = tokens("Once upon a time, there was a little girl named Lily. She loved to play outside.", true);
    // The first request alone, then two at once that both find its blocks
    // (what they share beyond that is the same prompt prefix).
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<test::Collected> first;
    for (const char* end : {" One day", " Her dog", " The sun"}) {
      auto prompt = shared;
      const auto more = tokens(end, false);
      prompt.insert(prompt.end(), more.begin(), more.end());
      prompts.push_back(prompt);
      streams.push_back(scheduler.submit(test::greedy(prompt, 24)));
      if (streams.size() == 1) first.push_back(record(*streams.front()));
    }
    for (size_t i = 1; i < streams.size(); ++i) first.push_back(record(*streams[i]));
    auto second = test::fed_tokens(prompts[0], first[0].end);
    second.push_back(first[0].end.answer_tokens.back());
    const auto more = tokens(" Then she went home.", false);
    second.insert(second.end(), more.begin(), more.end());
    record(*scheduler.submit(test::greedy(second, 16)));

    auto forks = scheduler.submit(test::greedy(tokens("The cat sat on the mat and", true), 12), 2);
    record(*forks);
    for (const char* opening : {"Tom had a red ball.", "The bird sang a song.", "Mia found a big box.", "Sam ate cake."}) {
      record(*scheduler.submit(test::greedy(tokens(opening, true), 20)));
    }
    return out;
  }

  std::unique_ptr<model::LoadedModel> model_;
  std::unique_ptr<tokenizer::Vocab> vocab_;
};

TEST_F(SplitModelScheduler, AnswersAndCacheHitsAreTheWholeModels) {
  auto reference_backend = whole();
  const Outcome reference = run(*reference_backend);
  auto split_backend = split();
  const Outcome got = run(*split_backend);
  EXPECT_EQ(got.texts, reference.texts);
  EXPECT_EQ(got.cached, reference.cached);
  int cached = 0;
  for (int c : reference.cached) cached += c;
  EXPECT_GT(cached, 32) << "the workload reuses cached blocks";
}

}  // namespace

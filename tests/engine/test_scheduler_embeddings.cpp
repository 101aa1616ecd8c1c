// Embedding requests through the engine loop (RequestParams::embed) on the
// tiny qwen3 model with the CPU backend: the vector is the pooled,
// normalized hidden states of an independent forward pass, however the
// prompt is chunked; embedding steps carry no generation tokens and the
// streams beside them answer as alone; a request preempted mid-prompt is
// read again from the start; a prompt may fill the whole context.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "scheduler_test_util.h"
#include "model/loaded_model.h"
#include "test_paths.h"
#include "wrapped_backend.h"

using namespace m40;
using model::PoolingType;

namespace {

// Records each batch's sequences and whether it asked for hidden states.
class BatchLog : public test::WrappedBackend {
 public:
  using WrappedBackend::WrappedBackend;
  void forward(const backend::Batch& batch, std::span<float> out) override {
    {
      std::lock_guard lock(mutex_);
      log_.push_back({batch.output_embeddings, std::set<int32_t>(batch.seq_ids.begin(), batch.seq_ids.end())});
    }
    inner().forward(batch, out);
  }
  struct Entry {
    bool embeddings;
    std::set<int32_t> seqs;
  };
  std::vector<Entry> log() const {
    std::lock_guard lock(mutex_);
    return log_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> log_;
};

using test::Collected;
using test::drain;
using test::greedy;

class SchedulerEmbeddingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = test::shared_model("arch/tiny-qwen3-F32.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not found: " << path;
    model_ = model::LoadedModel::open(path.string());
    vocab_ = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_file(path.string()));
    n_embd_ = static_cast<int>(model_->hparams.n_embd);
  }
  std::unique_ptr<cpu::CpuBackend> cpu_backend(int n_seq, int kv_blocks = 0) const {
    return std::make_unique<cpu::CpuBackend>(model_->hparams, model_->weights,
                                             cpu::CpuBackendOptions{.n_ctx = kCtx, .n_seq = n_seq, .kv_blocks = kv_blocks, .threads = 2});
  }
  // `n` tokens of text.
  std::vector<int32_t> text_tokens(size_t n, const std::string& seed = "The quick brown fox jumps over the lazy dog. ") const {
    std::vector<int32_t> out;
    while (out.size() < n) {
      const auto more = vocab_->encode(seed, {.add_special = false});
      out.insert(out.end(), more.begin(), more.end());
    }
    out.resize(n);
    return out;
  }
  // What the embedding must be, computed apart from the scheduler: every
  // token's hidden state from one forward pass of a fresh backend, pooled
  // and normalized here.
  std::vector<float> reference(const std::vector<int32_t>& tokens, PoolingType pooling) const {
    auto backend = cpu_backend(1);
    backend::Batch batch;
    batch.output_embeddings = true;
    for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], static_cast<int>(i), 0, true);
    std::vector<float> hidden(tokens.size() * n_embd_);
    backend->forward(batch, hidden);
    std::vector<double> v(n_embd_, 0.0);
    const size_t n = tokens.size();
    for (int j = 0; j < n_embd_; ++j) {
      if (pooling == PoolingType::Mean) {
        for (size_t t = 0; t < n; ++t) v[j] += hidden[t * n_embd_ + j] / static_cast<double>(n);
      } else {
        v[j] = hidden[(pooling == PoolingType::Cls ? 0 : n - 1) * n_embd_ + j];
      }
    }
    double norm = 0;
    for (double x : v) norm += x * x;
    std::vector<float> out(n_embd_);
    for (int j = 0; j < n_embd_; ++j) out[j] = static_cast<float>(v[j] / std::sqrt(norm));
    return out;
  }
  static engine::RequestParams embedding(std::vector<int32_t> tokens, PoolingType pooling) {
    engine::RequestParams p;
    p.prompt = std::move(tokens);
    p.embed = pooling;
    return p;
  }
  static ::testing::AssertionResult close(const std::vector<float>& expected, const std::vector<float>& got, float tol = 1e-5f) {
    if (expected.size() != got.size()) {
      return ::testing::AssertionFailure() << got.size() << " values, expected " << expected.size();
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(std::abs(expected[i] - got[i]) <= tol)) {
        return ::testing::AssertionFailure() << "value " << i << ": " << got[i] << ", expected " << expected[i];
      }
    }
    return ::testing::AssertionSuccess();
  }
  static double norm(const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s);
  }

  static constexpr int kCtx = 64;
  std::unique_ptr<model::LoadedModel> model_;
  std::unique_ptr<tokenizer::Vocab> vocab_;
  int n_embd_ = 0;
};

}  // namespace

TEST_F(SchedulerEmbeddingTest, EachPoolingIsTheHiddenStatesPooledAndNormalizedInAnyChunks) {
  auto backend = cpu_backend(2);
  const auto tokens = text_tokens(40);
  for (const int chunk : {256, 7, 1}) {
    engine::Scheduler scheduler(*backend, *vocab_, {.prefill_chunk = chunk});
    for (auto pooling : {PoolingType::Mean, PoolingType::Cls, PoolingType::Last}) {
      const Collected r = drain(*scheduler.submit(embedding(tokens, pooling)));
      ASSERT_EQ(r.end.kind, engine::StreamEvent::Kind::Done) << r.end.text;
      EXPECT_TRUE(r.text.empty());
      EXPECT_EQ(r.end.timings.prompt_tokens, 40);
      EXPECT_EQ(r.end.timings.cached_tokens, 0);
      EXPECT_EQ(r.end.timings.generated_tokens, 0);
      EXPECT_NEAR(norm(r.end.embedding), 1.0, 1e-5);
      EXPECT_TRUE(close(reference(tokens, pooling), r.end.embedding))
          << model::pooling_type_name(pooling) << ", chunks of " << chunk;
    }
    // The same text again is read again (never from the blocks the first
    // left cached), and gives the same vector.
    const Collected again = drain(*scheduler.submit(embedding(tokens, PoolingType::Mean)));
    EXPECT_EQ(again.end.timings.cached_tokens, 0);
    EXPECT_TRUE(close(reference(tokens, PoolingType::Mean), again.end.embedding));
  }
}

TEST_F(SchedulerEmbeddingTest, EmbeddingStepsCarryNoGenerationAndTheStreamAnswersAsAlone) {
  const auto story = text_tokens(12, "Once upon a time ");
  std::string alone;
  {
    auto backend = cpu_backend(3);
    engine::Scheduler scheduler(*backend, *vocab_, {.prefill_chunk = 8});
    alone = drain(*scheduler.submit(greedy(story, 24))).text;
  }
  BatchLog backend(cpu_backend(3));
  engine::Scheduler scheduler(backend, *vocab_, {.prefill_chunk = 8});
  // Admitted in order: the generation takes sequence 0, the embeddings 1 and 2.
  auto generating = scheduler.submit(greedy(story, 24));
  const auto a = text_tokens(30), b = text_tokens(45, "Embeddings map text to vectors. ");
  auto first = scheduler.submit(embedding(a, PoolingType::Mean));
  auto second = scheduler.submit(embedding(b, PoolingType::Last));
  const Collected ea = drain(*first), eb = drain(*second);
  EXPECT_EQ(drain(*generating).text, alone);
  EXPECT_TRUE(close(reference(a, PoolingType::Mean), ea.end.embedding));
  EXPECT_TRUE(close(reference(b, PoolingType::Last), eb.end.embedding));
  int embedding_steps = 0;
  for (const auto& entry : backend.log()) {
    if (entry.embeddings) {
      ++embedding_steps;
      EXPECT_EQ(entry.seqs.count(0), 0u) << "a generation token in an embedding step";
    } else {
      EXPECT_TRUE(entry.seqs.count(1) == 0 && entry.seqs.count(2) == 0) << "an embedding's token in a generation step";
    }
  }
  EXPECT_GE(embedding_steps, (30 + 45) / 8);
}

// Holds every forward step after the first that gave logits (the running
// request's first token) until released: what is submitted meanwhile is
// admitted before that request moves on.
class HeldBackend : public test::WrappedBackend {
 public:
  using WrappedBackend::WrappedBackend;
  void forward(const backend::Batch& batch, std::span<float> out) override {
    {
      std::unique_lock lock(mutex_);
      released_cv_.wait(lock, [&] { return released_ || !answered_; });
    }
    inner().forward(batch, out);
    std::lock_guard lock(mutex_);
    if (batch.logits_count() > 0) answered_ = true;
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    released_cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_cv_;
  bool answered_ = false;
  bool released_ = false;
};

TEST_F(SchedulerEmbeddingTest, APreemptedEmbeddingIsReadAgainFromTheStart) {
  // Six blocks of 16 positions: the generation (10 + 40 tokens) needs a
  // third block at position 32, while the younger embedding (64 tokens,
  // 4 blocks, 2 tokens a step) is still reading: it gives its blocks back
  // and reads its prompt again once the generation has ended. The backend
  // holds the generation's second step until the embedding is queued, so
  // the embedding is admitted near position 12, whatever the machine's speed.
  HeldBackend backend(cpu_backend(2, 6));
  engine::Scheduler scheduler(backend, *vocab_, {.prefill_chunk = 2, .prefill_slowdown = 0});
  auto generating = scheduler.submit(greedy(text_tokens(10, "Once upon a time "), 40));
  std::vector<engine::StreamEvent> first;
  const bool started = generating->wait(std::chrono::seconds(10), first);  // admitted first: the older
  const auto tokens = text_tokens(kCtx);
  auto embed = scheduler.submit(embedding(tokens, PoolingType::Mean));
  backend.release();
  ASSERT_TRUE(started);
  const Collected r = drain(*embed);
  drain(*generating);
  ASSERT_EQ(r.end.kind, engine::StreamEvent::Kind::Done) << r.end.text;
  EXPECT_GE(scheduler.stats().preemptions, 1u);
  EXPECT_TRUE(close(reference(tokens, PoolingType::Mean), r.end.embedding));
}

TEST_F(SchedulerEmbeddingTest, AnEmbeddingMayFillTheWholeContextAnAnswerMayNot) {
  auto backend = cpu_backend(1);
  engine::Scheduler scheduler(*backend, *vocab_);
  const auto tokens = text_tokens(kCtx);
  const Collected r = drain(*scheduler.submit(embedding(tokens, PoolingType::Last)));
  ASSERT_EQ(r.end.kind, engine::StreamEvent::Kind::Done) << r.end.text;
  EXPECT_TRUE(close(reference(tokens, PoolingType::Last), r.end.embedding));
  EXPECT_THROW(scheduler.submit(greedy(tokens, 4)), engine::RequestRejected);
  EXPECT_THROW(scheduler.submit(embedding(text_tokens(kCtx + 1), PoolingType::Last)), engine::RequestRejected);
}

TEST_F(SchedulerEmbeddingTest, RefusesSeveralChoicesRerankersAndNoPooling) {
  auto backend = cpu_backend(2);
  engine::Scheduler scheduler(*backend, *vocab_);
  const auto tokens = text_tokens(5);
  EXPECT_THROW(scheduler.submit(embedding(tokens, PoolingType::Mean), 2), engine::RequestRejected);
  EXPECT_THROW(scheduler.submit(embedding(tokens, PoolingType::Rank)), engine::RequestRejected);
  EXPECT_THROW(scheduler.submit(embedding(tokens, PoolingType::None)), engine::RequestRejected);
  EXPECT_THROW(scheduler.submit(embedding({}, PoolingType::Mean)), engine::RequestRejected);
}

TEST_F(SchedulerEmbeddingTest, ACancelledEmbeddingEndsCancelled) {
  auto backend = cpu_backend(1);
  engine::Scheduler scheduler(*backend, *vocab_, {.prefill_chunk = 1});
  auto stream = scheduler.submit(embedding(text_tokens(kCtx), PoolingType::Mean));
  stream->cancel();
  const Collected r = drain(*stream);
  EXPECT_EQ(r.end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(r.end.finish_reason, engine::FinishReason::Cancelled);
  EXPECT_TRUE(r.end.embedding.empty());
  // The slot is free again.
  const Collected next = drain(*scheduler.submit(embedding(text_tokens(8), PoolingType::Cls)));
  EXPECT_EQ(next.end.finish_reason, engine::FinishReason::EndOfGeneration);
  EXPECT_EQ(next.end.embedding.size(), static_cast<size_t>(n_embd_));
}

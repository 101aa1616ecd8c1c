// The engine loop on its own, over a recording fake backend: what each step
// batches (decode tokens of every generating slot plus bounded prompt
// chunks), admission, cancellation, limits and refusals; and over the real
// model, that a prompt read in paced chunks or layer slices beside a stream
// answers as alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "backends/block_tables.h"
#include "backends/cpu/cpu_backend.h"
#include "engine/backend_factory.h"
#include "engine/scheduler.h"
#include "scheduler_test_util.h"
#include "model/loaded_model.h"
#include "test_paths.h"
#include "wrapped_backend.h"

using namespace m40;

namespace {

// Answers every step with logits that make `favorite` the argmax, records
// each batch, and can be slowed down.
class RecordingBackend : public backend::Backend {
 public:
  RecordingBackend(int n_vocab, int n_ctx, int n_seq, int32_t favorite)
      : n_vocab_(n_vocab), n_ctx_(n_ctx), n_seq_(n_seq), favorite_(favorite),
        tables_(n_seq, n_ctx, n_seq * backend::kv_blocks_for(n_ctx)) {}
  std::string name() const override { return "recording"; }
  int n_ctx() const override { return n_ctx_; }
  int n_seq_max() const override { return n_seq_; }
  int n_vocab() const override { return n_vocab_; }
  int n_kv_blocks() const override { return tables_.n_blocks(); }
  uint64_t memory_bytes() const override { return 0; }
  void set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) override { tables_.set(seq, blocks, n_cached); }
  void copy_block(int32_t src, int32_t dst) override {
    tables_.check_block(src);
    tables_.check_block(dst);
  }
  void forward(const backend::Batch& batch, std::span<float> logits) override {
    tables_.check(batch, logits.size(), n_vocab_);
    tables_.advance(batch);
    {
      std::lock_guard lock(mutex_);
      batches_.push_back(batch);
    }
    std::fill(logits.begin(), logits.end(), 0.0f);
    for (size_t r = 0; r < batch.logits_count(); ++r) logits[r * n_vocab_ + favorite_] = 10.0f;
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  std::vector<backend::Batch> batches() const {
    std::lock_guard lock(mutex_);
    return batches_;
  }
  int delay_ms = 0;

 private:
  int n_vocab_, n_ctx_, n_seq_;
  int32_t favorite_;
  backend::BlockTables tables_;
  mutable std::mutex mutex_;
  std::vector<backend::Batch> batches_;
};

// The real backend, recording each batch. Its second forward (the first
// request's first decode step) waits until the test releases it, so the test
// can submit a request while that stream is sure to be generating.
class GatedRecordingBackend : public test::WrappedBackend {
 public:
  explicit GatedRecordingBackend(std::unique_ptr<backend::Backend> inner) : WrappedBackend(std::move(inner)) {}
  void forward(const backend::Batch& batch, std::span<float> logits) override {
    {
      std::lock_guard lock(mutex_);
      batches_.push_back(batch);
    }
    if (++forwards == 2) {
      for (int i = 0; i < 30000 && !released.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    inner().forward(batch, logits);
    if (after_forward) after_forward(batch);
  }
  backend::SliceSupport layer_slices() const override {
    return offers_slices ? WrappedBackend::layer_slices() : backend::SliceSupport{};
  }
  std::vector<backend::Batch> batches() const {
    std::lock_guard lock(mutex_);
    return batches_;
  }
  // Waits (up to 30 s) until the second forward is held at the gate.
  bool wait_at_gate() const {
    for (int i = 0; i < 30000 && forwards.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return forwards.load() == 2;
  }
  std::atomic<bool> released{true};
  std::atomic<int> forwards{0};
  bool offers_slices = true;  // false: as a backend without layer slices (the scheduler reads plain chunks)
  std::function<void(const backend::Batch&)> after_forward;  // on the engine thread, after each step ran

 private:
  mutable std::mutex mutex_;
  std::vector<backend::Batch> batches_;
};

using test::Collected;
using test::drain;
using test::greedy;

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = test::shared_model("TinyStories-656K-Q8_0.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared models not found";
    vocab_ = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_file(path.string()));
    favorite_ = vocab_->encode("the", {.add_special = false})[0];
  }
  // A prompt of `favorite` repeated, read whole every time (cache_prompt
  // off: these prompts all begin alike, and the tests that use them count
  // positions and steps of scheduling, not reuse).
  engine::RequestParams request(int prompt_tokens, int max_tokens) const {
    engine::RequestParams p;
    p.prompt.assign(static_cast<size_t>(prompt_tokens), favorite_);
    p.sampler.temperature = 0;
    p.max_tokens = max_tokens;
    p.cache_prompt = false;
    return p;
  }
  // The CPU engine on the TinyStories model, n_seq sequences.
  static engine::BackendOptions cpu_options(int n_seq) {
    engine::BackendOptions bo;
    bo.n_ctx = 512;
    bo.n_seq = n_seq;
    bo.threads = 2;
    bo.force_cpu = true;
    return bo;
  }
  // A story prompt of exactly `tokens` tokens.
  std::vector<int32_t> story_prompt(size_t tokens) const {
    std::vector<int32_t> prompt = vocab_->encode("Lily and Ben went to the park.", {.add_special = true});
    const auto sentence = vocab_->encode(" They played with a red ball and laughed in the sun.", {.add_special = false});
    while (prompt.size() < tokens) prompt.insert(prompt.end(), sentence.begin(), sentence.end());
    prompt.resize(tokens);
    return prompt;
  }
  // The texts of two requests answered one after the other by a scheduler
  // of their own.
  std::pair<std::string, std::string> answers_alone(const model::LoadedModel& model, const engine::BackendOptions& bo,
                                                    engine::RequestParams first, engine::RequestParams second) const {
    auto backend = engine::make_backend(model, bo);
    engine::Scheduler scheduler(*backend, *vocab_);
    std::string a = drain(*scheduler.submit(std::move(first))).text;
    return {std::move(a), drain(*scheduler.submit(std::move(second))).text};
  }
  // The paced tests' requests: a stream of 400 tokens and a 300-token story
  // prompt asked for 30, with each one's text alone (the long prompt then
  // read in one 256-token step), on the CPU engine of two slots.
  struct PacedCase {
    std::unique_ptr<model::LoadedModel> model;
    engine::BackendOptions bo;
    engine::RequestParams stream, answer;
    std::string alone_stream, alone_answer;
  };
  PacedCase paced_case() const {
    PacedCase c;
    c.model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
    c.bo = cpu_options(2);
    c.stream = greedy(vocab_->encode("Once upon a time", {.add_special = true}), 400);
    c.answer = greedy(story_prompt(300), 30);
    std::tie(c.alone_stream, c.alone_answer) = answers_alone(*c.model, c.bo, c.stream, c.answer);
    return c;
  }
  // The paced tests' run: `stream` first; once it generates (its first
  // decode step held at the gate), `next`; both read to their ends.
  static std::pair<Collected, Collected> stream_then(GatedRecordingBackend& backend, engine::Scheduler& scheduler,
                                                     engine::RequestParams stream, engine::RequestParams next) {
    backend.released = false;
    auto first = scheduler.submit(std::move(stream));
    EXPECT_TRUE(backend.wait_at_gate());
    auto second = scheduler.submit(std::move(next));
    backend.released = true;
    Collected a = drain(*first);
    return {std::move(a), drain(*second)};
  }
  std::unique_ptr<tokenizer::Vocab> vocab_;
  int32_t favorite_ = 0;
};

// For each step that decodes sequence 0 and reads prompt tokens (positions
// below prompt_length) of other sequences: how many.
std::vector<int> prompt_chunks_beside_stream(const std::vector<backend::Batch>& batches, int prompt_length) {
  std::vector<int> chunks;
  for (const auto& batch : batches) {
    int prompt_tokens = 0;
    bool decode = false;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch.seq_ids[i] != 0 && batch.positions[i] < prompt_length) ++prompt_tokens;
      if (batch.seq_ids[i] == 0) decode = true;
    }
    if (decode && prompt_tokens > 0) chunks.push_back(prompt_tokens);
  }
  return chunks;
}

}  // namespace

TEST_F(SchedulerTest, ALongPromptIsChunkedAndNeverStallsARunningStream) {
  RecordingBackend backend(static_cast<int>(vocab_->size()), 1024, 2, favorite_);
  backend.delay_ms = 1;
  engine::Scheduler scheduler(backend, *vocab_, {.max_queue = 4, .prefill_chunk = 64});
  auto running = scheduler.submit(request(5, 100));
  // Let the first stream start generating, then send a 600-token prompt.
  std::vector<engine::StreamEvent> first;
  ASSERT_TRUE(running->wait(std::chrono::seconds(10), first));
  auto long_prompt = scheduler.submit(request(600, 3));
  const auto a = drain(*running);
  const auto b = drain(*long_prompt);
  EXPECT_EQ(a.end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(a.end.timings.generated_tokens, 100);
  EXPECT_EQ(b.end.timings.generated_tokens, 3);
  EXPECT_EQ(b.end.timings.prompt_tokens, 600);

  // Every step while both were busy held one decode token of the running
  // stream and at most 64 prompt tokens.
  int mixed_steps = 0;
  for (const auto& batch : backend.batches()) {
    // Slot 0 holds the running stream (prompt 5), slot 1 the long prompt.
    int prompt_tokens = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch.positions[i] < (batch.seq_ids[i] == 0 ? 5 : 600)) ++prompt_tokens;
    }
    EXPECT_LE(prompt_tokens, 64);
    const bool has0 = std::count(batch.seq_ids.begin(), batch.seq_ids.end(), 0) > 0;
    const bool has1 = std::count(batch.seq_ids.begin(), batch.seq_ids.end(), 1) > 0;
    if (has0 && has1) ++mixed_steps;
  }
  EXPECT_GE(mixed_steps, 600 / 64);  // the long prompt's chunks rode along with decode tokens
  const auto stats = scheduler.stats();
  EXPECT_EQ(stats.requests_total, 2u);
  EXPECT_EQ(stats.generated_tokens, 103u);
  EXPECT_EQ(stats.prompt_tokens, 605u);
}

TEST_F(SchedulerTest, PositionsRestartForEachRequestInASlot) {
  RecordingBackend backend(static_cast<int>(vocab_->size()), 64, 1, favorite_);
  engine::Scheduler scheduler(backend, *vocab_);
  drain(*scheduler.submit(request(4, 2)));
  drain(*scheduler.submit(request(3, 2)));
  const auto batches = backend.batches();
  ASSERT_GE(batches.size(), 4u);
  // First request: prompt at 0..3, then one decode at 4. Second: prompt at 0..2.
  EXPECT_EQ(batches[0].positions, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(batches[1].positions, (std::vector<int32_t>{4}));
  EXPECT_EQ(batches[2].positions, (std::vector<int32_t>{0, 1, 2}));
}

// A pool of one block: the next request takes over the cached, partly
// filled block whose every position it continues (no copy, no second
// block) and feeds only what follows; one that shares only part of it
// would need a second block to copy into, so it reads its prompt whole
// rather than wait for a block that never comes.
TEST_F(SchedulerTest, ARequestTakesOverTheCachedBlockItContinues) {
  RecordingBackend backend(static_cast<int>(vocab_->size()), 16, 1, favorite_);
  engine::Scheduler scheduler(backend, *vocab_);
  auto cached = [&](int prompt_tokens, size_t* first_batch) {
    auto r = request(prompt_tokens, 3);
    r.cache_prompt = true;
    *first_batch = backend.batches().size();
    const auto done = drain(*scheduler.submit(std::move(r)));
    EXPECT_EQ(done.end.kind, engine::StreamEvent::Kind::Done);
    return done.end.timings.cached_tokens;
  };
  size_t first_batch = 0;
  EXPECT_EQ(cached(4, &first_batch), 0);  // feeds 4 + 2: the block holds 6 positions
  EXPECT_EQ(cached(8, &first_batch), 6);  // continues all 6
  EXPECT_EQ(backend.batches()[first_batch].positions, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(cached(3, &first_batch), 0);  // shares 2 of the block's 10 positions
  EXPECT_EQ(backend.batches()[first_batch].positions, (std::vector<int32_t>{0, 1, 2}));
}

TEST_F(SchedulerTest, LimitsAndContextEndTheAnswerWithLength) {
  RecordingBackend backend(static_cast<int>(vocab_->size()), 16, 1, favorite_);
  engine::Scheduler scheduler(backend, *vocab_);
  const auto limited = drain(*scheduler.submit(request(4, 5)));
  EXPECT_EQ(limited.end.finish_reason, engine::FinishReason::MaxTokens);
  EXPECT_EQ(limited.end.timings.generated_tokens, 5);
  const auto none = drain(*scheduler.submit(request(4, 0)));
  EXPECT_EQ(none.end.finish_reason, engine::FinishReason::MaxTokens);
  EXPECT_EQ(none.end.timings.generated_tokens, 0);
  EXPECT_TRUE(none.text.empty());
  const auto full = drain(*scheduler.submit(request(4, -1)));
  EXPECT_EQ(full.end.finish_reason, engine::FinishReason::ContextFull);
  EXPECT_EQ(full.end.timings.generated_tokens, 16 - 4 + 1);  // as engine::Generator: the last token is not fed
}

TEST_F(SchedulerTest, RefusesWhatCannotBeServed) {
  RecordingBackend backend(static_cast<int>(vocab_->size()), 32, 1, favorite_);
  backend.delay_ms = 20;
  engine::Scheduler scheduler(backend, *vocab_, {.max_queue = 1, .prefill_chunk = 256});
  using R = engine::RequestRejected::Reason;
  auto reason = [&](engine::RequestParams p) {
    try {
      scheduler.submit(std::move(p));
    } catch (const engine::RequestRejected& e) {
      return e.reason();
    }
    return static_cast<R>(-1);
  };
  EXPECT_EQ(reason(request(32, 1)), R::Invalid);  // no room for a new token
  EXPECT_EQ(reason(request(0, 1)), R::Invalid);
  auto bad_token = request(3, 1);
  bad_token.prompt[1] = static_cast<int32_t>(vocab_->size());
  EXPECT_EQ(reason(bad_token), R::Invalid);
  auto bad_sampler = request(3, 1);
  bad_sampler.sampler.repeat_penalty = -1;
  EXPECT_EQ(reason(bad_sampler), R::Invalid);

  auto a = scheduler.submit(request(3, 20));  // takes the slot
  auto b = scheduler.submit(request(3, 20));  // waits
  EXPECT_EQ(reason(request(3, 1)), R::QueueFull);
  a->cancel();
  b->cancel();
  EXPECT_EQ(drain(*a).end.finish_reason, engine::FinishReason::Cancelled);
  EXPECT_EQ(drain(*b).end.finish_reason, engine::FinishReason::Cancelled);
  EXPECT_EQ(drain(*scheduler.submit(request(3, 2))).end.timings.generated_tokens, 2);
  scheduler.stop();
  EXPECT_EQ(reason(request(3, 1)), R::ShuttingDown);
}

// A client that leaves while queued frees its place in the queue at once,
// not only when a slot would have taken it.
TEST_F(SchedulerTest, ACancelledQueuedRequestDoesNotHoldItsPlaceInTheQueue) {
  RecordingBackend backend(static_cast<int>(vocab_->size()), 8192, 1, favorite_);
  backend.delay_ms = 5;
  engine::Scheduler scheduler(backend, *vocab_, {.max_queue = 1, .prefill_chunk = 256});
  auto running = scheduler.submit(request(3, -1));  // about 40 s, until cancelled
  std::vector<engine::StreamEvent> first;
  ASSERT_TRUE(running->wait(std::chrono::seconds(10), first));  // it holds the only slot
  auto gone = scheduler.submit(request(3, 5));                   // fills the queue
  gone->cancel();
  std::shared_ptr<engine::RequestStream> next;
  try {
    next = scheduler.submit(request(3, 2));
  } catch (const engine::RequestRejected& e) {
    ADD_FAILURE() << "refused: " << e.what();
  }
  EXPECT_EQ(drain(*gone).end.finish_reason, engine::FinishReason::Cancelled);
  EXPECT_EQ(scheduler.stats().queue_depth, next ? 1 : 0);
  running->cancel();
  EXPECT_EQ(drain(*running).end.finish_reason, engine::FinishReason::Cancelled);
  if (next) {
    EXPECT_EQ(drain(*next).end.timings.generated_tokens, 2);
  }
  const auto stats = scheduler.stats();
  EXPECT_EQ(stats.requests_cancelled, 2u);
  EXPECT_EQ(stats.requests_rejected, 0u);
  EXPECT_EQ(stats.queue_depth, 0);
}

TEST_F(SchedulerTest, StopEndsRunningRequestsWithAnError) {
  RecordingBackend backend(static_cast<int>(vocab_->size()), 512, 1, favorite_);
  backend.delay_ms = 5;
  engine::Scheduler scheduler(backend, *vocab_);
  auto running = scheduler.submit(request(3, 400));
  std::vector<engine::StreamEvent> first;
  ASSERT_TRUE(running->wait(std::chrono::seconds(10), first));
  scheduler.stop();
  EXPECT_EQ(drain(*running).end.kind, engine::StreamEvent::Kind::Failed);
}

TEST_F(SchedulerTest, APacedLongPromptBesideAStreamAnswersAsAlone) {
  const PacedCase c = paced_case();

  // Together, with pacing on: the long prompt arrives while the stream
  // generates; this backend reads it in chunks of plain tokens (no layer
  // slices: the next test has them).
  GatedRecordingBackend backend(engine::make_backend(*c.model, c.bo));
  backend.offers_slices = false;
  engine::Scheduler scheduler(backend, *vocab_, {.max_queue = 4, .prefill_chunk = 256, .prefill_slowdown = 2.0});
  const auto [together_stream, together_answer] =
      stream_then(backend, scheduler, c.stream, c.answer);
  ASSERT_EQ(together_stream.end.kind, engine::StreamEvent::Kind::Done);
  ASSERT_EQ(together_answer.end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(together_stream.end.timings.generated_tokens, c.stream.max_tokens);
  EXPECT_EQ(together_answer.end.timings.generated_tokens, c.answer.max_tokens);
  EXPECT_EQ(together_answer.end.timings.prompt_tokens, 300);
  EXPECT_EQ(together_answer.text, c.alone_answer);
  EXPECT_EQ(together_stream.text, c.alone_stream);

  // The long prompt was read in several chunks beside the stream's decode
  // tokens, the first one the pacer's cautious start, not the 256 cap.
  const std::vector<int> chunks = prompt_chunks_beside_stream(backend.batches(), 300);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_LE(chunks.front(), 16);
  EXPECT_EQ(scheduler.stats().slice_steps, 0u);
}

// The same with layer slices: the pacer's budget of a few tokens through
// every layer becomes a larger chunk through a few layers a step (the
// model has two: one each), and the answers are those of each request alone.
TEST_F(SchedulerTest, APacedLongPromptIsReadInLayerSlicesAndAnswersAsAlone) {
  const PacedCase c = paced_case();

  GatedRecordingBackend backend(engine::make_backend(*c.model, c.bo));
  const int n_layer = backend.layer_slices().layers;
  ASSERT_EQ(n_layer, 2);
  engine::Scheduler scheduler(backend, *vocab_, {.max_queue = 4, .prefill_chunk = 256, .prefill_slowdown = 2.0});
  const auto [together_stream, together_answer] =
      stream_then(backend, scheduler, c.stream, c.answer);
  ASSERT_EQ(together_stream.end.kind, engine::StreamEvent::Kind::Done);
  ASSERT_EQ(together_answer.end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(together_answer.end.timings.prompt_tokens, 300);
  EXPECT_EQ(together_answer.text, c.alone_answer);
  EXPECT_EQ(together_stream.text, c.alone_stream);

  // Every slice step carried the stream's decode token; each chunk passed
  // layers 0 to n_layer in order, the first no larger than the pacer's
  // cautious start allows (16 tokens through both layers: 32 through one).
  int slice_steps = 0, chunks = 0, next_layer = 0, chunk_tokens = 0, first_chunk = 0;
  for (const auto& batch : backend.batches()) {
    if (batch.slice.tokens == 0) continue;
    ++slice_steps;
    EXPECT_EQ(std::count(batch.seq_ids.begin(), batch.seq_ids.end(), 0), 1);
    EXPECT_EQ(batch.slice.first_layer, next_layer);
    if (next_layer > 0) EXPECT_EQ(batch.slice.tokens, chunk_tokens);
    chunk_tokens = batch.slice.tokens;
    if (first_chunk == 0) first_chunk = chunk_tokens;
    next_layer = batch.slice.end_layer == n_layer ? 0 : batch.slice.end_layer;
    if (next_layer == 0) ++chunks;
  }
  EXPECT_EQ(next_layer, 0);  // no slice left in flight
  EXPECT_GE(chunks, 2);
  EXPECT_EQ(first_chunk, 32);
  EXPECT_EQ(scheduler.stats().slice_steps, static_cast<uint64_t>(slice_steps));
}

// A request cancelled while a chunk of its prompt is half way through the
// layers: the slice is dropped with the request's blocks, only the positions
// it had read through every layer are offered for reuse, and the same
// prompt asked again (reusing them) answers as alone.
TEST_F(SchedulerTest, ARequestCancelledMidSliceLeavesNothingHalfRead) {
  const PacedCase c = paced_case();
  GatedRecordingBackend backend(engine::make_backend(*c.model, c.bo));
  backend.released = false;
  engine::Scheduler scheduler(backend, *vocab_, {.max_queue = 4, .prefill_chunk = 256, .prefill_slowdown = 2.0});
  auto stream = scheduler.submit(c.stream);
  ASSERT_TRUE(backend.wait_at_gate());
  std::shared_ptr<engine::RequestStream> first = scheduler.submit(c.answer);
  // Cancelled after its second chunk has passed layer 0 only.
  int half_read_chunks = 0;
  backend.after_forward = [&](const backend::Batch& batch) {
    if (batch.slice.tokens > 0 && batch.slice.end_layer < 2 && ++half_read_chunks == 2) first->cancel();
  };
  backend.released = true;
  const auto cancelled = drain(*first);
  EXPECT_EQ(cancelled.end.finish_reason, engine::FinishReason::Cancelled);
  ASSERT_EQ(half_read_chunks, 2);
  const engine::SchedulerStats before = scheduler.stats();
  const auto again = drain(*scheduler.submit(c.answer));
  stream->cancel();
  drain(*stream);
  ASSERT_EQ(again.end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(again.text, c.alone_answer);
  // It reused what the first chunk had read through every layer (where
  // that chunk began: the positions the stream's prompt shares), not the
  // half-read second chunk.
  const auto batches = backend.batches();
  const auto first_slice = std::find_if(batches.begin(), batches.end(), [](const backend::Batch& b) { return b.slice.tokens > 0; });
  ASSERT_NE(first_slice, batches.end());
  const int read_through = first_slice->positions[first_slice->size() - first_slice->slice.tokens] + first_slice->slice.tokens;
  EXPECT_EQ(again.end.timings.cached_tokens, read_through);
  EXPECT_GT(scheduler.stats().slice_steps, before.slice_steps);
}

// Two prompts arrive while one stream generates: more requests wait than
// streams run, so the pacer stands aside and their first step carries the
// whole 256-token chunk (with one waiting prompt it would start at 16).
TEST_F(SchedulerTest, ABurstOfPromptsIsReadInWholeChunks) {
  auto model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
  const engine::BackendOptions bo = cpu_options(3);
  const auto long_prompt = story_prompt(300);

  GatedRecordingBackend backend(engine::make_backend(*model, bo));
  backend.released = false;
  engine::Scheduler scheduler(backend, *vocab_, {.max_queue = 4, .prefill_chunk = 256, .prefill_slowdown = 2.0});
  auto stream = scheduler.submit(greedy(vocab_->encode("Once upon a time", {.add_special = true}), 40));
  ASSERT_TRUE(backend.wait_at_gate());
  // Both wait in the queue while the stream's first decode step is held at
  // the gate; the scheduler takes both into slots before its next step.
  auto first = scheduler.submit(greedy(long_prompt, 5));
  auto second = scheduler.submit(greedy(long_prompt, 5));
  backend.released = true;
  EXPECT_EQ(drain(*stream).end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(drain(*first).end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(drain(*second).end.kind, engine::StreamEvent::Kind::Done);

  // The first step with the stream's decode token and prompt tokens.
  const std::vector<int> chunks = prompt_chunks_beside_stream(backend.batches(), 300);
  EXPECT_EQ(chunks.empty() ? 0 : chunks.front(), 256);
}

// A request whose own sampler fails (a penalty that overflows a logit to
// +inf) ends alone with the sampler's message; the stream batched beside it
// goes on and answers as it would alone.
TEST_F(SchedulerTest, ASamplerErrorEndsOnlyItsOwnRequest) {
  auto model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
  const engine::BackendOptions bo = cpu_options(2);
  const auto prompt = vocab_->encode("Once upon a time", {.add_special = true});
  const int stream_tokens = 40;
  std::string alone;
  {
    auto backend = engine::make_backend(*model, bo);
    engine::Scheduler scheduler(*backend, *vocab_);
    alone = drain(*scheduler.submit(greedy(prompt, stream_tokens))).text;
  }

  GatedRecordingBackend backend(engine::make_backend(*model, bo));
  backend.released = false;
  engine::Scheduler scheduler(backend, *vocab_);
  auto good = scheduler.submit(greedy(prompt, stream_tokens));
  ASSERT_TRUE(backend.wait_at_gate());  // the good stream generates
  // Every prompt token is in the window twice: 2 * -3e38 overflows to -inf,
  // and subtracting it turns those logits into +inf.
  std::vector<int32_t> twice = prompt;
  twice.insert(twice.end(), prompt.begin(), prompt.end());
  auto bad_params = greedy(twice, stream_tokens);
  bad_params.sampler.frequency_penalty = -3e38f;
  auto bad = scheduler.submit(std::move(bad_params));
  backend.released = true;

  const auto b = drain(*bad);
  const auto g = drain(*good);
  EXPECT_EQ(b.end.kind, engine::StreamEvent::Kind::Failed);
  EXPECT_NE(b.end.text.find("sampler: the logit of token"), std::string::npos) << b.end.text;
  EXPECT_EQ(b.end.timings.prompt_tokens, static_cast<int>(twice.size()));
  EXPECT_EQ(g.end.kind, engine::StreamEvent::Kind::Done) << g.end.text;
  EXPECT_EQ(g.end.timings.generated_tokens, stream_tokens);
  EXPECT_EQ(g.text, alone);
  // Both were in the same forward batch.
  const auto batches = backend.batches();
  EXPECT_TRUE(std::any_of(batches.begin(), batches.end(), [](const backend::Batch& batch) {
    return std::count(batch.seq_ids.begin(), batch.seq_ids.end(), 0) > 0 &&
           std::count(batch.seq_ids.begin(), batch.seq_ids.end(), 1) > 0;
  }));
  const auto stats = scheduler.stats();
  EXPECT_EQ(stats.requests_failed, 1u);
  EXPECT_EQ(stats.generated_tokens, static_cast<uint64_t>(stream_tokens));
}

// ---- prefix reuse and the paged KV pool --------------------------------------

namespace {

// What a request answers alone, reading its whole prompt.
std::string answer_alone(const model::LoadedModel& model, const engine::BackendOptions& bo, const tokenizer::Vocab& vocab,
                         engine::RequestParams p) {
  auto backend = engine::make_backend(model, bo);
  engine::Scheduler scheduler(*backend, vocab);
  p.cache_prompt = false;
  return drain(*scheduler.submit(std::move(p))).text;
}

}  // namespace

// The second turn of a chat begins with the first one's prompt: what the
// first turn fed is read from the cache as far as the second one's tokens
// agree (whole blocks of 16, then the positions of the partly filled last
// block, copied; the last prompt token always evaluated), and the answer is
// the one a full read gives.
TEST_F(SchedulerTest, ASecondTurnReadsOnlyWhatFollowsTheCachedPrefix) {
  auto model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
  const engine::BackendOptions bo = cpu_options(1);
  const auto turn1 = story_prompt(100), turn2 = story_prompt(150);
  ASSERT_TRUE(std::equal(turn1.begin(), turn1.end(), turn2.begin()));
  const std::string expected = answer_alone(*model, bo, *vocab_, greedy(turn2, 20));

  auto backend = engine::make_backend(*model, bo);
  engine::Scheduler scheduler(*backend, *vocab_);
  const auto first = drain(*scheduler.submit(greedy(turn1, 10)));
  EXPECT_EQ(first.end.timings.cached_tokens, 0);
  const auto second = drain(*scheduler.submit(greedy(turn2, 20)));
  ASSERT_EQ(second.end.kind, engine::StreamEvent::Kind::Done);
  // turn1's 100 tokens and 9 fed answer tokens: 6 whole blocks (96) and 13
  // positions of the seventh, of which turn2 shares at least turn1's last 4.
  const int cached = test::reusable_positions(test::fed_tokens(turn1, first.end), turn2);
  EXPECT_GE(cached, 100);
  EXPECT_EQ(second.end.timings.cached_tokens, cached);
  EXPECT_EQ(second.end.timings.prompt_tokens, 150);
  EXPECT_EQ(second.text, expected);
  const auto stats = scheduler.stats();
  EXPECT_EQ(stats.prompt_tokens_cached, static_cast<uint64_t>(cached));
  EXPECT_EQ(stats.prompt_tokens, 100u + 150u - static_cast<uint64_t>(cached));

  // cache_prompt: false reads it all again, and answers the same.
  auto again = greedy(turn2, 20);
  again.cache_prompt = false;
  const auto third = drain(*scheduler.submit(std::move(again)));
  EXPECT_EQ(third.end.timings.cached_tokens, 0);
  EXPECT_EQ(third.text, expected);
}

// A system prompt shared by a running request and a new one: the new one
// takes the running one's full blocks while it still holds them, and copies
// the shared positions of its partly filled prompt block.
TEST_F(SchedulerTest, ASharedPrefixIsReusedByAConcurrentRequest) {
  auto model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
  const engine::BackendOptions bo = cpu_options(2);
  const auto system = story_prompt(70);
  auto a_prompt = system, b_prompt = system;
  for (const char* text : {" Lily smiled.", " Ben ran home."}) {
    auto& prompt = text[1] == 'L' ? a_prompt : b_prompt;
    const auto more = vocab_->encode(text, {.add_special = false});
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  const std::string a_alone = answer_alone(*model, bo, *vocab_, greedy(a_prompt, 40));
  const std::string b_alone = answer_alone(*model, bo, *vocab_, greedy(b_prompt, 20));

  GatedRecordingBackend backend(engine::make_backend(*model, bo));
  backend.released = false;
  engine::Scheduler scheduler(backend, *vocab_);
  auto a = scheduler.submit(greedy(a_prompt, 40));
  ASSERT_TRUE(backend.wait_at_gate());  // a's prompt is read; it is generating
  auto b = scheduler.submit(greedy(b_prompt, 20));
  backend.released = true;
  const auto a_done = drain(*a), b_done = drain(*b);
  EXPECT_EQ(a_done.end.timings.cached_tokens, 0);
  // The system prompt's 4 whole blocks and its 6 more tokens (a's prompt,
  // as far as b's agrees with it).
  EXPECT_GE(b_done.end.timings.cached_tokens, 70);
  EXPECT_EQ(b_done.end.timings.cached_tokens, test::reusable_positions(a_prompt, b_prompt));
  EXPECT_EQ(a_done.text, a_alone);
  EXPECT_EQ(b_done.text, b_alone);
}

// Four conversations on two slots: each one's second turn still finds its
// first turn's blocks (whole and partly filled), cached after its slot went
// to another conversation.
TEST_F(SchedulerTest, MoreConversationsThanSlotsEachReuseTheirOwnBlocks) {
  auto model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
  auto backend = engine::make_backend(*model, cpu_options(2));
  engine::Scheduler scheduler(*backend, *vocab_);
  const char* openings[] = {"Tom had a dog.", "The sun was hot.", "A bird sang.", "Mia found a box."};
  std::vector<std::vector<int32_t>> first_turns;
  for (const char* opening : openings) {
    auto prompt = vocab_->encode(opening, {.add_special = true});
    const auto more = story_prompt(40);
    prompt.insert(prompt.end(), more.begin() + 1, more.end());  // without its BOS
    first_turns.push_back(prompt);
  }
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& p : first_turns) streams.push_back(scheduler.submit(greedy(p, 8)));
  std::vector<std::vector<int32_t>> fed;
  for (size_t i = 0; i < streams.size(); ++i) {
    const auto done = drain(*streams[i]);
    EXPECT_EQ(done.end.kind, engine::StreamEvent::Kind::Done);
    fed.push_back(test::fed_tokens(first_turns[i], done.end));
  }
  for (size_t i = 0; i < first_turns.size(); ++i) {
    auto second = first_turns[i];
    const auto more = vocab_->encode(" And then it rained.", {.add_special = false});
    second.insert(second.end(), more.begin(), more.end());
    const auto done = drain(*scheduler.submit(greedy(second, 4)));
    EXPECT_GE(done.end.timings.cached_tokens, static_cast<int>(first_turns[i].size()));
    EXPECT_EQ(done.end.timings.cached_tokens, test::reusable_positions(fed[i], second));
  }
}

// A pool too small for both answers: the younger request gives its blocks
// back and reads its tokens again later; both answers are what they are alone.
TEST_F(SchedulerTest, WhenThePoolRunsOutTheYoungestRequestWaitsAndResumes) {
  auto model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
  const auto a_prompt = story_prompt(40);
  auto b_prompt = vocab_->encode("Tom had a dog.", {.add_special = true});
  const auto more = story_prompt(40);
  b_prompt.insert(b_prompt.end(), more.begin() + 1, more.end());
  const engine::BackendOptions bo = cpu_options(2);
  const std::string a_alone = answer_alone(*model, bo, *vocab_, greedy(a_prompt, 80));
  const std::string b_alone = answer_alone(*model, bo, *vocab_, greedy(b_prompt, 80));

  // Each needs 8 blocks by its end (120 positions); the pool has 12.
  cpu::CpuBackend backend(model->hparams, model->weights, {.n_ctx = 512, .n_seq = 2, .kv_blocks = 12, .threads = 2});
  engine::Scheduler scheduler(backend, *vocab_);
  auto a = scheduler.submit(greedy(a_prompt, 80));
  auto b = scheduler.submit(greedy(b_prompt, 80));
  const auto a_done = drain(*a), b_done = drain(*b);
  ASSERT_EQ(a_done.end.kind, engine::StreamEvent::Kind::Done);
  ASSERT_EQ(b_done.end.kind, engine::StreamEvent::Kind::Done);
  EXPECT_EQ(a_done.end.timings.generated_tokens, 80);
  EXPECT_EQ(b_done.end.timings.generated_tokens, 80);
  EXPECT_EQ(a_done.text, a_alone);
  EXPECT_EQ(b_done.text, b_alone);
  EXPECT_GE(scheduler.stats().preemptions, 1u);

  // A prompt that needs more blocks than the whole pool is refused at once.
  EXPECT_THROW(scheduler.submit(greedy(story_prompt(200), 4)), engine::RequestRejected);
  // Alone, an answer ends when the pool holds no more of it.
  const auto alone = drain(*scheduler.submit(greedy(a_prompt, 500)));
  EXPECT_EQ(alone.end.finish_reason, engine::FinishReason::ContextFull);
  EXPECT_EQ(alone.end.timings.generated_tokens, 12 * 16 - 40 + 1);
}

// Every choice of a stream: its text and its end event (waits at most 30 s
// without an event).
struct Choices {
  std::vector<std::string> texts;
  std::vector<engine::StreamEvent> ends;
};
Choices drain_choices(engine::RequestStream& stream) {
  Choices out{std::vector<std::string>(static_cast<size_t>(stream.choices())),
              std::vector<engine::StreamEvent>(static_cast<size_t>(stream.choices()))};
  std::vector<engine::StreamEvent> events;
  for (int idle = 0; idle < 300 && !stream.finished();) {
    events.clear();
    if (!stream.wait(std::chrono::milliseconds(100), events)) {
      ++idle;
      continue;
    }
    for (auto& e : events) {
      EXPECT_GE(e.choice, 0);
      EXPECT_LT(e.choice, stream.choices());
      if (e.choice < 0 || e.choice >= stream.choices()) continue;
      if (e.kind == engine::StreamEvent::Kind::Text) out.texts[e.choice] += e.text;
      else out.ends[e.choice] = e;
    }
  }
  EXPECT_TRUE(stream.finished()) << "the stream did not end";
  return out;
}

// n answers to one prompt: the first reads it, the others fork its whole
// blocks and copy its partly filled last one; seeded choices differ and
// each repeats.
TEST_F(SchedulerTest, ChoicesForkTheFirstChoicesPromptBlocks) {
  auto model = model::LoadedModel::open(test::shared_model("TinyStories-656K-Q8_0.gguf").string());
  const engine::BackendOptions bo = cpu_options(2);
  const auto prompt = story_prompt(50);
  const std::string alone = answer_alone(*model, bo, *vocab_, greedy(prompt, 12));

  auto backend = engine::make_backend(*model, bo);
  engine::Scheduler scheduler(*backend, *vocab_);
  auto stream = scheduler.submit(greedy(prompt, 12), 3);  // three choices on two slots
  EXPECT_EQ(stream->choices(), 3);
  const Choices three = drain_choices(*stream);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(three.ends[c].kind, engine::StreamEvent::Kind::Done) << c;
    EXPECT_EQ(three.texts[c], alone) << c;  // greedy: every choice the same
  }
  EXPECT_EQ(three.ends[0].timings.cached_tokens, 0);
  // 3 whole blocks of the 50-token prompt and one copied position: all
  // but the last token, which a choice feeds itself.
  EXPECT_EQ(three.ends[1].timings.cached_tokens, 49);
  EXPECT_EQ(three.ends[2].timings.cached_tokens, 49);

  // Sampled with a seed: choices differ, and the request repeats exactly.
  auto sampled = greedy(prompt, 24);
  sampled.sampler.temperature = 1.0f;
  sampled.sampler.seed = 42;
  const auto first = drain_choices(*scheduler.submit(sampled, 2)).texts;
  EXPECT_NE(first[0], first[1]);
  EXPECT_EQ(drain_choices(*scheduler.submit(sampled, 2)).texts, first);
}

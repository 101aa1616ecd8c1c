// The server's engine loop: one thread owns the backend and interleaves many
// requests with continuous batching. Requests wait in a bounded queue, are
// admitted into free slots when the paged KV cache has room for their
// prompt (KvBlockPool: a prompt that begins like one seen before reuses its
// cached blocks and reads only the rest), and every step runs ONE forward batch that
// holds one decode token for each generating slot plus prompt chunks of the
// slots still reading their prompt (at most `prefill_chunk` prompt tokens per
// step, so a long prompt never stalls the running streams; while streams
// generate, a PrefillPacer sizes the chunks from measured step times so that
// those steps take at most about `prefill_slowdown` times a decode-only step,
// which keeps the streams' inter-token latency close to what it was). Each
// request has its own sampler, stop strings and token limit; its text goes to
// a thread-safe RequestStream that the HTTP handler thread reads. When the
// pool runs out of blocks mid-answer, the youngest request gives its blocks
// back and later reads its tokens again (its full blocks likely still
// cached), rather than any request failing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "common/error.h"
#include "engine/embedding_pooling.h"
#include "engine/generator.h"
#include "engine/kv_block_pool.h"
#include "engine/prefill_pacer.h"
#include "engine/sampler.h"
#include "tokenizer/vocab.h"

namespace m40::engine {

struct RequestParams {
  std::vector<int32_t> prompt;
  SamplerParams sampler;
  int max_tokens = -1;            // -1: until the context is full
  std::vector<std::string> stop;  // stop strings (not shown)
  bool ignore_eos = false;
  bool cache_prompt = true;       // false: read the whole prompt even where cached blocks hold its beginning
  int n_ctx = 0;                  // the most positions this request may use; 0 or more than the backend's: the backend's
  int logprobs = -1;              // >= 0: each answer token's log-probability and that many alternatives (TokenLoop)
  // Set: an embedding request, pooled this way (embedding_pooling.h). Its
  // prompt (which may fill the whole context) is read in forward steps of
  // its own, whose outputs are hidden states, never from cached blocks;
  // nothing is generated, and its Done event carries the pooled,
  // L2-normalized vector (StreamEvent::embedding). One choice only.
  std::optional<model::PoolingType> embed;
  AnswerGrammar grammar;          // constrained decoding (structured output, forced tool calls); each choice follows it
};

struct RequestTimings {
  int prompt_tokens = 0;        // the whole prompt
  int cached_tokens = 0;        // of those, read from cached KV blocks instead of evaluated
  double queue_seconds = 0;     // waiting for a slot
  double prompt_seconds = 0;    // from the first prompt chunk to the first logits
  int generated_tokens = 0;
  double generate_seconds = 0;  // from the first sampled token to the end
};

// One event of a request's stream: a piece of text, or the end of one of
// its choices (a request for n answers to one prompt has n).
struct StreamEvent {
  enum class Kind { Text, Done, Failed };
  Kind kind = Kind::Text;
  std::string text;      // Text: the piece; Failed: the error message
  FinishReason finish_reason = FinishReason::EndOfGeneration;  // Done
  RequestTimings timings;                                       // Done and Failed
  int choice = 0;        // which answer (0 .. n-1)
  // With RequestParams::logprobs: the tokens sampled since the previous
  // event of this choice, in order (Text; Done carries those whose text was
  // never shown, such as a stop string's).
  std::vector<TokenLogprob> logprobs;
  // Done of an embedding request (RequestParams::embed): its vector.
  std::vector<float> embedding;
  // Done of an answer: the tokens it generated (what was shown; an end
  // token is not among them), for Ollama's `context`.
  std::vector<int32_t> answer_tokens;

  static StreamEvent piece(std::string text) {
    StreamEvent e;
    e.text = std::move(text);
    return e;
  }
  static StreamEvent done(FinishReason reason, const RequestTimings& timings) {
    StreamEvent e;
    e.kind = Kind::Done;
    e.finish_reason = reason;
    e.timings = timings;
    return e;
  }
  static StreamEvent failed(std::string message, const RequestTimings& timings = {}) {
    StreamEvent e;
    e.kind = Kind::Failed;
    e.text = std::move(message);
    e.timings = timings;
    return e;
  }
};

// The per-request channel between the engine thread (writer) and the HTTP
// handler thread (reader), for all of a request's choices. Thread-safe.
class RequestStream {
 public:
  explicit RequestStream(int choices = 1) : ended_(static_cast<size_t>(choices), false) {}
  int choices() const { return static_cast<int>(ended_.size()); }
  // Waits up to `timeout` for events; moves every pending one into `out`.
  // Returns false when none came in time.
  bool wait(std::chrono::milliseconds timeout, std::vector<StreamEvent>& out);
  // Asks the engine to stop this request (every choice); its slots are freed
  // at the next step and Done events with FinishReason::Cancelled follow.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  bool finished() const;

  // Engine side. A choice's events after its Done or Failed are dropped;
  // the stream is finished when every choice has ended.
  void push(StreamEvent event);

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::vector<bool> ended_;  // per choice
  bool finished_ = false;
  std::atomic<bool> cancelled_{false};
};

// Why a request was refused before it was queued.
class RequestRejected : public Error {
 public:
  enum class Reason { Invalid, QueueFull, ShuttingDown };
  RequestRejected(Reason reason, const std::string& what) : Error(what), reason_(reason) {}
  Reason reason() const { return reason_; }

 private:
  Reason reason_;
};

struct SchedulerOptions {
  int max_queue = 16;       // requests waiting for a slot; more are refused (QueueFull)
  int prefill_chunk = 256;  // prompt tokens per step, over all slots
  // While streams generate, a step that also reads a prompt may take about
  // this many times as long as one that does not (PrefillPacer); 0: off,
  // every step takes up to prefill_chunk prompt tokens; up to 1: one prompt
  // token per step.
  double prefill_slowdown = 2.0;
};

struct SchedulerStats {
  uint64_t requests_total = 0;     // accepted into the queue
  uint64_t requests_rejected = 0;  // refused: queue full
  uint64_t requests_failed = 0;    // ended by an error: the backend's, or the request's own sampler's
  uint64_t requests_cancelled = 0;
  uint64_t prompt_tokens = 0;      // prompt tokens evaluated (re-read ones after a preemption included)
  uint64_t prompt_tokens_cached = 0;  // prompt tokens taken from cached KV blocks instead
  uint64_t preemptions = 0;        // requests that gave their KV blocks back to let others go on
  uint64_t generated_tokens = 0;
  uint64_t steps = 0;              // forward batches run
  uint64_t slice_steps = 0;        // of those, steps that read a prompt chunk through some of the layers (plan_slice)
  int queue_depth = 0;
  int slots_busy = 0;
  int slots_total = 0;
  int64_t kv_cells_used = 0;  // KV positions the running requests hold (after the last step)
  int kv_blocks_total = 0;    // the paged cache's pool
  int kv_blocks_used = 0;     // held by requests
  int kv_blocks_cached = 0;   // held by none, contents kept for reuse
};

class Scheduler {
 public:
  // Starts the engine thread. The backend and vocabulary must outlive it;
  // from now on only the engine thread calls the backend.
  Scheduler(backend::Backend& backend, const tokenizer::Vocab& vocab, SchedulerOptions options = {});
  ~Scheduler();  // stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request for `n` answers (choices) to its prompt: the first
  // reads the prompt, the others fork its KV blocks once it has (they share
  // every whole block and read at most the last partial one), each with
  // its own sampler (a fixed seed s gives choice i the seed s + i). Throws
  // RequestRejected: Invalid for an empty prompt, a
  // prompt that does not fit in the context or in the whole KV pool, a token out of range or bad
  // sampler parameters; QueueFull when max_queue requests already wait;
  // ShuttingDown after stop().
  std::shared_ptr<RequestStream> submit(RequestParams params, int n = 1);
  // Several prompts answered together (OpenAI completions with a list of
  // prompts): `n` choices to each, on one stream, prompt p's choice i as
  // choice p * n + i; all are queued or none.
  std::shared_ptr<RequestStream> submit(std::vector<RequestParams> prompts, int n);

  // Ends every request (Failed: "the server is shutting down") and joins the
  // engine thread. Idempotent.
  void stop();

  SchedulerStats stats() const;
  int n_ctx() const { return n_ctx_; }
  // The context a request gets: its own n_ctx, at most the backend's.
  int context_of(const RequestParams& params) const { return params.n_ctx > 0 ? std::min(params.n_ctx, n_ctx_) : n_ctx_; }
  int n_slots() const { return n_slots_; }

 private:
  struct Pending;
  struct Slot;
  void check_request(RequestParams& params, int n) const;  // RequestRejected::Invalid
  void loop();
  void admit(std::vector<std::unique_ptr<Slot>>& slots);  // mutex_ held
  bool take_blocks(Slot& slot);
  bool grow(Slot& slot, int positions, std::vector<std::unique_ptr<Slot>>& slots);
  // offer_partial: the K/V of its positions are sound (not after a failed
  // step), so its partly filled last block may be offered for copying.
  void give_back_blocks(Slot& slot, bool offer_partial = true);
  void publish_full_blocks(Slot& slot);
  // Offers the slot's partly filled last block (KvBlockPool::publish_partial).
  void offer_partial_block(Slot& slot);
  void step(std::vector<std::unique_ptr<Slot>>& slots);
  // This step's part of a layer slice (backend.h, LayerSlice): the slot
  // and how many layers its chunk passes; nothing when no prompt is read in
  // slices this step (the backend has none, pacing does not bind, or a
  // reference step).
  struct SliceStep {
    Slot* slot = nullptr;
    int layers = 0;
  };
  std::optional<SliceStep> plan_slice(const std::vector<Slot*>& by_age, int n_decode, int budget);
  // Embedding requests' prompt chunks go in steps of their own (their
  // outputs are hidden states): every step while nothing else runs, every
  // other step while requests also generate.
  bool embed_step_due(const std::vector<std::unique_ptr<Slot>>& slots);
  void embed_step(std::vector<std::unique_ptr<Slot>>& slots);
  std::optional<FinishReason> advance(Slot& slot, std::span<const float> logits);
  void finish(Slot& slot, FinishReason reason);
  void fail(Slot& slot, const std::string& message);
  void drop_cancelled_requests();  // mutex_ held

  backend::Backend& backend_;
  const tokenizer::Vocab& vocab_;
  SchedulerOptions options_;
  PrefillPacer pacer_;  // engine thread only
  int n_ctx_;
  int n_slots_;
  int n_vocab_;
  int n_embd_;  // the backend's hidden-state width (0: no embeddings)
  backend::SliceSupport slices_;  // the backend's layer slices (layers 0: none)
  KvBlockPool pool_;     // engine thread only
  uint64_t admitted_ = 0;  // engine thread only: admission order, for preemption
  bool embed_turn_ = false;  // engine thread only: whose turn it is when embeddings and generation both wait

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace m40::engine

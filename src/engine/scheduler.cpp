#include "engine/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "backends/kv_blocks.h"

namespace m40::engine {

using Clock = std::chrono::steady_clock;

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

// ---- RequestStream -------------------------------------------------------

bool RequestStream::wait(std::chrono::milliseconds timeout, std::vector<StreamEvent>& out) {
  std::unique_lock lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

void RequestStream::push(StreamEvent event) {
  {
    std::lock_guard lock(mutex_);
    const size_t choice = static_cast<size_t>(event.choice);
    if (finished_ || choice >= ended_.size() || ended_[choice]) return;
    if (event.kind != StreamEvent::Kind::Text) {
      ended_[choice] = true;
      finished_ = std::all_of(ended_.begin(), ended_.end(), [](bool e) { return e; });
    }
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

// ---- Scheduler -------------------------------------------------------------

struct Scheduler::Pending {
  RequestParams params;
  std::unique_ptr<TokenLoop> loop;  // sampling, the end checks and the text shown
  std::shared_ptr<RequestStream> stream;
  int choice = 0;
  // Choices after the first of their prompt wait until it has read the
  // prompt (its blocks are then in the pool to fork); engine thread only.
  bool forks = false;
  std::shared_ptr<bool> prompt_read;
  // An event of this choice.
  void push(StreamEvent e) const {
    e.choice = choice;
    stream->push(std::move(e));
  }
  Clock::time_point queued_at;
};

struct Scheduler::Slot {
  Slot(std::unique_ptr<Pending> p, int seq_id, uint64_t admission)
      : request(std::move(p)),
        seq(seq_id),
        order(admission),
        tokens(request->params.prompt) {}

  // Tokens still to feed: the prompt's rest while reading, one sampled
  // token while decoding.
  int pending() const { return static_cast<int>(tokens.size()) - n_kv; }
  // Generating: each step feeds the last sampled token (not a prompt being
  // read, nor tokens read again after a preemption).
  bool decoding() const { return answered && pending() == 1; }

  std::unique_ptr<Pending> request;
  int seq;
  uint64_t order;                 // admission order: the youngest gives its blocks back first
  std::vector<int32_t> tokens;    // the prompt, then each sampled token
  int n_kv = 0;                   // positions whose K and V are cached (tokens[0..n_kv) fed)
  std::vector<int32_t> blocks;    // its block table, held in the pool
  std::vector<uint64_t> hashes;   // chain hashes of its first hashes.size() blocks (full, published)
  bool has_blocks = false;        // false: preempted (or not yet placed), waiting for room
  bool answered = false;          // the first logits came (the prompt was read once)
  std::vector<TokenLogprob> held_logprobs;  // sampled tokens whose text is still held back
  RequestTimings timings;
  Clock::time_point prompt_start{};
  Clock::time_point generate_start{};
  bool prompt_started = false;
  int logits_row = -1;  // this step's row of logits, -1 if none
  // A layer slice in flight (backend.h, LayerSlice): the prompt tokens from
  // n_kv it carries and the next layer they pass; 0 tokens: none.
  int slice_tokens = 0;
  int slice_next_layer = 0;
  bool done = false;
  // An embedding request (RequestParams::embed): its pooling so far (made
  // anew whenever its prompt is read from the start), then its vector.
  bool embeds() const { return request->params.embed.has_value(); }
  std::optional<EmbeddingPooler> pooler;
  std::vector<float> embedding;
};

Scheduler::Scheduler(backend::Backend& backend, const tokenizer::Vocab& vocab, SchedulerOptions options)
    : backend_(backend),
      vocab_(vocab),
      options_(options),
      pacer_(options.prefill_chunk, options.prefill_slowdown),
      n_ctx_(backend.n_ctx()),
      n_slots_(backend.n_seq_max()),
      n_vocab_(backend.n_vocab()),
      n_embd_(backend.n_embd()),
      slices_(backend.layer_slices()),
      pool_(backend.n_kv_blocks()) {
  if (static_cast<size_t>(n_vocab_) < vocab.size()) {
    throw Error("the tokenizer has " + std::to_string(vocab.size()) + " tokens but the model only " +
                std::to_string(n_vocab_));
  }
  options_.max_queue = std::max(0, options_.max_queue);
  stats_.kv_blocks_total = pool_.n_blocks();
  options_.prefill_chunk = std::max(1, options_.prefill_chunk);
  stats_.slots_total = n_slots_;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<RequestStream> Scheduler::submit(RequestParams params, int n) {
  std::vector<RequestParams> one;
  one.push_back(std::move(params));
  return submit(std::move(one), n);
}

void Scheduler::check_request(RequestParams& params, int n) const {
  using R = RequestRejected::Reason;
  const int n_prompt = static_cast<int>(params.prompt.size());
  if (n_prompt == 0) throw RequestRejected(R::Invalid, "the prompt is empty");
  if (n < 1) throw RequestRejected(R::Invalid, "a request needs at least one choice");
  if (params.embed) {
    if (n != 1) throw RequestRejected(R::Invalid, "an embedding request has one choice");
    if (n_embd_ <= 0) throw RequestRejected(R::Invalid, "the " + backend_.name() + " backend gives no hidden states for embeddings");
    try {
      EmbeddingPooler(*params.embed, n_embd_, n_prompt);  // the pooling is one it can do
    } catch (const Error& e) {
      throw RequestRejected(R::Invalid, e.what());
    }
    params.cache_prompt = false;  // mean and CLS pooling need every token's hidden state
  }
  // An answer needs room for one new token; an embedding only for its prompt.
  const int room = params.embed ? 0 : 1;
  if (const int context = context_of(params); n_prompt + room > context) {
    throw RequestRejected(R::Invalid, "the prompt has " + std::to_string(n_prompt) +
                                          " tokens but the context holds " + std::to_string(context) +
                                          (params.embed ? "" : " (leaving room for at least one new token)") +
                                          ": shorten the prompt or start the server with a larger --ctx");
  }
  // n_blocks() is fixed at construction: safe to read from any thread.
  if (backend::kv_blocks_for(n_prompt + room) > pool_.n_blocks()) {
    throw RequestRejected(R::Invalid, "the prompt needs " + std::to_string(backend::kv_blocks_for(n_prompt + room)) +
                                          " KV blocks of " + std::to_string(backend::kKvBlockSize) +
                                          " positions but the whole pool has " + std::to_string(pool_.n_blocks()) +
                                          ": shorten the prompt or give the server a larger KV pool");
  }
}

std::shared_ptr<RequestStream> Scheduler::submit(std::vector<RequestParams> prompts, int n) {
  using R = RequestRejected::Reason;
  if (prompts.empty()) throw RequestRejected(R::Invalid, "the request has no prompt");
  for (auto& params : prompts) check_request(params, n);
  const int total = static_cast<int>(prompts.size()) * n;
  auto stream = std::make_shared<RequestStream>(total);
  std::vector<std::unique_ptr<Pending>> choices;
  try {
    for (size_t p = 0; p < prompts.size(); ++p) {
      const RequestParams& params = prompts[p];
      for (int32_t t : params.prompt) vocab_.check_id(t);
      auto prompt_read = std::make_shared<bool>(false);
      for (int i = 0; i < n; ++i) {
        auto pending = std::make_unique<Pending>();
        pending->params = params;
        // Choices of a fixed seed differ, and repeat as a whole.
        if (i > 0 && params.sampler.seed != kRandomSeed) pending->params.sampler.seed = params.sampler.seed + static_cast<uint64_t>(i);
        // The prompt is in the penalty window, as in llama.cpp's server and Generator.
        pending->loop = std::make_unique<TokenLoop>(vocab_, pending->params.sampler, n_vocab_,
                                                    AnswerLimits{params.max_tokens, params.stop, params.ignore_eos}, params.prompt,
                                                    params.logprobs, params.grammar);
        pending->stream = stream;
        pending->choice = static_cast<int>(p) * n + i;
        pending->prompt_read = prompt_read;
        pending->forks = i > 0;
        pending->queued_at = Clock::now();
        choices.push_back(std::move(pending));
      }
    }
  } catch (const Error& e) {
    throw RequestRejected(R::Invalid, e.what());
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw RequestRejected(R::ShuttingDown, "the server is shutting down");
    // Clients that left while waiting must not keep live ones out.
    drop_cancelled_requests();
    // A request waits only when every slot is taken; the queue bound counts
    // the ones waiting beyond those being served.
    if (static_cast<int>(queue_.size()) + total > options_.max_queue + (n_slots_ - stats_.slots_busy)) {
      ++stats_.requests_rejected;
      throw RequestRejected(R::QueueFull, "the server is busy: " + std::to_string(queue_.size()) +
                                              " requests are waiting; try again later");
    }
    for (auto& c : choices) queue_.push_back(std::move(c));
    ++stats_.requests_total;
    stats_.queue_depth = static_cast<int>(queue_.size());
  }
  cv_.notify_all();
  return stream;
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Scheduler::finish(Slot& slot, FinishReason reason) {
  // Ended from outside (the answer's own end came with its text in
  // advance()): release what is held back (a cancelled answer may be kept
  // as far as it got, as the CLI chat keeps it).
  std::string rest = slot.request->loop->finish();
  if (!rest.empty()) {
    StreamEvent piece = StreamEvent::piece(std::move(rest));
    piece.logprobs = std::move(slot.held_logprobs);
    slot.held_logprobs.clear();
    slot.request->push(std::move(piece));
  }
  *slot.request->prompt_read = true;  // the other choices need not wait for it any more
  if (slot.answered) slot.timings.generate_seconds = seconds_between(slot.generate_start, Clock::now());
  slot.done = true;
  give_back_blocks(slot);
  {
    // The slot is free for the next submit before its client hears of the
    // end (a client that submits again at once is not refused).
    std::lock_guard lock(mutex_);
    stats_.slots_busy = std::max(0, stats_.slots_busy - 1);
    if (reason == FinishReason::Cancelled) ++stats_.requests_cancelled;
  }
  StreamEvent done = StreamEvent::done(reason, slot.timings);
  done.logprobs = std::move(slot.held_logprobs);
  done.embedding = std::move(slot.embedding);
  if (slot.request->loop) done.answer_tokens = slot.request->loop->tokens();
  slot.request->push(std::move(done));
}

// One request's own failure (its sampler, its text): it ends alone, the
// others in the step go on.
void Scheduler::fail(Slot& slot, const std::string& message) {
  std::fprintf(stderr, "m40-llm: request failed: %s\n", message.c_str());
  *slot.request->prompt_read = true;
  slot.done = true;
  give_back_blocks(slot);
  {
    std::lock_guard lock(mutex_);
    ++stats_.requests_failed;
    stats_.slots_busy = std::max(0, stats_.slots_busy - 1);
  }
  slot.request->push(StreamEvent::failed(message, slot.timings));
}

// ---- the KV blocks of a slot ----------------------------------------------------

// Places a slot's tokens in the pool: the longest cached prefix of whole
// blocks, then the positions a partly filled block on offer shares with the
// tokens after it (copied into the slot's own next block), always leaving
// at least one token to feed (its logits come next), then fresh blocks for
// the rest. False, holding nothing, when the pool has no room for them.
bool Scheduler::take_blocks(Slot& slot) {
  constexpr int B = backend::kKvBlockSize;
  const int n = static_cast<int>(slot.tokens.size());
  KvBlockPool::Prefix prefix;
  std::optional<KvBlockPool::PartialMatch> partial;
  if (slot.request->params.cache_prompt) {
    prefix = pool_.acquire_prefix(slot.tokens, (n - 1) / B);
    const int whole = static_cast<int>(prefix.blocks.size());
    const int reusable = std::min(B, n - 1 - whole * B);
    if (reusable > 0) {
      const uint64_t parent = whole == 0 ? KvBlockPool::kRootHash : prefix.hashes.back();
      partial = pool_.match_partial(parent, std::span(slot.tokens).subspan(static_cast<size_t>(whole) * B, reusable));
    }
  }
  // A cached block the tokens continue whole becomes the slot's own (no
  // copy, no extra block); any other is copied into a fresh block (copy on
  // write), unless that fresh block is what the pool lacks.
  const bool adopted = partial && partial->can_take_over;
  if (adopted) pool_.take_over(partial->block);
  const int need = backend::kv_blocks_for(n) - static_cast<int>(prefix.blocks.size()) - (adopted ? 1 : 0);
  if (partial && !adopted && need > pool_.available()) {
    pool_.release(partial->block);
    partial.reset();
  }
  if (need > pool_.available()) {
    for (int32_t b : prefix.blocks) pool_.release(b);
    if (partial) pool_.release(partial->block);
    return false;
  }
  slot.blocks = std::move(prefix.blocks);
  slot.hashes = std::move(prefix.hashes);
  if (adopted) slot.blocks.push_back(partial->block);
  for (int i = 0; i < need; ++i) slot.blocks.push_back(*pool_.allocate());
  slot.n_kv = static_cast<int>(slot.hashes.size()) * B;
  if (partial) {
    if (!adopted) {
      backend_.copy_block(partial->block, slot.blocks[slot.hashes.size()]);
      pool_.release(partial->block);
    }
    slot.n_kv += partial->length;
  }
  slot.has_blocks = true;
  backend_.set_blocks(slot.seq, slot.blocks, slot.n_kv);
  return true;
}

// Makes room for `positions` positions in the slot's blocks. When the pool
// is out, the youngest slot holding blocks gives them back (preemption): it
// may be this one, which then holds none and waits (false). A slot alone in
// a pool that holds no more of it keeps its blocks (false, has_blocks).
bool Scheduler::grow(Slot& slot, int positions, std::vector<std::unique_ptr<Slot>>& slots) {
  while (static_cast<int>(slot.blocks.size()) * backend::kKvBlockSize < positions) {
    if (auto b = pool_.allocate()) {
      slot.blocks.push_back(*b);
      backend_.set_blocks(slot.seq, slot.blocks, slot.n_kv);
      continue;
    }
    Slot* youngest = nullptr;
    bool others = false;
    for (auto& s : slots) {
      if (!s || !s->has_blocks || s->done) continue;
      others = others || s.get() != &slot;
      if (youngest == nullptr || s->order > youngest->order) youngest = s.get();
    }
    if (!others) return false;
    give_back_blocks(*youngest);
    {
      std::lock_guard lock(mutex_);
      ++stats_.preemptions;
    }
    if (youngest == &slot) return false;
  }
  return true;
}

// Returns the slot's blocks to the pool (full ones stay cached for reuse,
// its own included when it comes back, and its partly filled last one on
// offer) and forgets its cached positions.
void Scheduler::give_back_blocks(Slot& slot, bool offer_partial) {
  if (offer_partial && slot.has_blocks) offer_partial_block(slot);
  for (int32_t b : slot.blocks) pool_.release(b);
  slot.blocks.clear();
  slot.hashes.clear();
  slot.n_kv = 0;
  slot.slice_tokens = 0;  // a slice in flight is lost with the positions it wrote
  if (slot.has_blocks) backend_.set_blocks(slot.seq, {}, 0);
  slot.has_blocks = false;
}

// Indexes the blocks a step filled, so that later sequences can share them.
void Scheduler::publish_full_blocks(Slot& slot) {
  constexpr int B = backend::kKvBlockSize;
  for (int b = static_cast<int>(slot.hashes.size()); (b + 1) * B <= slot.n_kv; ++b) {
    const uint64_t parent = b == 0 ? KvBlockPool::kRootHash : slot.hashes[b - 1];
    slot.hashes.push_back(pool_.publish(slot.blocks[b], parent, std::span(slot.tokens).subspan(static_cast<size_t>(b) * B, B)));
  }
}

void Scheduler::offer_partial_block(Slot& slot) {
  constexpr int B = backend::kKvBlockSize;
  const int whole = slot.n_kv / B;
  // Only after every whole block before it (a chain hash names its prefix).
  if (slot.n_kv % B == 0 || static_cast<int>(slot.hashes.size()) != whole ||
      whole >= static_cast<int>(slot.blocks.size())) {
    return;
  }
  const uint64_t parent = whole == 0 ? KvBlockPool::kRootHash : slot.hashes.back();
  pool_.publish_partial(slot.blocks[whole], parent,
                        std::span(slot.tokens).subspan(static_cast<size_t>(whole) * B, slot.n_kv % B));
}

void Scheduler::drop_cancelled_requests() {
  std::erase_if(queue_, [&](const std::unique_ptr<Pending>& p) {
    if (!p->stream->cancelled()) return false;
    p->push(StreamEvent::done(FinishReason::Cancelled, {}));
    ++stats_.requests_cancelled;
    return true;
  });
  stats_.queue_depth = static_cast<int>(queue_.size());
}

// Preempted slots get their blocks back first, oldest first; then waiting
// requests enter free slots, oldest first, while the pool has room for
// their prompts. (One cancelled from now on is freed below, before any work
// is spent on it.)
void Scheduler::admit(std::vector<std::unique_ptr<Slot>>& slots) {
  std::vector<Slot*> waiting;
  for (auto& s : slots) {
    if (s && !s->has_blocks) waiting.push_back(s.get());
  }
  std::sort(waiting.begin(), waiting.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
  for (Slot* s : waiting) {
    if (s->request->stream->cancelled()) continue;  // freed below
    if (!take_blocks(*s)) return;
  }
  for (int i = 0; i < n_slots_ && !queue_.empty(); ++i) {
    if (slots[i]) continue;
    // A later choice waits for the first to read the prompt, then forks it.
    if (queue_.front()->forks && !*queue_.front()->prompt_read) return;
    auto slot = std::make_unique<Slot>(std::move(queue_.front()), i, admitted_);
    if (!take_blocks(*slot)) {
      queue_.front() = std::move(slot->request);  // still first in line
      return;
    }
    queue_.pop_front();
    ++admitted_;
    slot->timings.prompt_tokens = static_cast<int>(slot->tokens.size());
    slot->timings.cached_tokens = slot->n_kv;
    slot->timings.queue_seconds = seconds_between(slot->request->queued_at, Clock::now());
    stats_.prompt_tokens_cached += static_cast<uint64_t>(slot->n_kv);
    slots[i] = std::move(slot);
  }
}

void Scheduler::loop() {
  std::vector<std::unique_ptr<Slot>> slots(n_slots_);
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] {
        if (stopping_ || !queue_.empty()) return true;
        return std::any_of(slots.begin(), slots.end(), [](const auto& s) { return s != nullptr; });
      });
      if (stopping_) break;
      drop_cancelled_requests();
      admit(slots);
      stats_.queue_depth = static_cast<int>(queue_.size());
      stats_.slots_busy = static_cast<int>(std::count_if(slots.begin(), slots.end(), [](const auto& s) { return s != nullptr; }));
    }
    // A disconnected client's slot is freed before any work is spent on it.
    for (auto& s : slots) {
      if (s && s->request->stream->cancelled()) finish(*s, FinishReason::Cancelled);
      if (s && s->done) s.reset();
    }
    if (std::none_of(slots.begin(), slots.end(), [](const auto& s) { return s != nullptr; })) {
      std::lock_guard lock(mutex_);
      stats_.slots_busy = 0;  // the last slots were cancelled: no step will count them
      stats_.kv_cells_used = 0;
      continue;
    }
    try {
      step(slots);
    } catch (const std::exception& e) {
      // A backend failure ends the requests of this step, not the server.
      std::fprintf(stderr, "m40-llm: forward step failed: %s\n", e.what());
      for (auto& s : slots) {
        if (!s) continue;
        give_back_blocks(*s, false);  // what the failed step wrote is not offered
        {
          std::lock_guard lock(mutex_);
          ++stats_.requests_failed;
          stats_.slots_busy = std::max(0, stats_.slots_busy - 1);
        }
        s->request->push(StreamEvent::failed(e.what(), s->timings));
        s.reset();
      }
    }
    for (auto& s : slots) {
      if (s && s->done) s.reset();
    }
    std::lock_guard lock(mutex_);
    stats_.slots_busy = static_cast<int>(std::count_if(slots.begin(), slots.end(), [](const auto& s) { return s != nullptr; }));
    stats_.kv_cells_used = 0;
    for (const auto& s : slots) {
      if (s) stats_.kv_cells_used += s->n_kv;
    }
    stats_.kv_blocks_used = pool_.in_use();
    stats_.kv_blocks_cached = pool_.cached();
  }
  // Shutting down: end everything still running or waiting.
  const StreamEvent bye = StreamEvent::failed("the server is shutting down");
  for (auto& s : slots) {
    if (s) s->request->push(bye);
  }
  std::lock_guard lock(mutex_);
  for (auto& p : queue_) p->push(bye);
  queue_.clear();
  stats_.queue_depth = 0;
  stats_.slots_busy = 0;
  stats_.kv_cells_used = 0;
}

void Scheduler::step(std::vector<std::unique_ptr<Slot>>& slots) {
  if (embed_step_due(slots)) return embed_step(slots);
  // Room for each generating slot's next position, oldest first, so that
  // when the pool is out the youngest gives its blocks back.
  std::vector<Slot*> by_age;
  for (auto& s : slots) {
    if (s && s->has_blocks) by_age.push_back(s.get());
  }
  std::sort(by_age.begin(), by_age.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
  for (Slot* s : by_age) {
    if (!s->has_blocks || s->done || !s->decoding()) continue;
    // Alone and the pool holds no more of it: its context is what the pool holds.
    if (!grow(*s, s->n_kv + 1, slots) && s->has_blocks) finish(*s, FinishReason::ContextFull);
  }

  backend::Batch batch;
  int rows = 0;
  uint64_t prompt_tokens = 0;
  int n_decode = 0;
  int n_waiting = 0;  // slots whose prompt is not read yet (not the queue: pacing does not change its wait)
  std::vector<std::pair<Slot*, int>> fed;  // slots and the tokens this step gives them
  // Decode tokens first: every generating slot advances by one each step.
  for (auto& s : slots) {
    if (!s) continue;
    s->logits_row = -1;
    if (!s->has_blocks || s->done || s->embeds()) continue;
    if (s->decoding()) {
      batch.add(s->tokens.back(), s->n_kv, s->seq, true);
      s->logits_row = rows++;
      fed.emplace_back(s.get(), 1);
      ++n_decode;
    } else {
      ++n_waiting;
    }
  }
  // Then prompt chunks, oldest slot first, within the step's prompt budget:
  // what the pacer allows beside these decode tokens (prefill_chunk when
  // none run, pacing is off or more requests wait than streams run; 0 on a
  // step that re-measures the streams alone). A slot preempted while it
  // generated reads its tokens again the same way.
  int budget = pacer_.budget(n_decode, n_waiting);
  const auto now = Clock::now();
  int prompt_load = 0;  // prompt tokens as the pacer counts them (a slice's: its share of the layers)
  Slot* sliced = nullptr;
  if (const std::optional<SliceStep> slice = plan_slice(by_age, n_decode, budget)) {
    sliced = slice->slot;
    Slot& s = *sliced;
    if (!s.prompt_started) {
      s.prompt_started = true;
      s.prompt_start = now;
    }
    const int end_layer = s.slice_next_layer + slice->layers;
    for (int i = 0; i < s.slice_tokens; ++i) {
      const int p = s.n_kv + i;
      const bool last = p + 1 == static_cast<int>(s.tokens.size()) && end_layer == slices_.layers;
      batch.add(s.tokens[p], p, s.seq, last);
      if (last) s.logits_row = rows++;
    }
    batch.slice = {s.slice_tokens, s.slice_next_layer, end_layer};
    prompt_load = std::max(1, s.slice_tokens * slice->layers / slices_.layers);
    budget = 0;  // the slice is this step's prompt work
  }
  for (Slot* s : by_age) {
    if (!s->has_blocks || s->done || s->decoding() || s->embeds() || budget == 0) continue;
    const int n_tokens = static_cast<int>(s->tokens.size());
    const int n = std::min(budget, s->pending());
    if (!s->prompt_started) {
      s->prompt_started = true;
      s->prompt_start = now;
    }
    for (int i = 0; i < n; ++i) {
      const int p = s->n_kv + i;
      const bool last = p + 1 == n_tokens;
      batch.add(s->tokens[p], p, s->seq, last);
      if (last) s->logits_row = rows++;
    }
    fed.emplace_back(s, n);
    budget -= n;
    prompt_tokens += static_cast<uint64_t>(n);
    prompt_load += n;
  }
  if (batch.size() == 0) return;
  std::vector<float> logits(static_cast<size_t>(rows) * static_cast<size_t>(n_vocab_));
  const auto forward_start = Clock::now();
  backend_.forward(batch, logits);
  const auto after = Clock::now();
  if (sliced != nullptr) {
    // Its chunk is read once it has passed the last layer.
    sliced->slice_next_layer = batch.slice.end_layer;
    if (batch.slice.end_layer == slices_.layers) {
      fed.emplace_back(sliced, sliced->slice_tokens);
      prompt_tokens += static_cast<uint64_t>(sliced->slice_tokens);
      sliced->slice_tokens = 0;
    }
  }
  for (auto [s, n] : fed) s->n_kv += n;
  for (auto& s : slots) {
    if (s && s->has_blocks) publish_full_blocks(*s);
  }

  uint64_t generated = 0;
  // Requests that end this step; their Done events go out after the counters
  // are updated, so a client that sees the end also sees it counted.
  std::vector<std::pair<Slot*, FinishReason>> ended;
  std::vector<std::pair<Slot*, std::string>> failed;
  for (auto& s : slots) {
    if (!s || s->logits_row < 0) continue;
    Slot& slot = *s;
    if (!slot.answered) {
      slot.timings.prompt_seconds = seconds_between(slot.prompt_start, after);
      slot.answered = true;
      slot.generate_start = after;
      // Its blocks are in the pool now (the whole ones indexed, the partly
      // filled one on offer): the other choices may fork them.
      offer_partial_block(slot);
      *slot.request->prompt_read = true;
    }
    const int generated_before = slot.timings.generated_tokens;
    // A request's own sampler may throw (a penalty that overflows a logit):
    // that ends this request, not the batch.
    try {
      std::span<const float> row(logits.data() + static_cast<size_t>(slot.logits_row) * n_vocab_,
                                 static_cast<size_t>(n_vocab_));
      if (auto reason = advance(slot, row)) ended.emplace_back(&slot, *reason);
    } catch (const std::exception& e) {
      failed.emplace_back(&slot, e.what());
    }
    generated += static_cast<uint64_t>(slot.timings.generated_tokens - generated_before);
  }
  // The streams wait for the forward and the sampling alike.
  pacer_.record(n_decode, prompt_load, seconds_between(forward_start, Clock::now()));
  {
    std::lock_guard lock(mutex_);
    ++stats_.steps;
    if (sliced != nullptr) ++stats_.slice_steps;
    stats_.prompt_tokens += prompt_tokens;
    stats_.generated_tokens += generated;
  }
  for (auto& [slot, message] : failed) fail(*slot, message);
  for (auto [slot, reason] : ended) {
    try {
      finish(*slot, reason);
    } catch (const std::exception& e) {
      fail(*slot, e.what());
    }
  }
}

// A prompt is read in layer slices where the pacer holds its chunk below
// what the prompt and --prefill-chunk would take: a chunk of up to
// prefill_chunk tokens less the decode tokens passes a few layers a step,
// as many as the pacer's budget pays for (budget tokens through every
// layer cost about as much as budget x n_layer / chunk layers of the
// chunk, more on a GPU, where a few tokens run far below the prefill
// kernels' rate), until it has passed them all. One slice runs at a time:
// the oldest slot reading a prompt starts it, and it goes on, if more
// slowly (0 layers on the pacer's reference steps), whatever the budget
// does next; the rest of the layers in one step once pacing stops (no
// stream left, or a burst of requests).
std::optional<Scheduler::SliceStep> Scheduler::plan_slice(const std::vector<Slot*>& by_age, int n_decode, int budget) {
  const int n_layer = slices_.layers;
  if (n_layer < 2 || budget == 0) return std::nullopt;
  Slot* slot = nullptr;
  for (Slot* s : by_age) {
    if (!s->has_blocks || s->done || s->embeds() || s->decoding()) continue;
    if (s->slice_tokens > 0) {
      slot = s;
      break;
    }
    // The oldest slot reading a prompt: a new slice where pacing binds.
    if (slot == nullptr) slot = s;
  }
  if (slot == nullptr) return std::nullopt;
  if (slot->slice_tokens == 0) {
    if (budget >= options_.prefill_chunk || budget >= slot->pending()) return std::nullopt;
    // The slice's layers run the decode tokens and the chunk together: at
    // most prefill_chunk tokens in all (256 by default, whole tiles of the
    // prefill kernels; 8 streams beside a 256-token chunk would make 264).
    const int room = std::min(options_.prefill_chunk, slices_.max_batch) - n_decode;
    const int chunk = std::min({slot->pending(), room, budget * n_layer});
    if (chunk <= budget) return std::nullopt;  // no larger than plain tokens
    slot->slice_tokens = chunk;
    slot->slice_next_layer = 0;
  }
  const int left = n_layer - slot->slice_next_layer;
  // Rounded to nearest: the pacer corrects a budget that one layer too
  // many overruns from the step it measures.
  const int layers = budget >= slot->slice_tokens
                         ? left
                         : std::clamp((budget * n_layer + slot->slice_tokens / 2) / slot->slice_tokens, 1, left);
  return SliceStep{slot, layers};
}

// Samples one slot's next token from its row of logits and pushes its text.
// Returns why the request ends, if it does.
std::optional<FinishReason> Scheduler::advance(Slot& slot, std::span<const float> logits) {
  TokenLoop::Step step = slot.request->loop->next(logits, slot.n_kv, context_of(slot.request->params));
  slot.timings.generated_tokens = slot.request->loop->generated();
  if (step.logprob) slot.held_logprobs.push_back(std::move(*step.logprob));
  if (!step.text.empty()) {
    StreamEvent piece = StreamEvent::piece(std::move(step.text));
    piece.logprobs = std::move(slot.held_logprobs);
    slot.held_logprobs.clear();
    slot.request->push(std::move(piece));
  }
  if (step.finish) return step.finish;
  slot.tokens.push_back(step.token);
  return std::nullopt;
}

// ---- embeddings ---------------------------------------------------------------

bool Scheduler::embed_step_due(const std::vector<std::unique_ptr<Slot>>& slots) {
  bool embeds = false, others = false;
  for (const auto& s : slots) {
    if (!s || !s->has_blocks || s->done) continue;
    (s->embeds() ? embeds : others) = true;
  }
  if (!embeds) return false;
  if (!others) return true;
  embed_turn_ = !embed_turn_;
  return embed_turn_;
}

// Reads embedding requests' prompts, oldest first, in a batch of their own
// that asks for the hidden states each one's pooling needs; a request
// whose prompt is read ends with its pooled, normalized vector. The chunk
// is prefill_chunk tokens, or while streams generate what the pacer lets a
// step carry beside them (at least one token).
void Scheduler::embed_step(std::vector<std::unique_ptr<Slot>>& slots) {
  std::vector<Slot*> by_age;
  int n_decode = 0, n_embed = 0;
  for (auto& s : slots) {
    if (!s || !s->has_blocks || s->done) continue;
    if (s->embeds()) {
      by_age.push_back(s.get());
      ++n_embed;
    } else if (s->decoding()) {
      ++n_decode;
    }
  }
  std::sort(by_age.begin(), by_age.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
  int budget = n_decode == 0 ? options_.prefill_chunk : std::max(1, pacer_.budget(n_decode, n_embed));

  backend::Batch batch;
  batch.output_embeddings = true;
  std::vector<std::pair<Slot*, int>> fed;       // slots and the tokens this step gives them
  std::vector<std::pair<Slot*, int>> outputs;   // each hidden-state row: its slot and position
  uint64_t prompt_tokens = 0;
  const auto now = Clock::now();
  for (Slot* s : by_age) {
    if (budget == 0) break;
    const int n = std::min(budget, s->pending());
    if (n <= 0) continue;
    if (!s->prompt_started) {
      s->prompt_started = true;
      s->prompt_start = now;
    }
    // From the start (first, or again after giving its blocks back): a new pooling.
    if (s->n_kv == 0 || !s->pooler) s->pooler.emplace(*s->request->params.embed, n_embd_, static_cast<int>(s->tokens.size()));
    for (int i = 0; i < n; ++i) {
      const int p = s->n_kv + i;
      const bool wanted = s->pooler->wants(p);
      batch.add(s->tokens[p], p, s->seq, wanted);
      if (wanted) outputs.emplace_back(s, p);
    }
    fed.emplace_back(s, n);
    budget -= n;
    prompt_tokens += static_cast<uint64_t>(n);
  }
  if (batch.size() == 0) return;
  std::vector<float> hidden(outputs.size() * static_cast<size_t>(n_embd_));
  backend_.forward(batch, hidden);
  const auto after = Clock::now();
  for (auto [s, n] : fed) {
    s->n_kv += n;
    publish_full_blocks(*s);  // the same K and V a generating request computes: others may reuse them
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    auto [s, p] = outputs[r];
    s->pooler->add(p, std::span<const float>(hidden).subspan(r * static_cast<size_t>(n_embd_), static_cast<size_t>(n_embd_)));
  }
  {
    std::lock_guard lock(mutex_);
    ++stats_.steps;
    stats_.prompt_tokens += prompt_tokens;
  }
  for (auto [s, n] : fed) {
    if (s->pending() > 0) continue;
    s->timings.prompt_seconds = seconds_between(s->prompt_start, after);
    try {
      s->embedding = s->pooler->pooled();
      l2_normalize(s->embedding);
    } catch (const std::exception& e) {
      fail(*s, e.what());
      continue;
    }
    finish(*s, FinishReason::EndOfGeneration);
  }
}

}  // namespace m40::engine

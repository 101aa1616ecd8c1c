#include "engine/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "engine/stop_strings.h"

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
    if (finished_) return;
    if (event.kind != StreamEvent::Kind::Text) finished_ = true;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

// ---- Scheduler -------------------------------------------------------------

struct Scheduler::Pending {
  RequestParams params;
  std::unique_ptr<Sampler> sampler;
  std::shared_ptr<RequestStream> stream;
  Clock::time_point queued_at;
};

struct Scheduler::Slot {
  Slot(const tokenizer::Vocab& vocab, std::unique_ptr<Pending> p, int seq_id)
      : request(std::move(p)),
        seq(seq_id),
        detok(vocab, {.render_special = false, .sequence_start = false}),
        stops(request->params.stop) {}

  std::unique_ptr<Pending> request;
  int seq;
  int prompt_done = 0;   // prompt tokens already in the KV cache
  int pos = 0;           // next position to write
  int32_t next_token = -1;  // sampled, to be fed at `pos` in the next step (decode phase)
  bool decoding = false;
  tokenizer::StreamingDetokenizer detok;
  StopStringFilter stops;
  RequestTimings timings;
  Clock::time_point prompt_start{};
  Clock::time_point generate_start{};
  bool prompt_started = false;
  int logits_row = -1;  // this step's row of logits, -1 if none
  bool done = false;
};

Scheduler::Scheduler(backend::Backend& backend, const tokenizer::Vocab& vocab, SchedulerOptions options)
    : backend_(backend),
      vocab_(vocab),
      options_(options),
      pacer_(options.prefill_chunk, options.prefill_slowdown),
      n_ctx_(backend.n_ctx()),
      n_slots_(backend.n_seq_max()),
      n_vocab_(backend.n_vocab()) {
  if (static_cast<size_t>(n_vocab_) < vocab.size()) {
    throw Error("the tokenizer has " + std::to_string(vocab.size()) + " tokens but the model only " +
                std::to_string(n_vocab_));
  }
  options_.max_queue = std::max(0, options_.max_queue);
  options_.prefill_chunk = std::max(1, options_.prefill_chunk);
  stats_.slots_total = n_slots_;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<RequestStream> Scheduler::submit(RequestParams params) {
  using R = RequestRejected::Reason;
  const int n_prompt = static_cast<int>(params.prompt.size());
  if (n_prompt == 0) throw RequestRejected(R::Invalid, "the prompt is empty");
  if (n_prompt >= n_ctx_) {
    throw RequestRejected(R::Invalid, "the prompt has " + std::to_string(n_prompt) +
                                          " tokens but the context holds " + std::to_string(n_ctx_) +
                                          " (leaving room for at least one new token): shorten the prompt "
                                          "or start the server with a larger --ctx");
  }
  auto pending = std::make_unique<Pending>();
  try {
    for (int32_t t : params.prompt) vocab_.check_id(t);
    pending->sampler = std::make_unique<Sampler>(params.sampler, n_vocab_);
    // The prompt is in the penalty window, as in llama.cpp's server and Generator.
    for (int32_t t : params.prompt) pending->sampler->accept(t);
  } catch (const Error& e) {
    throw RequestRejected(R::Invalid, e.what());
  }
  pending->params = std::move(params);
  pending->stream = std::make_shared<RequestStream>();
  pending->queued_at = Clock::now();
  auto stream = pending->stream;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw RequestRejected(R::ShuttingDown, "the server is shutting down");
    // Clients that left while waiting must not keep live ones out.
    drop_cancelled_requests();
    // A request waits only when every slot is taken; the queue bound counts
    // the ones waiting beyond those being served.
    if (static_cast<int>(queue_.size()) >= options_.max_queue + (n_slots_ - stats_.slots_busy)) {
      ++stats_.requests_rejected;
      throw RequestRejected(R::QueueFull, "the server is busy: " + std::to_string(queue_.size()) +
                                              " requests are waiting; try again later");
    }
    queue_.push_back(std::move(pending));
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
  if (reason != FinishReason::Cancelled && reason != FinishReason::StopString) {
    // Release what the detokenizer and the stop filter hold back.
    std::string text;
    slot.detok.flush(text);
    std::string rest = slot.stops.push(text);
    if (!slot.stops.stopped()) rest += slot.stops.flush();
    if (!rest.empty()) slot.request->stream->push(StreamEvent::piece(std::move(rest)));
  }
  if (slot.decoding) slot.timings.generate_seconds = seconds_between(slot.generate_start, Clock::now());
  slot.request->stream->push(StreamEvent::done(reason, slot.timings));
  slot.done = true;
  if (reason == FinishReason::Cancelled) {
    std::lock_guard lock(mutex_);
    ++stats_.requests_cancelled;
  }
}

// One request's own failure (its sampler, its text): it ends alone, the
// others in the step go on.
void Scheduler::fail(Slot& slot, const std::string& message) {
  std::fprintf(stderr, "m40-llm: request failed: %s\n", message.c_str());
  {
    std::lock_guard lock(mutex_);
    ++stats_.requests_failed;
  }
  slot.request->stream->push(StreamEvent::failed(message, slot.timings));
  slot.done = true;
}

void Scheduler::drop_cancelled_requests() {
  std::erase_if(queue_, [&](const std::unique_ptr<Pending>& p) {
    if (!p->stream->cancelled()) return false;
    p->stream->push(StreamEvent::done(FinishReason::Cancelled, {}));
    ++stats_.requests_cancelled;
    return true;
  });
  stats_.queue_depth = static_cast<int>(queue_.size());
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
      // Admit waiting requests into free slots, oldest first. (One cancelled
      // from now on is freed below, before any work is spent on it.)
      for (int i = 0; i < n_slots_ && !queue_.empty(); ++i) {
        if (slots[i]) continue;
        auto pending = std::move(queue_.front());
        queue_.pop_front();
        slots[i] = std::make_unique<Slot>(vocab_, std::move(pending), i);
        slots[i]->timings.prompt_tokens = static_cast<int>(slots[i]->request->params.prompt.size());
        slots[i]->timings.queue_seconds = seconds_between(slots[i]->request->queued_at, Clock::now());
      }
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
        s->request->stream->push(StreamEvent::failed(e.what(), s->timings));
        std::lock_guard lock(mutex_);
        ++stats_.requests_failed;
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
      if (s) stats_.kv_cells_used += s->pos;
    }
  }
  // Shutting down: end everything still running or waiting.
  const StreamEvent bye = StreamEvent::failed("the server is shutting down");
  for (auto& s : slots) {
    if (s) s->request->stream->push(bye);
  }
  std::lock_guard lock(mutex_);
  for (auto& p : queue_) p->stream->push(bye);
  queue_.clear();
  stats_.queue_depth = 0;
  stats_.slots_busy = 0;
  stats_.kv_cells_used = 0;
}

void Scheduler::step(std::vector<std::unique_ptr<Slot>>& slots) {
  backend::Batch batch;
  int rows = 0;
  uint64_t prompt_tokens = 0;
  int n_decode = 0;
  int n_waiting = 0;  // slots whose prompt is not read yet (not the queue: pacing does not change its wait)
  // Decode tokens first: every generating slot advances by one each step.
  for (auto& s : slots) {
    if (!s) continue;
    s->logits_row = -1;
    if (s->decoding) {
      batch.add(s->next_token, s->pos++, s->seq, true);
      s->logits_row = rows++;
      ++n_decode;
    } else {
      ++n_waiting;
    }
  }
  // Then prompt chunks, oldest slot first, within the step's prompt budget:
  // what the pacer allows beside these decode tokens (prefill_chunk when
  // none run, pacing is off or more requests wait than streams run; 0 on a
  // step that re-measures the streams alone).
  int budget = pacer_.budget(n_decode, n_waiting);
  const auto now = Clock::now();
  for (auto& s : slots) {
    if (!s || s->decoding || budget == 0) continue;
    const auto& prompt = s->request->params.prompt;
    const int n_prompt = static_cast<int>(prompt.size());
    const int n = std::min(budget, n_prompt - s->prompt_done);
    if (!s->prompt_started) {
      s->prompt_started = true;
      s->prompt_start = now;
    }
    for (int i = 0; i < n; ++i) {
      const int p = s->prompt_done + i;
      const bool last = p + 1 == n_prompt;
      batch.add(prompt[p], p, s->seq, last);
      if (last) s->logits_row = rows++;
    }
    s->prompt_done += n;
    s->pos = s->prompt_done;
    budget -= n;
    prompt_tokens += static_cast<uint64_t>(n);
  }
  if (batch.size() == 0) return;

  std::vector<float> logits(static_cast<size_t>(rows) * static_cast<size_t>(n_vocab_));
  const auto forward_start = Clock::now();
  backend_.forward(batch, logits);
  const auto after = Clock::now();

  uint64_t generated = 0;
  // Requests that end this step; their Done events go out after the counters
  // are updated, so a client that sees the end also sees it counted.
  std::vector<std::pair<Slot*, FinishReason>> ended;
  std::vector<std::pair<Slot*, std::string>> failed;
  for (auto& s : slots) {
    if (!s || s->logits_row < 0) continue;
    Slot& slot = *s;
    if (!slot.decoding) {
      slot.timings.prompt_seconds = seconds_between(slot.prompt_start, after);
      slot.decoding = true;
      slot.generate_start = after;
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
  pacer_.record(n_decode, static_cast<int>(prompt_tokens), seconds_between(forward_start, Clock::now()));
  {
    std::lock_guard lock(mutex_);
    ++stats_.steps;
    stats_.prompt_tokens += prompt_tokens;
    stats_.generated_tokens += generated;
  }
  for (auto& [slot, message] : failed) fail(*slot, message);
  for (auto [slot, reason] : ended) {
    try {
      finish(*slot, reason);  // flushes the detokenizer and the stop filter
    } catch (const std::exception& e) {
      fail(*slot, e.what());
    }
  }
}

// Samples one slot's next token from its row of logits and pushes its text.
// Returns why the request ends, if it does.
std::optional<FinishReason> Scheduler::advance(Slot& slot, std::span<const float> logits) {
  const auto& params = slot.request->params;
  if (params.max_tokens == 0) return FinishReason::MaxTokens;
  const int32_t token = slot.request->sampler->sample(logits);
  slot.request->sampler->accept(token);
  if (!params.ignore_eos && vocab_.is_end_of_generation(token)) return FinishReason::EndOfGeneration;
  ++slot.timings.generated_tokens;
  std::string text;
  slot.detok.push(token, text);
  std::string shown = slot.stops.push(text);
  if (!shown.empty()) slot.request->stream->push(StreamEvent::piece(std::move(shown)));
  if (slot.stops.stopped()) return FinishReason::StopString;
  if (slot.pos >= n_ctx_) return FinishReason::ContextFull;
  if (params.max_tokens >= 0 && slot.timings.generated_tokens >= params.max_tokens) return FinishReason::MaxTokens;
  slot.next_token = token;
  return std::nullopt;
}

}  // namespace m40::engine

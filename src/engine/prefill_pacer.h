// Sizes the prompt chunk of each engine step so that reading a prompt slows
// the running streams by a bounded factor. A step that carries decode tokens
// and a prompt chunk takes as long as both together: with a fixed chunk the
// streams' inter-token latency jumps from one decode step to one chunk's
// forward time (4 ms to 400 ms on a CPU with 256 tokens), and which chunk is
// "small enough" depends on the hardware, the model and the number of
// streams. The pacer learns it instead: it measures how long steps of n
// decode tokens take without a prompt, and grows or shrinks the chunk until
// a step with one takes about `slowdown` times that.
//
// The chunk only shrinks after a step over the budget and only grows, by at
// least one token, after a full chunk within it: the size that fits is
// estimated as if the extra time were linear in prompt tokens, and with a
// fixed cost per prompt step (a GPU's second pass over the weights costs
// about as much for 2 tokens as for 8) that estimate is too small, so a
// chunk that shrank on it would sink to one token and stay there. A size
// that went over the budget becomes a ceiling, probed again after a wait
// that doubles with every probe that fails.
//
// The reference drifts while a prompt is read: every step lengthens the
// streams' contexts, and their attention with it (on the CPU with
// TinyStories a decode-only step of 8 streams goes from 0.5 ms at 20
// positions to 2 ms at 350). Measured once before the prompt, it would soon
// be far too small and starve the prompt. So after a run of steps with a
// prompt chunk, one step carries none and measures it again.
//
// Pure logic (durations come from the caller), so tests drive it with
// simulated step costs.
#pragma once

#include <map>

namespace m40::engine {

class PrefillPacer {
 public:
  // `max_chunk`: the most prompt tokens a step may carry (--prefill-chunk).
  // `slowdown`: how many times longer than a decode-only step a step with a
  // prompt chunk may take while streams generate; <= 0 turns pacing off.
  PrefillPacer(int max_chunk, double slowdown);

  // Prompt tokens the next step may carry beside `n_decode` decode tokens
  // while `n_waiting` requests wait for their prompt to be read: max_chunk
  // when no stream is generating, pacing is off, or more requests wait than
  // streams run (a burst of requests: pacing would protect
  // the few streams at the cost of the many waiting for their first token;
  // on an H200 with 32 clients it cost 10% of the throughput and quadrupled
  // the TTFT p99); else the learned chunk (at least 1, so a prompt always
  // progresses), except 0 for the decode-only step that renews the
  // reference (one in every kReferenceEvery + 1 while a prompt is read).
  int budget(int n_decode, int n_waiting = 1) const;
  // The learned chunk, in [1, max_chunk]: what budget() gives beside decode
  // tokens on a step that is not a reference step.
  int chunk() const;

  // A finished step: its decode tokens, prompt tokens and duration.
  void record(int n_decode, int n_prompt, double seconds);

  int max_chunk() const { return max_chunk_; }
  double slowdown() const { return slowdown_; }

  // Steps with a prompt chunk in a row before a decode-only reference step.
  static constexpr int kReferenceEvery = 8;

 private:
  // The smoothed time of a decode-only step of `n_decode` tokens, from the
  // nearest decode count measured; 0 when none was.
  double decode_seconds(int n_decode) const;

  int max_chunk_;
  double slowdown_;
  double chunk_;                          // fractional, so small corrections accumulate
  std::map<int, double> decode_seconds_;  // decode tokens -> smoothed step seconds
  int steps_since_reference_ = 0;         // steps with decode and prompt tokens since a decode-only one
  // The smallest chunk seen over the budget (0: none): the chunk stays below
  // it, except for one probe after probe_wait_ more steps within the budget
  // (the wait doubles after each probe that fails, so that a cost cliff just
  // above the chunk is seldom touched, and starts over when costs change).
  int ceiling_ = 0;
  int probe_interval_ = 0;
  int probe_wait_ = 0;
};

}  // namespace m40::engine

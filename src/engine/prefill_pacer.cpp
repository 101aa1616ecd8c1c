#include "engine/prefill_pacer.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace m40::engine {

namespace {
// Before anything is measured, a chunk small enough not to hurt the streams
// much on any hardware; a few steps grow it when steps allow more.
constexpr double kStartChunk = 16;
// Weight of a new decode-only measurement: step times drift as the streams'
// contexts grow, and single steps are noisy (another process, page faults).
constexpr double kDecodeWeight = 0.25;
// A single decode-only step counts as at most this many times the reference:
// one step stalled by the OS must not let the next chunks grow far.
constexpr double kDecodeOutlier = 1.5;
// The chunk grows to at most twice the prompt tokens of the step just
// measured: one noisy fast step, a ratio just above 1 (which extrapolates to
// a huge chunk), or a run of short prompts (cheap because they are short)
// cannot make the next step carry a chunk many times any measured one.
constexpr double kMaxGrowth = 2;
}  // namespace

PrefillPacer::PrefillPacer(int max_chunk, double slowdown)
    : max_chunk_(std::max(1, max_chunk)),
      slowdown_(slowdown),
      chunk_(std::min<double>(max_chunk_, kStartChunk)) {}

int PrefillPacer::budget(int n_decode) const {
  if (n_decode <= 0 || slowdown_ <= 0) return max_chunk_;
  if (steps_since_reference_ >= kReferenceEvery) return 0;
  return chunk();
}

int PrefillPacer::chunk() const {
  // Rounded down: a chunk converging from above never rounds up past the
  // size that was measured to fit.
  return std::clamp(static_cast<int>(chunk_), 1, max_chunk_);
}

double PrefillPacer::decode_seconds(int n_decode) const {
  if (decode_seconds_.empty()) return 0;
  // The nearest measured decode count (the smaller one on a tie: a cheaper
  // reference step allows a smaller chunk, the cautious side).
  auto above = decode_seconds_.lower_bound(n_decode);
  if (above == decode_seconds_.end()) return std::prev(above)->second;
  if (above->first == n_decode || above == decode_seconds_.begin()) return above->second;
  auto below = std::prev(above);
  return n_decode - below->first <= above->first - n_decode ? below->second : above->second;
}

void PrefillPacer::record(int n_decode, int n_prompt, double seconds) {
  if (n_decode <= 0 || n_prompt < 0 || !(seconds > 0)) return;  // no stream to protect, or no usable time
  if (n_prompt == 0) {
    auto [it, fresh] = decode_seconds_.try_emplace(n_decode, seconds);
    if (!fresh) it->second += kDecodeWeight * (std::min(seconds, kDecodeOutlier * it->second) - it->second);
    steps_since_reference_ = 0;
    return;
  }
  if (slowdown_ <= 0) return;
  ++steps_since_reference_;
  const double base = decode_seconds(n_decode);
  if (base <= 0) return;  // no reference yet: keep the cautious chunk
  if (slowdown_ <= 1) {
    chunk_ = 1;  // no extra time allowed: the least that still reads the prompt
    return;
  }
  // If the extra time is about linear in prompt tokens, the chunk that takes
  // exactly the allowed extra is n_prompt * allowed / measured extra. With a
  // fixed cost per prompt-carrying step as well, repeating this converges to
  // the right chunk all the same (the fixed point is where the step takes
  // `slowdown` times the base). A step no slower than the base (noise, or
  // prompt tokens that cost nothing here) says only "more fits": grow.
  const double ratio = seconds / base;
  const double allowed = slowdown_ - 1;
  const double grown = std::max(chunk_, kMaxGrowth * n_prompt);
  double next = grown;
  if (ratio > 1) {
    const double estimate = n_prompt * allowed / (ratio - 1);
    // Half way in the log domain: a noisy step moves the chunk by the square
    // root of its error, and a real change is followed within a few steps.
    next = std::min(grown, std::sqrt(chunk_ * estimate));
  }
  chunk_ = std::clamp(next, 1.0, static_cast<double>(max_chunk_));
}

}  // namespace m40::engine

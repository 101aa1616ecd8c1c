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
// Steps within the budget before the chunk may probe its ceiling again: the
// first wait, and the longest after failed probes double it (a probe that
// hits a cost cliff slows the streams' step: a few in a thousand stay out of
// their p99).
constexpr int kFirstProbeWait = 16;
constexpr int kLongestProbeWait = 512;
}  // namespace

PrefillPacer::PrefillPacer(int max_chunk, double slowdown)
    : max_chunk_(std::max(1, max_chunk)),
      slowdown_(slowdown),
      chunk_(std::min<double>(max_chunk_, kStartChunk)) {}

int PrefillPacer::budget(int n_decode, int n_waiting) const {
  if (n_decode <= 0 || slowdown_ <= 0 || n_waiting > n_decode) return max_chunk_;
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
  // The chunk that takes exactly the allowed extra, if the extra time is
  // linear in prompt tokens: n_prompt * allowed / measured extra. The chunk
  // moves toward it half way in the log domain, so a noisy step moves it by
  // the square root of its error and a real change is followed within a few
  // steps; but only down after a step over the budget (and below the size
  // that went over) and only up, by at least a token, after a full chunk
  // within it (the class comment says why). A step that carried fewer
  // tokens than the chunk (a prompt's last piece) and stayed within the
  // budget says nothing about the chunk. A step no slower than the base
  // (noise, or prompt tokens that cost nothing here) says only "more fits".
  const double ratio = seconds / base;
  const double allowed = slowdown_ - 1;
  const double estimate = ratio > 1 ? n_prompt * allowed / (ratio - 1) : 0;  // used only when ratio > 1
  double next = chunk_;
  if (ratio > slowdown_) {
    if (ceiling_ == 0 || n_prompt < ceiling_) {
      ceiling_ = n_prompt;
      probe_interval_ = kFirstProbeWait;
    } else if (n_prompt == ceiling_) {
      probe_interval_ = std::min(2 * probe_interval_, kLongestProbeWait);  // a failed probe
    }
    probe_wait_ = probe_interval_;
    next = std::min({chunk_, std::sqrt(chunk_ * estimate), n_prompt - 1.0});
  } else if (n_prompt >= chunk()) {
    if (ceiling_ != 0 && n_prompt >= ceiling_) ceiling_ = 0;  // a probe that fit: costs went down
    double cap = std::max(chunk_, kMaxGrowth * n_prompt);
    if (ceiling_ != 0) {
      if (probe_wait_ > 0) --probe_wait_;
      cap = std::min<double>(cap, probe_wait_ > 0 ? ceiling_ - 1 : ceiling_);
    }
    next = ratio <= 1 ? cap : std::min(cap, std::max(chunk_ + 1, std::sqrt(chunk_ * estimate)));
    next = std::max(next, chunk_);  // within the budget: never smaller
  }
  chunk_ = std::clamp(next, 1.0, static_cast<double>(max_chunk_));
}

}  // namespace m40::engine

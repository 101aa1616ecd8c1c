// The token sampler: turns one row of logits into the next token, with the
// controls llama.cpp and Ollama users know, applied in llama.cpp's order:
//
//   logit_bias -> penalties (repetition, frequency, presence)
//     -> top-k -> top-p -> min-p -> temperature -> seeded draw
//
// top-k, top-p and min-p look at the penalized logits at temperature 1, as in
// llama.cpp; the temperature only shapes the distribution the draw is taken
// from. temperature <= 0 is greedy: the argmax of the penalized logits.
//
// One Sampler per sequence: it owns that sequence's penalty window and random
// stream. Not thread-safe; cheap to keep (two ints per vocabulary entry when
// penalties are on) and allocation-free per call once warm.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace m40::engine {

// The seed value that asks for a fresh random seed (what Ollama's seed = -1
// becomes when cast to 64 bits). Any other value is used as given.
inline constexpr uint64_t kRandomSeed = std::numeric_limits<uint64_t>::max();

// Defaults are llama.cpp's (common_params_sampling), except repeat_penalty,
// which follows Ollama's 1.1 (recent llama.cpp defaults it to 1.0 = off).
// The "off" value of each control is the one llama.cpp uses.
struct SamplerParams {
  float temperature = 0.8f;       // <= 0: greedy argmax (ties to the lowest token id)
  int32_t top_k = 40;             // <= 0 (or >= vocabulary size): off
  float top_p = 0.95f;            // >= 1: off; the nucleus always keeps at least one token
  float min_p = 0.05f;            // <= 0: off; keeps p >= min_p * p_max
  float repeat_penalty = 1.1f;    // 1: off; must be > 0
  float frequency_penalty = 0.0f; // 0: off; subtracted once per occurrence in the window
  float presence_penalty = 0.0f;  // 0: off; subtracted once if the token is in the window
  int32_t penalty_last_n = 64;    // window of accepted tokens: -1 every token since reset, 0 off
  uint64_t seed = kRandomSeed;    // kRandomSeed: random; anything else: reproducible draws
  // Added to the logits before anything else (OpenAI's logit_bias);
  // -infinity bans a token.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// One entry of the final distribution: the token, its logit after bias and
// penalties (before temperature), and the probability the draw gives it.
struct TokenProb {
  int32_t token;
  float logit;
  float prob;
};

class Sampler {
 public:
  // Throws m40::Error for a parameter outside its domain (NaN, a negative
  // repeat penalty, penalty_last_n < -1, a logit_bias token out of range).
  Sampler(SamplerParams params, int32_t n_vocab);

  // Picks the next token from one row of n_vocab logits. Does not accept it:
  // call accept() with the token that is actually appended to the sequence.
  // Throws m40::Error when the row has the wrong size, holds NaN or +inf,
  // or when every token ends up at -inf.
  int32_t sample(std::span<const float> logits);

  // Appends a token to the penalty window (prompt tokens and generated ones
  // alike, as llama.cpp's server does). Throws m40::Error when out of range.
  void accept(int32_t token);

  // Empties the penalty window and restarts the random stream: a fixed seed
  // replays the same draws, kRandomSeed draws a new random seed.
  void reset();

  // The distribution sample() draws from, for these logits and the current
  // window, without drawing: the kept tokens with probabilities summing to 1,
  // in the order the draw walks them (best first whenever top-k or top-p ran,
  // otherwise by token id). Greedy gives the argmax alone with probability 1.
  // Valid until the next call on this Sampler.
  std::span<const TokenProb> distribution(std::span<const float> logits);

  // Applies logit_bias and then the repetition, frequency and presence
  // penalties of the current window to a row of n_vocab logits, in place:
  //   for each token t with count c > 0 in the window:
  //     l = l <= 0 ? l * repeat_penalty : l / repeat_penalty
  //     l -= c * frequency_penalty + presence_penalty
  void adjust_logits(std::span<float> logits) const;

  const SamplerParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }
  // The seed in use: params().seed, or the random one drawn for kRandomSeed.
  uint64_t seed() const { return seed_; }
  // How many tokens the penalty window holds now.
  size_t window_size() const { return window_.size(); }

 private:
  bool penalties_enabled() const;
  void load_logits(std::span<const float> logits);
  void build_distribution();
  void select_top_k(size_t k);
  void select_top_p_sorted();
  void select_top_p_from_vocabulary(float max_logit);
  void apply_min_p();
  void apply_temperature();
  double uniform01();

  SamplerParams params_;
  int32_t n_vocab_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;

  // Penalty window: the accepted tokens, a list that grows up to
  // penalty_last_n entries (forever for -1) and then turns into a ring; and
  // per-token counts of what it holds.
  std::vector<int32_t> window_;
  size_t window_head_ = 0;  // index of the oldest token once the ring is full
  std::vector<int32_t> counts_;
  // Marks tokens already penalized in this adjust_logits call, so a token
  // that is in the window many times is penalized once.
  mutable std::vector<uint32_t> visited_;
  mutable uint32_t visit_stamp_ = 0;

  // Per-call buffers, kept between calls.
  std::vector<float> work_;       // the adjusted logits
  std::vector<TokenProb> cands_;  // the surviving candidates
  bool sorted_ = false;           // cands_ is in best-first order
  double weight_sum_ = 0.0;       // sum of the candidates' probabilities, for the draw
  // top-p over the whole vocabulary: probability mass and token count per
  // slice of logit distance below the maximum.
  static constexpr int kNucleusBuckets = 256;
  std::array<double, kNucleusBuckets> bucket_mass_{};
  std::array<size_t, kNucleusBuckets> bucket_count_{};
};

}  // namespace m40::engine

#include "engine/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "common/error.h"

namespace m40::engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The order every truncation uses: higher logit first, ties to the lower id,
// so that which of several equal tokens survives never depends on the
// standard library's sort.
bool better(const TokenProb& a, const TokenProb& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

// A logit the pipeline can work with: finite, or -inf for a banned token.
bool usable_logit(float x) { return x <= std::numeric_limits<float>::max(); }

std::string describe(float x) { return std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf"; }

// The maximum of a row, in eight independent lanes so that the loop is not
// one long chain of dependent comparisons (a 150k vocabulary in ~10 us).
float max_of(const float* x, size_t n) {
  float lane[8];
  std::fill(lane, lane + 8, -kInf);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  for (; i < n; ++i) lane[0] = x[i] > lane[0] ? x[i] : lane[0];
  return *std::max_element(lane, lane + 8);
}

// The bucket of a logit for top-p over the whole vocabulary: slices of 1/8
// of a logit (a probability ratio of 1.13) below the maximum; the last one
// also takes everything further down.
int nucleus_bucket(float max_logit, float logit, int buckets) {
  const float slices = (max_logit - logit) * 8.0f;
  return slices < static_cast<float>(buckets - 1) ? static_cast<int>(slices) : buckets - 1;
}

uint64_t resolve_seed(uint64_t requested) {
  if (requested != kRandomSeed) return requested;
  // random_device is a true source on the platforms we build for; the clock
  // keeps two samplers apart even where it is not.
  std::random_device device;
  uint64_t seed = (static_cast<uint64_t>(device()) << 32) ^ device();
  seed ^= static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count()) *
          0x9E3779B97F4A7C15ull;
  return seed == kRandomSeed ? 0 : seed;
}

void require_finite(float value, const char* name) {
  if (!std::isfinite(value)) {
    throw Error(std::string("sampler: ") + name + " must be a finite number, got " + describe(value));
  }
}

}  // namespace

Sampler::Sampler(SamplerParams params, int32_t n_vocab) : params_(std::move(params)), n_vocab_(n_vocab) {
  if (n_vocab_ <= 0) {
    throw Error("sampler: the vocabulary size must be positive, got " + std::to_string(n_vocab_));
  }
  require_finite(params_.temperature, "temperature");
  require_finite(params_.top_p, "top_p");
  require_finite(params_.min_p, "min_p");
  require_finite(params_.repeat_penalty, "repeat_penalty");
  require_finite(params_.frequency_penalty, "frequency_penalty");
  require_finite(params_.presence_penalty, "presence_penalty");
  if (params_.repeat_penalty <= 0.0f) {
    throw Error("sampler: repeat_penalty must be > 0 (1 turns it off), got " +
                std::to_string(params_.repeat_penalty));
  }
  if (params_.penalty_last_n < -1) {
    throw Error("sampler: penalty_last_n must be -1 (whole context), 0 (off) or a window size, got " +
                std::to_string(params_.penalty_last_n));
  }
  for (const auto& [token, bias] : params_.logit_bias) {
    if (token < 0 || token >= n_vocab_) {
      throw Error("sampler: logit_bias names token " + std::to_string(token) + ", outside the vocabulary of " +
                  std::to_string(n_vocab_) + " tokens");
    }
    if (!usable_logit(bias)) {
      throw Error("sampler: logit_bias of token " + std::to_string(token) + " is " + describe(bias) +
                  "; use a finite bias, or -inf to ban the token");
    }
  }

  if (penalties_enabled()) {
    counts_.assign(static_cast<size_t>(n_vocab_), 0);
    visited_.assign(static_cast<size_t>(n_vocab_), 0);
    // A window of thousands (or -1 with a long context) grows as tokens
    // come instead of being allocated whole.
    window_.reserve(params_.penalty_last_n > 0 ? std::min<size_t>(static_cast<size_t>(params_.penalty_last_n), 4096)
                                               : 4096);
  }
  work_.resize(static_cast<size_t>(n_vocab_));
  seed_ = resolve_seed(params_.seed);
  rng_.seed(seed_);
}

bool Sampler::penalties_enabled() const {
  return params_.penalty_last_n != 0 &&
         (params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f);
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_) {
    throw Error("sampler: accepted token " + std::to_string(token) + " is outside the vocabulary of " +
                std::to_string(n_vocab_) + " tokens");
  }
  if (!penalties_enabled()) return;
  const size_t capacity = params_.penalty_last_n < 0 ? std::numeric_limits<size_t>::max()
                                                     : static_cast<size_t>(params_.penalty_last_n);
  if (window_.size() < capacity) {
    window_.push_back(token);
  } else {
    // Full ring: the oldest token leaves the window.
    --counts_[static_cast<size_t>(window_[window_head_])];
    window_[window_head_] = token;
    window_head_ = (window_head_ + 1) % capacity;
  }
  ++counts_[static_cast<size_t>(token)];
}

void Sampler::reset() {
  for (int32_t token : window_) counts_[static_cast<size_t>(token)] = 0;
  window_.clear();
  window_head_ = 0;
  seed_ = resolve_seed(params_.seed);
  rng_.seed(seed_);
}

void Sampler::adjust_logits(std::span<float> logits) const {
  if (logits.size() != static_cast<size_t>(n_vocab_)) {
    throw Error("sampler: got " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                std::to_string(n_vocab_) + " tokens");
  }
  auto check = [&](size_t token, const char* step) {
    if (!usable_logit(logits[token])) {
      throw Error("sampler: the logit of token " + std::to_string(token) + " became " + describe(logits[token]) +
                  " after " + step + "; use smaller biases or penalties");
    }
  };
  for (const auto& [token, bias] : params_.logit_bias) {
    logits[static_cast<size_t>(token)] += bias;
    check(static_cast<size_t>(token), "logit_bias");
  }
  if (!penalties_enabled() || window_.empty()) return;

  if (++visit_stamp_ == 0) {  // the stamp wrapped: forget every old mark
    std::fill(visited_.begin(), visited_.end(), 0u);
    visit_stamp_ = 1;
  }
  const float repeat = params_.repeat_penalty;
  for (int32_t id : window_) {  // the order does not matter: each token once
    const auto token = static_cast<size_t>(id);
    if (visited_[token] == visit_stamp_) continue;
    visited_[token] = visit_stamp_;
    const int32_t count = counts_[token];
    float& logit = logits[token];
    // Dividing a negative logit would raise it; multiplying lowers it.
    logit = logit <= 0.0f ? logit * repeat : logit / repeat;
    logit -= static_cast<float>(count) * params_.frequency_penalty +
             (count > 0 ? params_.presence_penalty : 0.0f);
    check(token, "the repetition penalties");
  }
}

void Sampler::load_logits(std::span<const float> logits) {
  if (logits.size() != static_cast<size_t>(n_vocab_)) {
    throw Error("sampler: got " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                std::to_string(n_vocab_) + " tokens");
  }
  // Copy and count the unusable values in one branch-free pass; look for
  // the culprit only when there is one.
  size_t unusable = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    work_[i] = logits[i];
    unusable += usable_logit(logits[i]) ? 0 : 1;
  }
  if (unusable != 0) {
    const auto it = std::find_if(logits.begin(), logits.end(), [](float x) { return !usable_logit(x); });
    throw Error("sampler: the logit of token " + std::to_string(it - logits.begin()) + " is " + describe(*it) +
                "; the forward pass produced a non-number (check the model file and the backend)");
  }
  adjust_logits(work_);
}

void Sampler::select_top_k(size_t k) {
  const float* logit = work_.data();
  const size_t n = work_.size();
  if (k * 16 <= n) {
    // Small k: one pass keeping the k best in a heap whose front is the
    // worst of them; almost every token is rejected by one comparison.
    if (cands_.capacity() < k) cands_.reserve(k);
    float threshold = -kInf;  // the worst kept logit once the heap is full
    for (size_t i = 0; i < n; ++i) {
      const float l = logit[i];
      if (!(l > threshold)) continue;  // equal logits: the earlier (lower) id stays
      if (cands_.size() < k) {
        cands_.push_back({static_cast<int32_t>(i), l, 0.0f});
        std::push_heap(cands_.begin(), cands_.end(), better);
        if (cands_.size() == k) threshold = cands_.front().logit;
      } else {
        std::pop_heap(cands_.begin(), cands_.end(), better);
        cands_.back() = {static_cast<int32_t>(i), l, 0.0f};
        std::push_heap(cands_.begin(), cands_.end(), better);
        threshold = cands_.front().logit;
      }
    }
    std::sort_heap(cands_.begin(), cands_.end(), better);
  } else {
    if (cands_.capacity() < n) cands_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (logit[i] != -kInf) cands_.push_back({static_cast<int32_t>(i), logit[i], 0.0f});
    }
    if (cands_.size() > k) {
      std::nth_element(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(k), cands_.end(), better);
      cands_.resize(k);
    }
    std::sort(cands_.begin(), cands_.end(), better);
  }
}

void Sampler::select_top_p_sorted() {
  // Probabilities at temperature 1 over the (few, best-first) candidates,
  // unnormalized: the nucleus is the shortest prefix whose weight reaches
  // top_p of the total, and never empty.
  const float max_logit = cands_.front().logit;
  double total = 0.0;
  for (TokenProb& c : cands_) {
    c.prob = std::exp(c.logit - max_logit);
    total += c.prob;
  }
  const double target = static_cast<double>(params_.top_p) * total;
  double cum = 0.0;
  for (size_t i = 0; i < cands_.size(); ++i) {
    cum += cands_[i].prob;
    if (cum >= target) {
      cands_.resize(i + 1);
      return;
    }
  }
}

void Sampler::select_top_p_from_vocabulary(float max_logit) {
  // Without top-k the nucleus is taken from every token, but sorting them all
  // is what makes llama.cpp's top-p slow. Instead: one pass sums the
  // probability mass per slice of distance below the maximum, the slices are
  // walked best-first until they hold top_p of the mass, and only the tokens
  // of those slices are gathered, sorted and cut exactly.
  const float* logit = work_.data();
  const size_t n = work_.size();
  bucket_mass_.fill(0.0);
  bucket_count_.fill(0);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (logit[i] == -kInf) continue;
    const float weight = std::exp(logit[i] - max_logit);
    const auto b = static_cast<size_t>(nucleus_bucket(max_logit, logit[i], kNucleusBuckets));
    bucket_mass_[b] += weight;
    ++bucket_count_[b];
    total += weight;
  }
  const double target = static_cast<double>(params_.top_p) * total;
  int last_bucket = kNucleusBuckets - 1;
  size_t gathered = 0;
  double cum = 0.0;
  for (int b = 0; b < kNucleusBuckets; ++b) {
    cum += bucket_mass_[static_cast<size_t>(b)];
    gathered += bucket_count_[static_cast<size_t>(b)];
    if (cum >= target) {
      last_bucket = b;
      break;
    }
  }

  if (cands_.capacity() < gathered) cands_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (logit[i] != -kInf && nucleus_bucket(max_logit, logit[i], kNucleusBuckets) <= last_bucket) {
      cands_.push_back({static_cast<int32_t>(i), logit[i], 0.0f});
    }
  }
  std::sort(cands_.begin(), cands_.end(), better);
  cum = 0.0;
  for (size_t i = 0; i < cands_.size(); ++i) {
    cum += std::exp(cands_[i].logit - max_logit);
    if (cum >= target) {
      cands_.resize(i + 1);
      return;
    }
  }
  // Summed in another order, the gathered mass fell a rounding error short
  // of the target: the nucleus is all of it.
}

void Sampler::apply_min_p() {
  const float max_logit = sorted_ ? cands_.front().logit
                                  : std::max_element(cands_.begin(), cands_.end(), better)->logit;
  // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p); the best
  // token always stays, even for min_p > 1.
  const float floor = params_.min_p >= 1.0f ? max_logit : max_logit + std::log(params_.min_p);
  std::erase_if(cands_, [floor](const TokenProb& c) { return c.logit < floor; });
}

void Sampler::apply_temperature() {
  const float max_logit = sorted_ ? cands_.front().logit
                                  : std::max_element(cands_.begin(), cands_.end(), better)->logit;
  const float temperature = params_.temperature;
  double total = 0.0;
  for (TokenProb& c : cands_) {
    c.prob = std::exp((c.logit - max_logit) / temperature);
    total += c.prob;
  }
  weight_sum_ = 0.0;
  for (TokenProb& c : cands_) {
    c.prob = static_cast<float>(c.prob / total);
    weight_sum_ += c.prob;
  }
}

void Sampler::build_distribution() {
  cands_.clear();
  sorted_ = false;
  const auto none_left = [this]() {
    return Error("sampler: every one of the " + std::to_string(n_vocab_) +
                 " logits is -inf after logit_bias and penalties; nothing can be sampled");
  };

  if (params_.temperature <= 0.0f) {
    // Greedy: the first maximum, so ties go to the lowest id. Truncation
    // never removes the maximum, so it is skipped.
    const float max_logit = max_of(work_.data(), work_.size());
    if (max_logit == -kInf) throw none_left();
    const auto best = std::find(work_.begin(), work_.end(), max_logit);
    cands_.push_back({static_cast<int32_t>(best - work_.begin()), max_logit, 1.0f});
    weight_sum_ = 1.0;
    return;
  }

  const bool top_k_on = params_.top_k > 0 && params_.top_k < n_vocab_;
  const bool top_p_on = params_.top_p < 1.0f;
  const bool min_p_on = params_.min_p > 0.0f;
  bool min_p_done = false;
  if (top_k_on) {
    select_top_k(static_cast<size_t>(params_.top_k));
    if (cands_.empty()) throw none_left();
    sorted_ = true;
    if (top_p_on) select_top_p_sorted();
  } else {
    const float max_logit = max_of(work_.data(), work_.size());
    if (max_logit == -kInf) throw none_left();
    if (top_p_on) {
      select_top_p_from_vocabulary(max_logit);
      sorted_ = true;
    } else {
      // Nothing to sort: min-p filters while the candidates are gathered.
      float floor = -std::numeric_limits<float>::max();
      if (min_p_on) {
        floor = params_.min_p >= 1.0f ? max_logit : max_logit + std::log(params_.min_p);
        min_p_done = true;
      }
      if (cands_.capacity() < work_.size()) cands_.reserve(work_.size());
      for (size_t i = 0; i < work_.size(); ++i) {
        if (work_[i] >= floor) cands_.push_back({static_cast<int32_t>(i), work_[i], 0.0f});
      }
    }
  }
  if (min_p_on && !min_p_done) apply_min_p();
  apply_temperature();
}

double Sampler::uniform01() {
  // 53 random bits: the same double on every platform, unlike
  // std::uniform_real_distribution, whose algorithm is left to the library.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

std::span<const TokenProb> Sampler::distribution(std::span<const float> logits) {
  load_logits(logits);
  build_distribution();
  return cands_;
}

int32_t Sampler::sample(std::span<const float> logits) {
  load_logits(logits);
  build_distribution();
  if (params_.temperature <= 0.0f) return cands_.front().token;

  // Inverse CDF over the candidates in their order. The strict comparison
  // never lands on a token of probability 0.
  const double target = uniform01() * weight_sum_;
  double cum = 0.0;
  for (const TokenProb& c : cands_) {
    cum += c.prob;
    if (cum > target) return c.token;
  }
  // target rounded up to the total: the last token that can be drawn.
  for (auto it = cands_.rbegin(); it != cands_.rend(); ++it) {
    if (it->prob > 0.0f) return it->token;
  }
  return cands_.front().token;
}

}  // namespace m40::engine

#include "engine/token_loop.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace m40::engine {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::EndOfGeneration: return "stop";
    case FinishReason::StopString: return "stop";
    case FinishReason::MaxTokens: return "length";
    case FinishReason::ContextFull: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "stop";
}

namespace {

// The request's stop strings, then the texts of the end-of-generation
// tokens (unless the answer goes past them).
std::vector<std::string> stops_with_end_texts(const tokenizer::Vocab& vocab, const AnswerLimits& limits) {
  std::vector<std::string> stops = limits.stop;
  if (limits.ignore_eos) return stops;
  for (tokenizer::TokenId id : vocab.end_of_generation_tokens()) {
    const std::string& text = vocab.text(id);
    if (!text.empty() && std::find(stops.begin(), stops.end(), text) == stops.end()) stops.push_back(text);
  }
  return stops;
}

}  // namespace

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
  // log p(t) = logit(t) - log(sum exp(logit)), the sum taken from the maximum
  // so that no exp() overflows.
  float max = -std::numeric_limits<float>::infinity();
  for (float l : logits) max = std::max(max, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_total = max + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(token)] - log_total);
  // The k most likely, kept sorted in one pass over the vocabulary: most
  // likely first, ties to the lower id (ids come in ascending order and a
  // new one goes after its equals), as the greedy sampler breaks them.
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(top, 0)), logits.size());
  std::vector<int32_t> best;
  best.reserve(k + 1);
  for (size_t i = 0; i < logits.size() && k > 0; ++i) {
    if (logits[i] == -std::numeric_limits<float>::infinity()) continue;  // banned (a grammar's mask, a bias)
    if (best.size() == k && !(logits[i] > logits[static_cast<size_t>(best.back())])) continue;
    const auto at = std::upper_bound(best.begin(), best.end(), logits[i],
                                     [&](float l, int32_t id) { return l > logits[static_cast<size_t>(id)]; });
    best.insert(at, static_cast<int32_t>(i));
    if (best.size() > k) best.pop_back();
  }
  for (int32_t id : best) out.top.emplace_back(id, static_cast<float>(logits[static_cast<size_t>(id)] - log_total));
  return out;
}

TokenLoop::TokenLoop(const tokenizer::Vocab& vocab, const SamplerParams& sampler, int n_vocab, AnswerLimits limits,
                     std::span<const int32_t> prompt, int logprobs, const AnswerGrammar& grammar)
    : vocab_(vocab),
      sampler_(sampler, n_vocab),
      limits_(std::move(limits)),
      detok_(vocab, {.render_special = false, .sequence_start = false}),
      stops_(stops_with_end_texts(vocab, limits_)),
      user_stops_(limits_.stop.size()),
      logprobs_(logprobs),
      grammar_(grammar) {
  for (int32_t t : prompt) sampler_.accept(t);
  if (grammar_ && grammar_.starts_after.empty()) constraint_.emplace(grammar_.grammar, grammar_.vocabulary);
}

std::span<const float> TokenLoop::constrain(std::span<const float> logits) {
  if (!constraint_) return logits;
  masked_.assign(logits.begin(), logits.end());
  constraint_->mask(masked_);
  if (!constraint_->allows_any()) {
    throw Error("the grammar allows none of this model's tokens after " + std::to_string(tokens_.size()) +
                " tokens of the answer: the vocabulary cannot spell what it requires next");
  }
  return masked_;
}

// Advances the grammar past a drawn token, or, before it applies, watches
// for the text it starts after.
void TokenLoop::follow_grammar(int32_t token) {
  if (!grammar_) return;
  if (constraint_) {
    constraint_->accept(token);
    return;
  }
  before_grammar_ += vocab_.piece(token, true);
  const std::string& open = grammar_.starts_after;
  if (before_grammar_.size() >= open.size() && before_grammar_.find(open) != std::string::npos) {
    constraint_.emplace(grammar_.grammar, grammar_.vocabulary);
    before_grammar_.clear();
  } else if (before_grammar_.size() > 4 * open.size() + 64) {
    before_grammar_.erase(0, before_grammar_.size() - open.size());  // only a tail can still complete it
  }
}

std::string TokenLoop::release_held() {
  std::string text;
  detok_.flush(text);
  std::string rest = stops_.push(text);
  if (!stops_.stopped()) rest += stops_.flush();
  return rest;
}

TokenLoop::Step TokenLoop::next(std::span<const float> logits, int n_fed, int n_ctx) {
  Step step;
  const auto end = [&](FinishReason reason, bool release) {
    ended_ = true;
    if (release) step.text += release_held();
    step.finish = reason;
    return step;
  };
  if (ended_) return end(FinishReason::Cancelled, false);
  if (limits_.max_tokens == 0) return end(FinishReason::MaxTokens, true);
  const std::span<const float> allowed = constrain(logits);
  const int32_t token = sampler_.sample(allowed);
  sampler_.accept(token);
  follow_grammar(token);
  if (!limits_.ignore_eos && vocab_.is_end_of_generation(token)) return end(FinishReason::EndOfGeneration, true);
  tokens_.push_back(token);
  if (logprobs_ >= 0) step.logprob = token_logprob(allowed, token, logprobs_);
  std::string text;
  detok_.push(token, text);
  step.text = stops_.push(text);
  if (stops_.stopped()) {
    // The request's own stop string, or an end token spelled out in text.
    const auto& user = limits_.stop;
    const bool user_stop = std::find(user.begin(), user.begin() + static_cast<std::ptrdiff_t>(user_stops_),
                                     stops_.matched()) != user.begin() + static_cast<std::ptrdiff_t>(user_stops_);
    return end(user_stop ? FinishReason::StopString : FinishReason::EndOfGeneration, false);
  }
  // A grammar that has matched all it can ends the answer here, as its end
  // token would (a vocabulary may have no end token to draw).
  if (constraint_ && constraint_->finished()) return end(FinishReason::EndOfGeneration, true);
  if (n_fed >= n_ctx) return end(FinishReason::ContextFull, true);
  if (limits_.max_tokens >= 0 && generated() >= limits_.max_tokens) return end(FinishReason::MaxTokens, true);
  step.token = token;
  return step;
}

std::string TokenLoop::finish() {
  if (ended_) return {};
  ended_ = true;
  return release_held();
}

}  // namespace m40::engine

// What follows each forward step of an answer, written once for every
// caller (the one-shot Generator, the server's Scheduler, the CLI chat):
// sample the next token, decide whether the answer ends and why, and turn
// the tokens into text that is safe to show — whole UTF-8 characters,
// nothing of a stop string, nothing of an end-of-generation token. A model
// that spells its end token out in plain text (TinyStories writes
// "<|end_story|>" as ordinary pieces before its EOS) ends there too, as an
// Ollama Modelfile's stop parameter would make it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/stop_strings.h"
#include "grammar/grammar.h"
#include "grammar/token_constraint.h"
#include "grammar/token_vocabulary.h"
#include "tokenizer/vocab.h"

namespace m40::engine {

enum class FinishReason { EndOfGeneration, StopString, MaxTokens, ContextFull, Cancelled };
std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", ...

struct AnswerLimits {
  int max_tokens = -1;            // -1: until the context is full
  std::vector<std::string> stop;  // stop strings (not shown)
  bool ignore_eos = false;        // keep going past end-of-generation tokens (and their text)
};

// Constrained decoding (structured output, forced tool calls): only tokens
// the grammar allows are drawn, and end-of-generation only where the
// grammar is complete. With `starts_after` (a reasoning model's thinking
// close tag, "</think>"), the answer is free until that text has been
// generated and the grammar applies to what follows it.
struct AnswerGrammar {
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary;  // the model's, built once
  std::string starts_after;
  explicit operator bool() const { return grammar != nullptr; }
};

// A sampled token's log-probability under the model's distribution (the
// log-softmax of its logits, before temperature, penalties or truncation,
// as OpenAI reports them), and the most likely alternatives.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// The log-probability of `token` and of the `top` most likely tokens.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

class TokenLoop {
 public:
  // The prompt's tokens enter the sampler's penalty window (as in
  // llama.cpp). Throws m40::Error for bad sampler parameters.
  // `logprobs` >= 0: each step reports the sampled token's log-probability
  // and that many alternatives (-1: none); under a grammar, of the
  // distribution the token was drawn from (the grammar's mask applied).
  TokenLoop(const tokenizer::Vocab& vocab, const SamplerParams& sampler, int n_vocab, AnswerLimits limits,
            std::span<const int32_t> prompt, int logprobs = -1, const AnswerGrammar& grammar = {});

  struct Step {
    std::string text;                    // to show now (may be empty)
    std::optional<FinishReason> finish;  // the answer ends here; `text` then holds all that was held back
    int32_t token = -1;                  // otherwise: the token to feed next
    // The sampled token's, when asked for (none for an end-of-generation
    // token, which is not part of the answer).
    std::optional<TokenLogprob> logprob;
  };
  // After the step whose logits these are, when the context holds `n_fed`
  // positions of at most `n_ctx`: samples the next token and says what to
  // show and whether the answer goes on.
  Step next(std::span<const float> logits, int n_fed, int n_ctx);

  // Ends the answer for a reason from outside (cancelled, the KV pool full,
  // shutting down): the text held back, to show where the answer is kept.
  std::string finish();

  int generated() const { return static_cast<int>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // sampled and shown (end tokens excluded)

 private:
  std::string release_held();
  std::span<const float> constrain(std::span<const float> logits);
  void follow_grammar(int32_t token);

  const tokenizer::Vocab& vocab_;
  Sampler sampler_;
  AnswerLimits limits_;
  tokenizer::StreamingDetokenizer detok_;
  StopStringFilter stops_;
  size_t user_stops_;  // stops_ holds the request's stop strings, then the end tokens' texts
  int logprobs_;
  std::vector<int32_t> tokens_;
  bool ended_ = false;
  // Under a grammar: the constraint once it applies, the text generated
  // while waiting for `starts_after` (its tail), and the masked logits.
  std::optional<grammar::TokenConstraint> constraint_;
  AnswerGrammar grammar_;
  std::string before_grammar_;
  std::vector<float> masked_;
};

}  // namespace m40::engine

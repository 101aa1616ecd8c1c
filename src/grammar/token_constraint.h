// The grammar constraint of one generated sequence: which tokens may come
// next, as a logit mask for the sampler.
//
//   auto vocab = std::make_shared<TokenVocabulary>(pieces, eog);   // once per model
//   TokenConstraint c(parse_gbnf(json_schema_to_gbnf(schema)), vocab);
//   for (;;) {
//     c.mask(logits);              // -inf for every token not allowed
//     int32_t t = sample(logits);
//     c.accept(t);
//     if (vocab->is_end_of_generation(t)) break;
//   }
//
// Not thread-safe (one per sequence); the Grammar and TokenVocabulary may be
// shared by any number of them across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "grammar/grammar.h"
#include "grammar/token_vocabulary.h"

namespace m40::grammar {

class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab);
  ~TokenConstraint();
  TokenConstraint(TokenConstraint&&) noexcept;
  TokenConstraint& operator=(TokenConstraint&&) noexcept;

  // Sets logits[t] = -infinity for every token the grammar does not allow
  // next. End-of-generation tokens are allowed exactly when the grammar is
  // complete here. logits.size() is the vocabulary size (entries past the
  // vocabulary, as in models with padded output rows, are set to -infinity).
  void mask(std::span<float> logits);
  // Whether `token` may come next (cheap for one token: the sampler may try
  // its choice first and mask only when it is refused).
  bool allows(int32_t token);
  // Advances past a token; throws GrammarError if it is not allowed.
  // End-of-generation tokens are accepted when the grammar is complete.
  void accept(int32_t token);
  // The grammar has matched a whole root and nothing more can follow (no
  // token but end-of-generation is allowed), or end-of-generation was accepted.
  bool finished() const;
  // The text so far is a complete root (more may still follow).
  bool can_end() const;

  // The allowed tokens as a bitset over the vocabulary (bit t of word t/64),
  // valid until the next call. mask() applies exactly this.
  std::span<const uint64_t> allowed_bits();
  // Some token (an end token included) may come next: false when the
  // vocabulary cannot spell anything the grammar takes here.
  bool allows_any();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace m40::grammar

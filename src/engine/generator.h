// One sequence from prompt to finish: the prompt in batches, then one token
// per step through the TokenLoop (sampling, UTF-8-safe text, the end
// checks), until an end-of-generation token, a stop string, the token limit
// or the end of the context. The one-shot `run` uses it; the server's scheduler interleaves
// many such sequences itself.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "engine/sampler.h"
#include "engine/token_loop.h"
#include "tokenizer/vocab.h"

namespace m40::engine {

struct GenerationOptions {
  SamplerParams sampler;
  int max_tokens = -1;              // -1: until the context is full
  std::vector<std::string> stop;    // stop strings (not shown)
  bool ignore_eos = false;          // keep going past end-of-generation tokens
  int batch_size = 512;             // prompt tokens per forward step
  int seq = 0;                      // the backend's KV slot
  AnswerGrammar grammar;            // constrained decoding (answer_grammar.h), or none
};

struct GenerationResult {
  FinishReason finish_reason = FinishReason::EndOfGeneration;
  std::vector<int32_t> tokens;   // generated token ids
  int prompt_tokens = 0;
  double prompt_seconds = 0;
  double generate_seconds = 0;   // from the first sampled token to the end
};

class Generator {
 public:
  Generator(backend::Backend& backend, const tokenizer::Vocab& vocab);

  // Runs the prompt and generates. `on_text` receives each piece of text as
  // it becomes final and returns false to cancel. `last_prompt_logits`, when
  // given, receives the logits at the last prompt position. Throws m40::Error
  // when the prompt does not fit in the context (with the numbers) or is empty.
  GenerationResult generate(std::span<const int32_t> prompt, const GenerationOptions& options,
                            const std::function<bool(std::string_view)>& on_text,
                            std::vector<float>* last_prompt_logits = nullptr);

 private:
  backend::Backend& backend_;
  const tokenizer::Vocab& vocab_;
};

}  // namespace m40::engine

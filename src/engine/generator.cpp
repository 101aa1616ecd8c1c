#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace m40::engine {

Generator::Generator(backend::Backend& backend, const tokenizer::Vocab& vocab) : backend_(backend), vocab_(vocab) {
  if (static_cast<size_t>(backend.n_vocab()) < vocab.size()) {
    throw Error("the tokenizer has " + std::to_string(vocab.size()) + " tokens but the model only " +
                std::to_string(backend.n_vocab()));
  }
}

GenerationResult Generator::generate(std::span<const int32_t> prompt, const GenerationOptions& options,
                                     const std::function<bool(std::string_view)>& on_text,
                                     std::vector<float>* last_prompt_logits) {
  using clock = std::chrono::steady_clock;
  const int n_ctx = backend_.n_ctx();
  const int n_prompt = static_cast<int>(prompt.size());
  if (n_prompt == 0) throw Error("the prompt is empty");
  if (n_prompt >= n_ctx) {
    throw Error("the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx) + " (leaving room for at least one new token): shorten the prompt or raise --ctx");
  }
  const int n_vocab = backend_.n_vocab();
  for (int32_t t : prompt) vocab_.check_id(t);
  TokenLoop loop(vocab_, options.sampler, n_vocab, {options.max_tokens, options.stop, options.ignore_eos}, prompt, -1,
                 options.grammar);

  GenerationResult result;
  result.prompt_tokens = n_prompt;
  std::vector<float> logits(n_vocab);
  backend::Batch batch;
  const auto prompt_start = clock::now();
  const int chunk = std::max(1, options.batch_size);
  for (int begin = 0; begin < n_prompt; begin += chunk) {
    const int end = std::min(n_prompt, begin + chunk);
    batch.clear();
    for (int i = begin; i < end; ++i) batch.add(prompt[i], i, options.seq, i + 1 == n_prompt);
    backend_.forward(batch, logits);
  }
  result.prompt_seconds = std::chrono::duration<double>(clock::now() - prompt_start).count();
  if (last_prompt_logits != nullptr) *last_prompt_logits = logits;

  const auto generate_start = clock::now();
  int pos = n_prompt;
  for (;;) {
    TokenLoop::Step step = loop.next(logits, pos, n_ctx);
    // A caller that stops reading cancels the answer.
    if (!step.text.empty() && !on_text(step.text)) {
      result.finish_reason = FinishReason::Cancelled;
      break;
    }
    if (step.finish) {
      result.finish_reason = *step.finish;
      break;
    }
    batch.clear();
    batch.add(step.token, pos++, options.seq, true);
    backend_.forward(batch, logits);
  }
  result.tokens = loop.tokens();
  result.generate_seconds = std::chrono::duration<double>(clock::now() - generate_start).count();
  return result;
}

}  // namespace m40::engine

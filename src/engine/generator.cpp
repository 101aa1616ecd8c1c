#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "engine/stop_strings.h"

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
  Sampler sampler(options.sampler, n_vocab);
  for (int32_t t : prompt) {
    vocab_.check_id(t);
    sampler.accept(t);
  }

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

  tokenizer::StreamingDetokenizer detok(vocab_, {.render_special = false, .sequence_start = false});
  StopStringFilter stops(options.stop);
  std::string text;
  auto emit = [&](const std::string& piece) { return piece.empty() || on_text(piece); };

  const auto generate_start = clock::now();
  int pos = n_prompt;
  result.finish_reason = FinishReason::MaxTokens;
  while (options.max_tokens != 0) {
    const int32_t token = sampler.sample(logits);
    sampler.accept(token);
    if (!options.ignore_eos && vocab_.is_end_of_generation(token)) {
      result.finish_reason = FinishReason::EndOfGeneration;
      break;
    }
    result.tokens.push_back(token);
    text.clear();
    detok.push(token, text);
    if (!emit(stops.push(text))) {
      result.finish_reason = FinishReason::Cancelled;
      break;
    }
    if (stops.stopped()) {
      result.finish_reason = FinishReason::StopString;
      break;
    }
    if (pos >= n_ctx) {
      result.finish_reason = FinishReason::ContextFull;
      break;
    }
    if (options.max_tokens >= 0 && static_cast<int>(result.tokens.size()) >= options.max_tokens) {
      result.finish_reason = FinishReason::MaxTokens;
      break;
    }
    batch.clear();
    batch.add(token, pos++, options.seq, true);
    backend_.forward(batch, logits);
  }
  if (result.finish_reason != FinishReason::Cancelled && result.finish_reason != FinishReason::StopString) {
    text.clear();
    detok.flush(text);
    std::string rest = stops.push(text);
    if (!stops.stopped()) rest += stops.flush();
    emit(rest);
  }
  result.generate_seconds = std::chrono::duration<double>(clock::now() - generate_start).count();
  return result;
}

}  // namespace m40::engine

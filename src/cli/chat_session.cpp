#include "cli/chat_session.h"

#include <algorithm>
#include <chrono>

#include "engine/token_loop.h"

namespace m40::cli {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
}  // namespace

ChatSession::ChatSession(backend::Backend& backend, const tokenizer::Vocab& vocab, chat::ModelChatTemplate chat_template)
    : backend_(backend), vocab_(vocab), template_(std::move(chat_template)) {
  if (static_cast<size_t>(backend.n_vocab()) < vocab.size()) {
    throw Error("the tokenizer has " + std::to_string(vocab.size()) + " tokens but the model only " +
                std::to_string(backend.n_vocab()));
  }
}

std::vector<int32_t> ChatSession::render_prompt(const nlohmann::ordered_json& messages) const {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  if (!system_.empty()) all.push_back({{"role", "system"}, {"content", system_}});
  for (const auto& m : messages) all.push_back(m);
  auto options = template_.options();
  options.add_generation_prompt = true;
  // The rendered text carries BOS where the template wants it.
  return vocab_.encode(template_.render(all, options), {.add_special = false, .parse_special = true});
}

bool ChatSession::prefill(const std::vector<int32_t>& prompt, int batch_size, std::vector<float>& logits,
                          const std::atomic<bool>& cancel, int& reused) {
  const size_t n = prompt.size();
  size_t common = 0;
  while (common < cached_.size() && common < n && cached_[common] == prompt[common]) ++common;
  // The last prompt token is always run again: its logits pick the first
  // answer token, and the cache keeps K/V, not logits.
  common = std::min(common, n - 1);
  reused = static_cast<int>(common);
  cached_.resize(common);  // positions past it are overwritten (the backend allows rewinding)

  backend::Batch batch;
  const size_t chunk = static_cast<size_t>(std::max(1, batch_size));
  for (size_t begin = common; begin < n; begin += chunk) {
    if (cancel.load()) return false;
    const size_t end = std::min(n, begin + chunk);
    batch.clear();
    for (size_t i = begin; i < end; ++i) batch.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == n);
    try {
      backend_.forward(batch, logits);
    } catch (...) {
      cached_.clear();  // what the failed step left in the cache is unknown
      throw;
    }
    cached_.insert(cached_.end(), prompt.begin() + static_cast<std::ptrdiff_t>(begin),
                   prompt.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return true;
}

TurnResult ChatSession::send(const std::string& user_message, const engine::GenerationOptions& options,
                             const std::function<void(std::string_view)>& on_text, const std::atomic<bool>& cancel) {
  auto messages = messages_;
  messages.push_back({{"role", "user"}, {"content", user_message}});
  const std::vector<int32_t> prompt = render_prompt(messages);
  const int n_ctx = backend_.n_ctx();
  if (prompt.empty()) throw Error("the chat template rendered an empty prompt");
  if (prompt.size() >= static_cast<size_t>(n_ctx)) {
    throw ContextOverflow("the conversation is " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                          std::to_string(n_ctx) + " holds with room for an answer: /clear to start over" +
                          (messages_.empty() ? " (or raise --ctx)" : ""));
  }
  for (int32_t t : prompt) vocab_.check_id(t);
  messages_ = std::move(messages);
  try {
    return answer(prompt, options, on_text, cancel);
  } catch (...) {
    // A turn that fails leaves the conversation as it was before it; the
    // cache stays valid for the prefix it still records (prefill() and the
    // loop clear it where a failed step left it unknown).
    messages_.erase(messages_.size() - 1);
    throw;
  }
}

TurnResult ChatSession::answer(const std::vector<int32_t>& prompt, const engine::GenerationOptions& options,
                               const std::function<void(std::string_view)>& on_text, const std::atomic<bool>& cancel) {
  const int n_ctx = backend_.n_ctx();
  TurnResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  engine::TokenLoop loop(vocab_, options.sampler, backend_.n_vocab(),
                         {options.max_tokens, options.stop, options.ignore_eos}, prompt);
  std::vector<float> logits(static_cast<size_t>(backend_.n_vocab()));
  const auto prompt_start = Clock::now();
  const bool prefilled = prefill(prompt, options.batch_size, logits, cancel, result.reused_tokens);
  result.prompt_seconds = seconds_since(prompt_start);

  const auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    result.answer += piece;
    on_text(piece);
  };
  const auto generate_start = Clock::now();
  int pos = static_cast<int>(prompt.size());
  result.finish_reason = engine::FinishReason::Cancelled;
  backend::Batch batch;
  while (prefilled) {
    engine::TokenLoop::Step step = loop.next(logits, pos, n_ctx);
    emit(step.text);
    if (step.finish) {
      result.finish_reason = *step.finish;
      break;
    }
    if (cancel.load()) break;
    batch.clear();
    batch.add(step.token, pos++, 0, true);
    try {
      backend_.forward(batch, logits);
    } catch (...) {
      cached_.clear();
      throw;
    }
    cached_.push_back(step.token);
  }
  // A cancelled answer is kept as far as it got, held-back text included.
  if (result.finish_reason == engine::FinishReason::Cancelled) emit(loop.finish());
  result.generated_tokens = loop.generated();
  result.generate_seconds = seconds_since(generate_start);
  messages_.push_back({{"role", "assistant"}, {"content", result.answer}});
  return result;
}

}  // namespace m40::cli

#include "cli/chat_session.h"

#include <algorithm>
#include <chrono>

#include <memory>

namespace m40::cli {

ChatSession::ChatSession(backend::Backend& backend, const tokenizer::Vocab& vocab, chat::ModelChatTemplate chat_template,
                         int batch_size)
    : backend_(backend),
      vocab_(vocab),
      template_(std::move(chat_template)),
      // One slot and one turn at a time: no pacing, prompts in whole chunks.
      scheduler_(std::make_unique<engine::Scheduler>(
          backend, vocab,
          engine::SchedulerOptions{.max_queue = 0, .prefill_chunk = std::max(1, batch_size), .prefill_slowdown = 0})) {}

std::vector<int32_t> ChatSession::render_prompt(const nlohmann::ordered_json& messages) const {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  if (!system_.empty()) all.push_back({{"role", "system"}, {"content", system_}});
  for (const auto& m : messages) all.push_back(m);
  auto options = template_.options();
  options.add_generation_prompt = true;
  // The rendered text carries BOS where the template wants it.
  return vocab_.encode(template_.render(all, options), {.add_special = false, .parse_special = true});
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
    // A turn that fails leaves the conversation as it was before it (the
    // KV pool keeps only blocks whose every position was computed).
    messages_.erase(messages_.size() - 1);
    throw;
  }
}

TurnResult ChatSession::answer(const std::vector<int32_t>& prompt, const engine::GenerationOptions& options,
                               const std::function<void(std::string_view)>& on_text, const std::atomic<bool>& cancel) {
  engine::RequestParams params;
  params.prompt = prompt;
  params.sampler = options.sampler;
  params.max_tokens = options.max_tokens;
  params.stop = options.stop;
  params.ignore_eos = options.ignore_eos;
  params.grammar = options.grammar;
  const auto stream = scheduler_->submit(std::move(params));

  TurnResult result;
  bool cancelled = false;
  std::vector<engine::StreamEvent> events;
  for (;;) {
    events.clear();
    stream->wait(std::chrono::milliseconds(20), events);
    if (!cancelled && cancel.load()) {
      stream->cancel();  // the engine stops at its next step; what it made so far still comes
      cancelled = true;
    }
    for (auto& e : events) {
      switch (e.kind) {
        case engine::StreamEvent::Kind::Text:
          result.answer += e.text;
          on_text(e.text);
          break;
        case engine::StreamEvent::Kind::Failed: throw Error(e.text);
        case engine::StreamEvent::Kind::Done:
          result.finish_reason = e.finish_reason;
          result.prompt_tokens = e.timings.prompt_tokens;
          result.reused_tokens = e.timings.cached_tokens;
          result.generated_tokens = e.timings.generated_tokens;
          result.prompt_seconds = e.timings.prompt_seconds;
          result.generate_seconds = e.timings.generate_seconds;
          messages_.push_back({{"role", "assistant"}, {"content", result.answer}});
          return result;
      }
    }
  }
}

}  // namespace m40::cli

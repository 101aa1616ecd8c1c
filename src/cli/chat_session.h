// A conversation with one model, as `m40-llm run` holds it interactively:
// the messages so far, rendered through the model's chat template each turn
// and answered by the engine's Scheduler (one slot), whose paged KV cache
// reuses the whole blocks a turn shares with the turns before it: a turn
// whose rendered prompt starts like the last one reads only the rest; one
// that diverges (a template that rewrites earlier turns, /clear, a new
// system message) reuses what still matches. The session owns the
// backend's cache: one session per backend.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "chat/model_template.h"
#include "common/error.h"
#include "engine/generator.h"
#include "engine/scheduler.h"
#include "tokenizer/vocab.h"

namespace m40::cli {

// The conversation is longer than the context: nothing was run, and the
// user message that made it so is not kept.
class ContextOverflow : public Error {
 public:
  using Error::Error;
};

struct TurnResult {
  std::string answer;             // the text shown (stop strings excluded)
  engine::FinishReason finish_reason = engine::FinishReason::EndOfGeneration;
  int prompt_tokens = 0;          // the whole rendered conversation
  int reused_tokens = 0;          // of those, read from cached KV blocks
  int generated_tokens = 0;
  double prompt_seconds = 0;      // prefill of the new tokens
  double generate_seconds = 0;
};

class ChatSession {
 public:
  // Prompts are read `batch_size` tokens a step.
  ChatSession(backend::Backend& backend, const tokenizer::Vocab& vocab, chat::ModelChatTemplate chat_template,
              int batch_size = 512);

  // Adds the user's message, answers it streaming through `on_text`, and
  // keeps both (options.batch_size is the session's). `cancel` is polled
  // while the answer runs; a cancelled answer is kept as far as it got (as
  // Ollama does). Throws ContextOverflow, leaving the
  // conversation as it was, when the rendered conversation does not fit;
  // any other failure (the template raising, the backend failing, a token
  // out of range) also leaves the conversation as it was before the turn.
  TurnResult send(const std::string& user_message, const engine::GenerationOptions& options,
                  const std::function<void(std::string_view)>& on_text, const std::atomic<bool>& cancel);

  // The system message that leads every rendering ("" for none).
  void set_system(std::string system) { system_ = std::move(system); }
  const std::string& system() const { return system_; }
  // Forgets the messages (the system message stays).
  void clear() { messages_ = nlohmann::ordered_json::array(); }

  const nlohmann::ordered_json& messages() const { return messages_; }
  // The conversation as the template renders it, ready for the next answer.
  std::vector<int32_t> render_prompt(const nlohmann::ordered_json& messages) const;
  int n_ctx() const { return backend_.n_ctx(); }
  const chat::ModelChatTemplate& chat_template() const { return template_; }

 private:
  // Answers `prompt` (the conversation with the new user message, already
  // in messages_), adding the answer to messages_.
  TurnResult answer(const std::vector<int32_t>& prompt, const engine::GenerationOptions& options,
                    const std::function<void(std::string_view)>& on_text, const std::atomic<bool>& cancel);

  backend::Backend& backend_;
  const tokenizer::Vocab& vocab_;
  chat::ModelChatTemplate template_;
  std::string system_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  std::unique_ptr<engine::Scheduler> scheduler_;  // after what it uses: stops first
};

}  // namespace m40::cli

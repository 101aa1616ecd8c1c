// A conversation with one model, as `m40-llm run` holds it interactively:
// the messages so far, rendered through the model's chat template each turn,
// and the tokens the backend's KV cache holds. A turn whose rendered prompt
// starts with tokens already in the cache prefills only the rest; one that
// diverges (a template that rewrites earlier turns, /clear, a new system
// message) rewinds to the common prefix and prefills from there.
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
  int reused_tokens = 0;          // of those, already in the KV cache
  int generated_tokens = 0;
  double prompt_seconds = 0;      // prefill of the new tokens
  double generate_seconds = 0;
};

class ChatSession {
 public:
  ChatSession(backend::Backend& backend, const tokenizer::Vocab& vocab, chat::ModelChatTemplate chat_template);

  // Adds the user's message, answers it streaming through `on_text`, and
  // keeps both. `cancel` is polled between steps; a cancelled answer is kept
  // as far as it got (as Ollama does). Throws ContextOverflow, leaving the
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
  // Makes the next turn prefill the whole conversation, as when someone
  // else used the backend's cache meanwhile.
  void forget_cache() { cached_.clear(); }
  // Tokens the KV cache holds for the next turn to build on.
  const std::vector<int32_t>& cached_tokens() const { return cached_; }
  int n_ctx() const { return backend_.n_ctx(); }
  const chat::ModelChatTemplate& chat_template() const { return template_; }

 private:
  // Prefills `prompt` (the conversation with the new user message, already
  // in messages_) and generates the answer, adding it to messages_.
  TurnResult answer(const std::vector<int32_t>& prompt, const engine::GenerationOptions& options,
                    const std::function<void(std::string_view)>& on_text, const std::atomic<bool>& cancel);
  // Runs `prompt` from the longest prefix already cached; leaves the logits
  // of its last token. False when cancelled before the end.
  bool prefill(const std::vector<int32_t>& prompt, int batch_size, std::vector<float>& logits,
               const std::atomic<bool>& cancel, int& reused);

  backend::Backend& backend_;
  const tokenizer::Vocab& vocab_;
  chat::ModelChatTemplate template_;
  std::string system_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  std::vector<int32_t> cached_;  // token at each position of sequence 0 the cache holds
};

}  // namespace m40::cli

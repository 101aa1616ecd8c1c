// Queueing a request and delivering its answer, whole or streamed: what
// the OpenAI and Ollama generation routes share.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "server/http_message.h"
#include "server/model_manager.h"
#include "server/server_context.h"

namespace m40::server {

// Queues a request; RequestRejected becomes HttpError (400 / 503).
// For a request with "truncate": true: a prompt that does not fit the
// context keeps its BOS and its last tokens, leaving room for the answer
// (the token limit, at most half the context). Shorter prompts are unchanged.
void truncate_prompt(const ResidentModel& m, engine::RequestParams& params);
// The context a request runs in: its own n_ctx (Ollama's num_ctx), at most
// the resident model's.
int request_context(const ResidentModel& m, const engine::RequestParams& params);
// `n` answers (choices) to the prompt: Scheduler::submit.
std::shared_ptr<engine::RequestStream> submit(ResidentModel& m, engine::RequestParams params, int n = 1);
// Several prompts with `n` answers each on one stream (prompt p's choice i
// is choice p * n + i).
std::shared_ptr<engine::RequestStream> submit(ResidentModel& m, std::vector<engine::RequestParams> prompts, int n);

struct Completion {
  std::string text;
  engine::FinishReason finish_reason = engine::FinishReason::EndOfGeneration;
  engine::RequestTimings timings;
  std::vector<engine::TokenLogprob> logprobs;  // with RequestParams::logprobs
  std::vector<int32_t> answer_tokens;          // the tokens generated (Ollama's context)
  std::vector<float> embedding;                // an embedding request's vector
};
// Waits for every choice's whole answer (by choice); HttpError 500 when the
// engine failed, 503 when the server stops. A client that closes its
// connection meanwhile cancels the request.
std::vector<Completion> collect(ServerContext& s, const HttpRequest& req, engine::RequestStream& stream);

// Streams the answer as chunks: `on_start` for each choice first (may be
// empty), `on_text` for each piece, `on_end` for each choice's Done event,
// then `on_finish` (may be empty) once every choice has ended; or
// `on_error` for a failure or the server stopping (the stream's last chunk:
// it ends an SSE stream with `data: [DONE]` itself). A client that goes
// away cancels the request. The lease keeps the model loaded until the
// stream ends.
struct StreamFormat {
  std::function<std::string(int choice)> on_start;
  std::function<std::string(const engine::StreamEvent& piece)> on_text;  // its text, choice and logprobs
  std::function<std::string(const engine::StreamEvent& done)> on_end;
  std::function<std::string(const std::vector<engine::StreamEvent>& ends)> on_finish;
  std::function<std::string(const std::string& message)> on_error;
};
void stream_response(ServerContext& s, HttpResponse& res, const char* content_type,
                     std::shared_ptr<engine::RequestStream> stream, std::shared_ptr<ModelLease> lease,
                     StreamFormat format);

// Chat prompts: feature_chat_prompt (chat_features.h).
// Tokens of a plain prompt (BOS as the vocabulary asks, special tokens parsed).
std::vector<int32_t> raw_prompt(ResidentModel& m, const std::string& text, bool truncate, int n_ctx);

}  // namespace m40::server

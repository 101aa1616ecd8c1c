// Queueing a request on the resident model's scheduler and delivering its
// answer, whole or streamed: what the OpenAI and Ollama generation routes share.
#include "server/generation.h"

#include "common/error.h"
#include "model/hparams.h"
#include "server/prompt_tokens.h"

namespace m40::server {

int request_context(const ResidentModel& m, const engine::RequestParams& params) {
  return m.scheduler->context_of(params);
}

void truncate_prompt(const ResidentModel& m, engine::RequestParams& params) {
  const int n_ctx = request_context(m, params);
  auto& prompt = params.prompt;
  if (static_cast<int>(prompt.size()) < n_ctx || n_ctx < 4) return;
  // Room to answer: the token limit when it is at most half the context,
  // else half the context.
  const int room = params.max_tokens > 0 ? std::min(params.max_tokens, n_ctx / 2) : n_ctx / 2;
  const int keep = n_ctx - room;
  const bool has_bos = prompt.front() == m.vocab->special().bos && m.vocab->special().bos != tokenizer::kNoToken;
  std::vector<int32_t> kept;
  kept.reserve(static_cast<size_t>(keep));
  if (has_bos) kept.push_back(prompt.front());
  kept.insert(kept.end(), prompt.end() - (keep - static_cast<int>(kept.size())), prompt.end());
  prompt = std::move(kept);
}

namespace {

// Sampler values that would overflow a logit of any real model (the
// sampler's own domain is wider: repeat_penalty 1e-40 is > 0, and turned a
// logit into +inf mid-answer, a 500 for the client's mistake). Logits are
// far below 1e6 in magnitude, so within these bounds every adjusted logit
// stays finite.
void check_sampling(const engine::SamplerParams& p) {
  auto within = [](const char* name, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) {
      throw HttpError{400, std::string("'") + name + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
                               ", got " + json(v).dump()};
    }
  };
  within("repeat_penalty", p.repeat_penalty, 1e-6, 1e6);
  within("presence_penalty", p.presence_penalty, -1e6, 1e6);
  within("frequency_penalty", p.frequency_penalty, -1e6, 1e6);
  for (const auto& [token, bias] : p.logit_bias) within("logit_bias", bias, -100, 100);  // OpenAI's range
}

}  // namespace

std::shared_ptr<engine::RequestStream> submit(ResidentModel& m, engine::RequestParams params, int n) {
  std::vector<engine::RequestParams> one;
  one.push_back(std::move(params));
  return submit(m, std::move(one), n);
}

std::shared_ptr<engine::RequestStream> submit(ResidentModel& m, std::vector<engine::RequestParams> prompts, int n) {
  using R = engine::RequestRejected::Reason;
  // An embedding model (its file declares a pooling) answers embeddings
  // only, as Ollama has it: its head was not trained to generate.
  for (const auto& p : prompts) {
    if (!p.embed && m.model->hparams.is_embedding_model()) {
      throw HttpError{400, "the model '" + m.name + "' does not support generate: it is an embedding model (" +
                               std::string(model::pooling_type_name(*m.model->hparams.pooling)) + " pooling)"};
    }
  }
  for (const auto& p : prompts) check_sampling(p.sampler);
  try {
    return m.scheduler->submit(std::move(prompts), n);
  } catch (const engine::RequestRejected& e) {
    switch (e.reason()) {
      case R::Invalid: throw HttpError{400, e.what()};
      case R::QueueFull: throw HttpError{503, e.what(), "server_busy", "queue_full"};
      case R::ShuttingDown: throw HttpError{503, e.what(), "server_error", "shutting_down"};
    }
    throw;
  }
}

std::vector<Completion> collect(ServerContext& s, const HttpRequest& req, engine::RequestStream& stream) {
  std::vector<Completion> out(static_cast<size_t>(stream.choices()));
  size_t done = 0;
  auto next_check = Clock::now() + std::chrono::milliseconds(100);
  std::vector<engine::StreamEvent> events;
  for (;;) {
    events.clear();
    const bool got = stream.wait(std::chrono::milliseconds(100), events);
    if (!got && s.stopping.load()) {
      stream.cancel();
      throw HttpError{503, "the server is shutting down", "server_error", "shutting_down"};
    }
    // Text may flow without pause, so the check goes by the clock.
    if (Clock::now() >= next_check) {
      next_check = Clock::now() + std::chrono::milliseconds(100);
      if (req.client_gone()) {
        // Nobody will read the answer: free the slot now.
        stream.cancel();
        throw HttpError{499, "the client closed the connection", "invalid_request_error", "client_closed"};
      }
    }
    for (auto& e : events) {
      Completion& c = out[static_cast<size_t>(e.choice)];
      switch (e.kind) {
        case engine::StreamEvent::Kind::Text:
          c.text += e.text;
          c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
          break;
        case engine::StreamEvent::Kind::Done:
          c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
          c.finish_reason = e.finish_reason;
          c.timings = e.timings;
          c.answer_tokens = std::move(e.answer_tokens);
          c.embedding = std::move(e.embedding);
          if (++done == out.size()) return out;
          break;
        case engine::StreamEvent::Kind::Failed:
          stream.cancel();  // the other choices too
          // Stopping ends every request with a failure: not the engine's fault.
          if (s.stopping.load()) throw HttpError{503, "the server is shutting down", "server_error", "shutting_down"};
          throw HttpError{500, e.text, "server_error"};
      }
    }
  }
}

void stream_response(ServerContext& s, HttpResponse& res, const char* content_type,
                     std::shared_ptr<engine::RequestStream> stream, std::shared_ptr<ModelLease> lease,
                     StreamFormat format) {
  // Whatever ends the response (done, a failed write, a closed connection,
  // a dropped stream), the request must not keep its slot, nor the model.
  struct Release {
    std::shared_ptr<engine::RequestStream> stream;
    std::shared_ptr<ModelLease> lease;
    ~Release() {
      if (stream) stream->cancel();
      if (lease) lease->release();
    }
  };
  auto held = std::make_shared<Release>();
  held->stream = std::move(stream);
  held->lease = std::move(lease);
  res.set_header("Cache-Control", "no-cache");
  res.set_stream(content_type, [state = &s, held, format = std::move(format)](ResponseWriter& out) {
    auto& request = *held->stream;
    if (format.on_start) {
      std::string start;
      for (int c = 0; c < request.choices(); ++c) start += format.on_start(c);
      if (!out.write(start)) return;
    }
    std::vector<engine::StreamEvent> events;
    std::vector<engine::StreamEvent> ends;
    for (;;) {
      events.clear();
      while (!request.wait(std::chrono::milliseconds(100), events)) {
        if (state->stopping.load()) {
          out.write(format.on_error("the server is shutting down"));
          return;
        }
        if (out.client_gone()) return;
      }
      std::string text;
      for (auto& e : events) {
        switch (e.kind) {
          case engine::StreamEvent::Kind::Text: text += format.on_text(e); break;
          case engine::StreamEvent::Kind::Done:
            text += format.on_end(e);
            ends.push_back(e);
            if (static_cast<int>(ends.size()) < request.choices()) break;
            if (format.on_finish) text += format.on_finish(ends);
            out.write(text);
            return;
          case engine::StreamEvent::Kind::Failed:
            out.write(text + format.on_error(state->stopping.load() ? "the server is shutting down" : e.text));
            return;
        }
      }
      if (!out.write(text)) return;  // the client went away
    }
  });
}

std::vector<int32_t> raw_prompt(ResidentModel& m, const std::string& text, bool truncate, int n_ctx) {
  return prompt_tokens(*m.vocab, m.max_token_bytes, n_ctx, text, true, truncate);
}

}  // namespace m40::server

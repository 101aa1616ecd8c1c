// What the scheduler tests share: a greedy request whose answer depends on
// its prompt alone, and reading a request's stream to its end.
#pragma once

#include <algorithm>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace m40::test {

// Greedy, no repetition penalty, no end token: the answer depends on the
// prompt alone.
inline engine::RequestParams greedy(std::vector<int32_t> prompt, int max_tokens) {
  engine::RequestParams p;
  p.prompt = std::move(prompt);
  p.sampler.temperature = 0;
  p.sampler.repeat_penalty = 1.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// The text of a stream's pieces and the event that ended it.
struct Collected {
  std::string text;
  engine::StreamEvent end;
};

inline Collected drain(engine::RequestStream& stream) {
  Collected out;
  std::vector<engine::StreamEvent> events;
  for (int idle = 0; idle < 300;) {  // at most 30 s without an event
    events.clear();
    if (!stream.wait(std::chrono::milliseconds(100), events)) {
      ++idle;
      continue;
    }
    for (auto& e : events) {
      if (e.kind == engine::StreamEvent::Kind::Text) {
        out.text += e.text;
      } else {
        out.end = std::move(e);
        return out;
      }
    }
  }
  ADD_FAILURE() << "the stream did not end";
  return out;
}

// The positions a request for `prompt` finds cached after a sequence fed
// `fed` (and gave its blocks back, whole ones indexed, the last partly
// filled one on offer): their common beginning, but for the prompt's last
// token, which is always fed.
inline int reusable_positions(const std::vector<int32_t>& fed, const std::vector<int32_t>& prompt) {
  const size_t n = std::min(fed.size(), prompt.size() - 1);
  size_t common = 0;
  while (common < n && fed[common] == prompt[common]) ++common;
  return static_cast<int>(common);
}

// What a finished request fed: its prompt and every answer token but the
// last (sampled, never fed back).
inline std::vector<int32_t> fed_tokens(const std::vector<int32_t>& prompt, const engine::StreamEvent& end) {
  std::vector<int32_t> fed = prompt;
  if (!end.answer_tokens.empty()) fed.insert(fed.end(), end.answer_tokens.begin(), end.answer_tokens.end() - 1);
  return fed;
}

}  // namespace m40::test

// Reads a scheduler request's stream to its end, for the scheduler tests:
// the text of its pieces and the event that ended it.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace m40::test {

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

}  // namespace m40::test

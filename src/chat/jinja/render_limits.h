// Bounds on one render, so that no template (a model file is untrusted
// input) can loop forever, build gigabytes or exhaust the stack.
#pragma once

#include <cstddef>
#include <cstdint>

namespace m40::chat {

struct RenderLimits {
  size_t max_output_bytes = 16u << 20;  // the output, and any string the template builds
  size_t max_built_bytes = 256u << 20;  // all text and list items built in one render (memory)
  uint64_t max_steps = 10'000'000;      // statements + expressions + loop iterations (~1 s)
  int max_call_depth = 200;             // nested macro, caller() and recursive-loop calls
  int max_nesting = 2000;               // nested evaluation in all (guards the C++ stack)
};

}  // namespace m40::chat

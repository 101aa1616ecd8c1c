// The sampling and answer fields of a request body as OpenAI and llama.cpp's
// server spell them (temperature, top_p, top_k, min_p, repeat_penalty,
// presence/frequency_penalty, seed, max_tokens / max_completion_tokens /
// n_predict, ignore_eos, cache_prompt, stop, logit_bias), read over the
// defaults `params` holds: each API sets its own defaults first. HttpError
// 400 naming a field of the wrong type or outside its range.
#pragma once

#include "engine/scheduler.h"
#include "server/server_context.h"

namespace m40::server {

void read_sampling_fields(const json& body, engine::RequestParams& params);

}  // namespace m40::server

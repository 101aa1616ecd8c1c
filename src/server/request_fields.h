// Request fields read with type checks: a wrong type is an HttpError 400
// naming the field, never a silent default.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "server/http_error.h"
#include "server/http_message.h"
#include "server/server_context.h"

namespace m40::server {

// The request body as a JSON object, or HttpError 400.
json parse_body(const HttpRequest& req);
// Each returns nullopt for a missing or null field and throws HttpError 400
// naming the field when it has the wrong type. get_int saturates integers
// past int64 (2^63 would otherwise read as -2^63).
std::optional<double> get_number(const json& j, const char* key);
std::optional<int64_t> get_int(const json& j, const char* key);
std::optional<bool> get_bool(const json& j, const char* key);
std::optional<std::string> get_string(const json& j, const char* key);
// A string or a list of strings (OpenAI's and Ollama's `stop`).
std::vector<std::string> get_stop(const json& j, const char* key);
// An int64 request value narrowed to int32 by clamping, never by wrapping
// (2^32 + 1 would read as 1): for counts where "more than int32" means "no
// limit" (token limits, top_k, penalty windows).
inline int32_t clamp_to_int32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
}

// A prompt or context given as token ids (`ids`, a JSON array), each
// checked against a vocabulary of `n_vocab` tokens before it is narrowed
// (2^32 + 1 would read as token 1): HttpError 400 naming `field` and the id.
std::vector<int32_t> token_ids(const json& ids, size_t n_vocab, const std::string& field);

// Ollama's options.num_ctx: the context the request runs in (0: the
// loaded model's). Within the resident model's context it is the request's
// own limit (the KV pool is shared, so nothing reloads); a larger one
// reloads the model with it, as Ollama does, and the memory plan refuses
// one that does not fit. 400 outside 1..2^24.
int ollama_num_ctx(const json& body);

// Ollama's options.num_gpu: how many of the model's last layers run on the
// GPUs (engine::BackendOptions::gpu_layers; the rest on the CPU); -1 (or
// absent): as the model is loaded. A count other than the resident
// model's reloads it. 400 below -1 or for a non-integer.
int ollama_num_gpu(const json& body);

// The request's model name field ("" when absent); 400 when it is no string
// or holds a NUL (a name or path with one would be cut short in the system).
std::string model_field(const json& body, const char* key = "model");

}  // namespace m40::server

// Request fields the OpenAI, Ollama and llama.cpp APIs define that this
// server does not implement yet. A request that uses one is refused with
// 400 naming it, never answered as if the field were absent; a field sent
// with its neutral value (false, "", [], "none") is fine. One table per
// route family, here, so the refusals stay in one place.
#pragma once

#include <nlohmann/json.hpp>

namespace m40::server {

// /v1/chat/completions and /v1/completions (`chat` picks the table).
void refuse_unimplemented_openai_fields(const nlohmann::ordered_json& body, bool chat);
// /api/generate and /api/chat, `options` included: an option this server
// does not apply is refused by name (Ollama's hardware options too: they
// would be ignored, and a client could not tell).
// llama.cpp's /completion and /infill (infill: also its own fields).
void refuse_unimplemented_llama_cpp_fields(const nlohmann::ordered_json& body, bool infill);
void refuse_unimplemented_ollama_fields(const nlohmann::ordered_json& body);
// /v1/embeddings (`ollama` false) and /api/embed, /api/embeddings (true):
// llama.cpp's embd_normalize other than 2 (the Euclidean norm every answer
// has); Ollama options other than num_ctx that could change an embedding
// (the hardware ones). The sampling options shape generated text, of which
// an embedding has none: accepted without effect, as Ollama does.
void refuse_unimplemented_embedding_fields(const nlohmann::ordered_json& body, bool ollama);

}  // namespace m40::server

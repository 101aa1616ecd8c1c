// Each family of routes registers itself on the context's router.
#pragma once

#include "server/server_context.h"

namespace m40::server {

void register_ops_routes(ServerContext& s);     // ops_routes.cpp: /health, /metrics, /tokenize, /detokenize
void register_openai_routes(ServerContext& s);  // openai_api.cpp: /v1/...
void register_ollama_routes(ServerContext& s);  // ollama_api.cpp: /api/...
void register_pull_route(ServerContext& s);     // pull_route.cpp: /api/pull
void register_embedding_routes(ServerContext& s);
void register_llama_cpp_routes(ServerContext& s);  // llama_cpp_api.cpp: /completion, /infill  // embeddings_routes.cpp: /v1/embeddings, /api/embed, /api/embeddings

}  // namespace m40::server

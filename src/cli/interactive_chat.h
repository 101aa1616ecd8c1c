// The interactive `m40-llm run MODEL` (no PROMPT), like `ollama run`: a
// conversation kept across turns and streamed, slash commands
// (chat_commands.h), multi-line messages between """ lines, Ctrl-C to stop
// an answer, Ctrl-D or /bye to leave. On a terminal with line editing and
// history; otherwise it reads messages line by line from stdin.
#pragma once

#include "backends/backend.h"
#include "cli/chat_commands.h"
#include "model/loaded_model.h"
#include "tokenizer/vocab.h"

namespace m40::cli {

// Returns the exit status (0 at /bye, Ctrl-D or the end of stdin).
int run_interactive_chat(const model::LoadedModel& model, const tokenizer::Vocab& vocab, backend::Backend& backend,
                         ChatSettings settings, double load_seconds);

}  // namespace m40::cli

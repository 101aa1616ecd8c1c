// Fill-in-the-middle prompts for code models: the text before the cursor
// (prefix) and after it (suffix) around the model's FIM marker tokens, in
// prefix-suffix-middle order as llama.cpp's infill builds them:
//   [BOS] <fim_pre> prefix <fim_suf> suffix <fim_mid> [middle]
// where `middle` is what the answer is to start with. The texts are
// tokenized as plain text: a marker written in them is not a marker.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "server/model_manager.h"

namespace m40::server {

// Throws HttpError 400 when the model's vocabulary has no FIM tokens, or
// when the texts cannot fit the context.
std::vector<int32_t> infill_prompt(const ResidentModel& m, std::string_view prefix, std::string_view suffix,
                                   std::string_view middle, int n_ctx);

}  // namespace m40::server

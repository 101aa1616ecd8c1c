// The tokenizer's exception: an unsupported or malformed vocabulary, an
// out-of-range token id, a pre-tokenizer regex PCRE2 gave up on.
#pragma once

#include "common/error.h"

namespace m40::tokenizer {

class TokenizerError : public Error {
 public:
  using Error::Error;
};

}  // namespace m40::tokenizer

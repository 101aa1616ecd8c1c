#include "grammar/grammar_matcher.h"

#include "grammar/stack_store.h"

namespace m40::grammar {

namespace {

// Continuation bytes still expected after `bytes`, starting from `pending`.
int pending_after(int pending, std::string_view bytes) {
  for (char ch : bytes) {
    const auto b = static_cast<uint8_t>(ch);
    if (pending > 0 && (b & 0xC0) == 0x80) {
      --pending;
    } else {
      pending = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
    }
  }
  return pending;
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)),
      store_(std::make_shared<detail::StackStore>(
          std::shared_ptr<const detail::Automaton>(grammar_, &grammar_->automaton()))) {
  config_ = store_->initial();
}

bool GrammarMatcher::accept(std::string_view bytes) {
  uint32_t c = config_;
  for (char ch : bytes) {
    c = store_->step(c, static_cast<uint8_t>(ch));
    if (c == detail::kDead) return false;
  }
  config_ = c;
  pending_continuation_ = pending_after(pending_continuation_, bytes);
  return true;
}

bool GrammarMatcher::accept_codepoint(char32_t cp) {
  char buf[4];
  size_t n;
  if (cp < 0x80) {
    buf[0] = static_cast<char>(cp);
    n = 1;
  } else if (cp < 0x800) {
    buf[0] = static_cast<char>(0xC0 | (cp >> 6));
    buf[1] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    buf[0] = static_cast<char>(0xE0 | (cp >> 12));
    buf[1] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[2] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 3;
  } else if (cp <= 0x10FFFF) {
    buf[0] = static_cast<char>(0xF0 | (cp >> 18));
    buf[1] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    buf[2] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[3] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 4;
  } else {
    return false;
  }
  return accept(std::string_view(buf, n));
}

bool GrammarMatcher::allows(std::string_view bytes) const {
  uint32_t c = config_;
  for (char ch : bytes) {
    c = store_->step(c, static_cast<uint8_t>(ch));
    if (c == detail::kDead) return false;
  }
  return true;
}

bool GrammarMatcher::can_end() const { return store_->can_end(config_); }

bool GrammarMatcher::finished() const { return store_->can_end(config_) && !store_->has_stacks(config_); }

size_t GrammarMatcher::stack_count() const { return store_->stacks(config_).size(); }

void GrammarMatcher::reset() {
  config_ = store_->initial();
  pending_continuation_ = 0;
}

bool GrammarMatcher::matches(std::shared_ptr<const Grammar> grammar, std::string_view text) {
  GrammarMatcher m(std::move(grammar));
  return m.accept(text) && m.can_end();
}

}  // namespace m40::grammar

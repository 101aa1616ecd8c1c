// Internal: the per-call memo of words already tokenized (natural text
// repeats its words, so most words are looked up, not merged). Open
// addressing over views into the caller's text; no allocation per word.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace m40::tokenizer {

class WordCache {
 public:
  // The ids remembered for word, or false.
  bool find(std::string_view word, std::vector<TokenId>& out) const {
    if (slots_.empty()) return false;
    const uint64_t h = hash(word);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.data == nullptr) return false;
      if (s.hash == h && s.size == word.size() && std::memcmp(s.data, word.data(), word.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.first, ids_.begin() + s.first + s.count);
        return true;
      }
    }
  }

  // Remembers word -> ids (the view must outlive the cache).
  void insert(std::string_view word, const TokenId* ids, size_t count) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    const uint64_t h = hash(word);
    size_t i = h & mask_;
    while (slots_[i].data != nullptr) i = (i + 1) & mask_;
    slots_[i] = {h, word.data(), static_cast<uint32_t>(word.size()), static_cast<uint32_t>(ids_.size()),
                 static_cast<uint32_t>(count)};
    ids_.insert(ids_.end(), ids, ids + count);
    ++size_;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    const char* data = nullptr;
    uint32_t size = 0;
    uint32_t first = 0;
    uint32_t count = 0;
  };

  static uint64_t mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    return h ^ (h >> 32);
  }
  static uint64_t hash(std::string_view s) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ s.size();
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      h = mix(h, w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, s.data() + i, s.size() - i);
    return mix(h, tail);
  }

  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    const size_t capacity = old.empty() ? 1024 : old.size() * 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
      if (s.data == nullptr) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].data != nullptr) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::vector<TokenId> ids_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace m40::tokenizer

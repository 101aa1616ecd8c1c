// Internal: an open-addressing hash map keyed by a pair of non-negative
// 32-bit ids, for the merge tables (one probe sequence, no allocation per
// entry; lookups dominate tokenization time).
#pragma once

#include <cstdint>
#include <vector>

namespace m40::tokenizer {

template <class Value>
class PairMap {
 public:
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < n * 2) capacity <<= 1;
    if (capacity > slots_.size()) rehash(capacity);
  }

  // Keeps the first value inserted for a key; returns whether it inserted.
  bool insert(int32_t left, int32_t right, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    const uint64_t k = key(left, right);
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty) {
        s.key = k;
        s.value = value;
        ++size_;
        return true;
      }
      if (s.key == k) return false;
    }
  }

  const Value* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };

  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }

  void rehash(size_t capacity) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      for (size_t i = hash(s.key) & mask_;; i = (i + 1) & mask_) {
        if (slots_[i].key == kEmpty) {
          slots_[i] = s;
          ++size_;
          break;
        }
      }
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace m40::tokenizer

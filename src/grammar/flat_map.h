// A small open-addressing hash map from 64-bit keys to 32-bit values, for the
// hot lookups of the grammar runtime (interned stacks, visited sets).
#pragma once

#include <cstdint>
#include <vector>

namespace m40::grammar::detail {

class FlatMap64 {
 public:
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  FlatMap64() { rehash(16); }

  const uint32_t* find(uint64_t key) const {
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

  // Inserts key -> value unless present; returns the stored value and whether it was inserted.
  std::pair<uint32_t, bool> insert(uint64_t key, uint32_t value) {
    if ((size_ + 1) * 4 > keys_.size() * 3) rehash(keys_.size() * 2);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return {values_[i], false};
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = value;
        used_.push_back(static_cast<uint32_t>(i));
        ++size_;
        return {value, true};
      }
    }
  }

  // Empties the map in time proportional to its size.
  void clear() {
    for (uint32_t i : used_) keys_[i] = kEmpty;
    used_.clear();
    size_ = 0;
  }

  size_t size() const { return size_; }
  size_t memory_bytes() const { return keys_.capacity() * 12 + used_.capacity() * 4; }

 private:
  static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  }
  size_t slot(uint64_t key) const { return static_cast<size_t>(mix(key)) & mask_; }

  void rehash(size_t capacity) {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<uint32_t> old_values = std::move(values_);
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, 0);
    mask_ = capacity - 1;
    used_.clear();
    size_ = 0;
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != kEmpty) insert(old_keys[i], old_values[i]);
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  std::vector<uint32_t> used_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace m40::grammar::detail

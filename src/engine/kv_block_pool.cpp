#include "engine/kv_block_pool.h"

#include <algorithm>
#include <string>

#include "backends/kv_blocks.h"
#include "common/error.h"

namespace m40::engine {

using backend::kKvBlockSize;

KvBlockPool::KvBlockPool(int n_blocks) : blocks_(static_cast<size_t>(std::max(n_blocks, 0))) {
  if (n_blocks <= 0) throw Error("the KV pool needs at least one block");
  // Handed out lowest first (the order is not otherwise meaningful).
  for (int32_t b = n_blocks - 1; b >= 0; --b) unused_.push_back(b);
}

uint64_t KvBlockPool::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  // splitmix64 steps over the parent and each token: cheap and well mixed;
  // a match is confirmed by comparing the tokens themselves.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

KvBlockPool::Prefix KvBlockPool::acquire_prefix(std::span<const int32_t> tokens, int max_blocks) {
  Prefix out;
  uint64_t parent = kRootHash;
  const int whole = static_cast<int>(tokens.size()) / kKvBlockSize;
  for (int b = 0; b < std::min(whole, max_blocks); ++b) {
    const auto piece = tokens.subspan(static_cast<size_t>(b) * kKvBlockSize, kKvBlockSize);
    const uint64_t hash = chain_hash(parent, piece);
    const auto it = index_.find(hash);
    if (it == index_.end()) break;
    Block& block = blocks_[it->second];
    if (block.parent != parent || !std::equal(piece.begin(), piece.end(), block.tokens.begin(), block.tokens.end())) break;
    if (block.refs++ == 0) lru_.erase(block.lru);
    out.blocks.push_back(it->second);
    out.hashes.push_back(hash);
    parent = hash;
  }
  return out;
}

std::optional<int32_t> KvBlockPool::allocate() {
  int32_t b;
  if (!unused_.empty()) {
    b = unused_.back();
    unused_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    forget(b);
  } else {
    return std::nullopt;
  }
  blocks_[b].refs = 1;
  return b;
}

void KvBlockPool::check_held(int32_t block, const char* what) const {
  if (block < 0 || block >= n_blocks() || blocks_[block].refs <= 0) {
    throw Error("KV block " + std::to_string(block) + " is " + what + " but not held");
  }
}

void KvBlockPool::release(int32_t block) {
  check_held(block, "released");
  Block& b = blocks_[block];
  if (--b.refs > 0) return;
  if (b.cached_contents()) {
    b.lru = lru_.insert(lru_.end(), block);
  } else {
    unused_.push_back(block);
  }
}

uint64_t KvBlockPool::publish(int32_t block, uint64_t parent, std::span<const int32_t> tokens) {
  check_held(block, "published");
  if (static_cast<int>(tokens.size()) != kKvBlockSize) throw Error("a published KV block holds a whole block of tokens");
  const uint64_t hash = chain_hash(parent, tokens);
  Block& b = blocks_[block];
  if (b.indexed) return b.hash;
  if (index_.contains(hash)) return hash;  // another block holds these already (and covers any offer of this one)
  if (b.offered) detach_child(block);
  b.offered = false;
  b.indexed = true;
  b.hash = hash;
  b.parent = parent;
  b.tokens.assign(tokens.begin(), tokens.end());
  index_[hash] = block;
  attach_child(block);
  return hash;
}

void KvBlockPool::publish_partial(int32_t block, uint64_t parent, std::span<const int32_t> tokens) {
  check_held(block, "offered");
  if (tokens.empty() || static_cast<int>(tokens.size()) >= kKvBlockSize) {
    throw Error("an offered KV block holds 1 to " + std::to_string(kKvBlockSize - 1) + " tokens");
  }
  Block& b = blocks_[block];
  if (b.indexed) return;  // whole, it offers every prefix of its tokens already
  if (b.offered && b.parent == parent && tokens.size() <= b.tokens.size()) return;
  // An offer that holds these tokens and more makes this one redundant.
  if (const auto it = children_.find(parent); it != children_.end()) {
    for (int32_t other : it->second) {
      const auto& held = blocks_[other].tokens;
      if (other != block && held.size() >= tokens.size() && std::equal(tokens.begin(), tokens.end(), held.begin())) return;
    }
  }
  if (b.offered) detach_child(block);
  b.offered = true;
  b.parent = parent;
  b.tokens.assign(tokens.begin(), tokens.end());
  attach_child(block);
}

std::optional<KvBlockPool::PartialMatch> KvBlockPool::match_partial(uint64_t parent, std::span<const int32_t> tokens) {
  const auto it = children_.find(parent);
  if (it == children_.end() || tokens.empty()) return std::nullopt;
  PartialMatch best;
  for (int32_t candidate : it->second) {
    const auto& held = blocks_[candidate].tokens;
    const auto end = tokens.begin() + static_cast<std::ptrdiff_t>(std::min(tokens.size(), held.size()));
    const int length = static_cast<int>(std::mismatch(tokens.begin(), end, held.begin()).first - tokens.begin());
    if (length > best.length) best = {candidate, length};
  }
  if (best.length == 0) return std::nullopt;
  Block& b = blocks_[best.block];
  best.can_take_over = b.refs == 0 && best.length == static_cast<int>(b.tokens.size());
  if (b.refs++ == 0) lru_.erase(b.lru);
  return best;
}

void KvBlockPool::take_over(int32_t block) {
  check_held(block, "taken over");
  if (blocks_[block].refs != 1) throw Error("KV block " + std::to_string(block) + " is taken over but shared");
  forget(block);
}

void KvBlockPool::attach_child(int32_t block) { children_[blocks_[block].parent].push_back(block); }

void KvBlockPool::detach_child(int32_t block) {
  const auto it = children_.find(blocks_[block].parent);
  if (it == children_.end()) return;
  std::erase(it->second, block);
  if (it->second.empty()) children_.erase(it);
}

void KvBlockPool::forget(int32_t block) {
  Block& b = blocks_[block];
  if (!b.cached_contents()) return;
  if (b.indexed) {
    const auto it = index_.find(b.hash);
    if (it != index_.end() && it->second == block) index_.erase(it);
  }
  detach_child(block);
  b.indexed = false;
  b.offered = false;
  b.tokens.clear();
}

}  // namespace m40::engine

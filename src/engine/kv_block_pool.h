// Which KV blocks (backends/kv_blocks.h) hold what: the engine's ledger of
// the backend's block pool, with automatic prefix reuse. A full block is
// indexed by the chain hash of its tokens and every token before it, so a
// new sequence that begins with the same tokens (the next turn of a chat, a
// shared system prompt, a conversation coming back after others had its
// slot) takes those blocks instead of computing them again. Blocks are
// reference counted; one no sequence uses stays indexed (cached) until an
// allocation needs it, least recently used first. One thread uses a pool
// (the scheduler's engine thread); it is not synchronized.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace m40::engine {

class KvBlockPool {
 public:
  explicit KvBlockPool(int n_blocks);

  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  // Blocks an allocation can have now: unused ones and cached ones.
  int available() const { return static_cast<int>(unused_.size() + lru_.size()); }
  // Blocks some sequence holds.
  int in_use() const { return n_blocks() - available(); }
  // Blocks no sequence holds that keep their contents for reuse.
  int cached() const { return static_cast<int>(lru_.size()); }

  // The chain hash of the prefix before any block.
  static constexpr uint64_t kRootHash = 0x6d34302d6c6c6d00ull;
  // The chain hash of a block holding `tokens` after a prefix whose chain
  // hash is `parent`.
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);

  struct Prefix {
    std::vector<int32_t> blocks;  // held for the caller: release() each
    std::vector<uint64_t> hashes; // each block's chain hash
  };
  // The longest run of indexed blocks holding the beginning of `tokens`,
  // whole blocks only and at most `max_blocks` of them; each one is held
  // (referenced) for the caller.
  Prefix acquire_prefix(std::span<const int32_t> tokens, int max_blocks);

  // A block for new positions, held for the caller: an unused one, else the
  // least recently used cached one (which leaves the index). nullopt when
  // every block is held.
  std::optional<int32_t> allocate();

  // The caller no longer uses `block`. An indexed block stays cached (its
  // contents reusable) until an allocation needs it.
  void release(int32_t block);

  // Indexes `block`, held by the caller and now full, as holding `tokens`
  // (kKvBlockSize of them) after the prefix `parent`; returns its chain
  // hash. When another block holds the same already, this one stays out of
  // the index (it is freed, not cached, on release).
  uint64_t publish(int32_t block, uint64_t parent, std::span<const int32_t> tokens);

 private:
  struct Block {
    int refs = 0;
    bool indexed = false;
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // what an indexed block holds, compared on every match
    std::list<int32_t>::iterator lru;  // where it is in lru_ while cached
  };
  void forget(int32_t block);  // takes an indexed block out of the index

  std::vector<Block> blocks_;
  std::vector<int32_t> unused_;  // not indexed, not held
  std::list<int32_t> lru_;       // indexed, not held: least recently used first
  std::unordered_map<uint64_t, int32_t> index_;
};

}  // namespace m40::engine

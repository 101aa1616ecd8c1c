// Which KV blocks (backends/kv_blocks.h) hold what: the engine's ledger of
// the backend's block pool, with automatic prefix reuse. A full block is
// indexed by the chain hash of its tokens and every token before it, so a
// new sequence that begins with the same tokens (the next turn of a chat, a
// shared system prompt, a conversation coming back after others had its
// slot) takes those blocks instead of computing them again. A block only
// partly filled (the end of a conversation, a prompt that n choices fork)
// can be offered too: a sequence whose tokens continue the same prefix
// copies it (Backend::copy_block) and reuses the positions its tokens share.
// Blocks are reference counted; one no sequence uses stays indexed (cached)
// until an allocation needs it, least recently used first. One thread uses
// a pool (the scheduler's engine thread); it is not synchronized.
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

  // Offers `block`, held by the caller, whose first tokens.size() (1 to
  // kKvBlockSize - 1) positions hold `tokens` after the prefix `parent`, for
  // copying: match_partial finds it, and it stays cached after release like
  // an indexed block. Its holder may go on filling it (the offered positions
  // do not change); publishing it full later keeps it on offer. Nothing
  // happens when an offered block already covers these tokens.
  void publish_partial(int32_t block, uint64_t parent, std::span<const int32_t> tokens);

  struct PartialMatch {
    int32_t block = -1;  // held for the caller: release() it once copied
    int length = 0;      // leading positions of `tokens` it holds
    // No sequence held it (it was only cached) and `tokens` continue all it
    // holds: the caller may take it over (take_over) instead of copying it,
    // losing nothing cached (a block shared only in part is copied, so its
    // other continuation stays cached).
    bool can_take_over = false;
  };
  // The offered or indexed block after `parent` that holds the longest run
  // of the beginning of `tokens` (at least one); held for the caller.
  std::optional<PartialMatch> match_partial(uint64_t parent, std::span<const int32_t> tokens);

  // The caller, its only holder, writes into `block` after the positions it
  // shares: it leaves the index and the offers, its contents kept.
  void take_over(int32_t block);

 private:
  struct Block {
    int refs = 0;
    bool indexed = false;  // a full block in index_
    bool offered = false;  // a partly filled one, on offer for copying (publish_partial)
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // what an indexed or offered block holds, compared on every match
    std::list<int32_t>::iterator lru;  // where it is in lru_ while cached
    bool cached_contents() const { return indexed || offered; }
  };
  void forget(int32_t block);  // takes a block out of the index and the offers
  void check_held(int32_t block, const char* what) const;
  void attach_child(int32_t block);
  void detach_child(int32_t block);

  std::vector<Block> blocks_;
  std::vector<int32_t> unused_;  // not indexed, not held
  std::list<int32_t> lru_;       // indexed, not held: least recently used first
  std::unordered_map<uint64_t, int32_t> index_;
  // Indexed and offered blocks by the chain hash of the prefix before them
  // (match_partial's candidates).
  std::unordered_map<uint64_t, std::vector<int32_t>> children_;
};

}  // namespace m40::engine

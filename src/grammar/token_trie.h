// A vocabulary's token byte strings as a prefix tree laid out in preorder, so
// a walk is a forward scan that skips a dead subtree by jumping to its end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace m40::grammar::detail {

struct TrieNode {
  uint32_t subtree_end;  // one past the last node below this one
  uint32_t first_token;  // index into TokenTrie::tokens of the first token at or below
  uint16_t depth;        // bytes from the root
  uint8_t byte;          // the byte leading here
  uint8_t tokens_here;   // tokens whose bytes end exactly here
};

class TokenTrie {
 public:
  // Tokens with empty pieces and those listed in `excluded` are left out.
  TokenTrie(const std::vector<std::string>& pieces, const std::vector<bool>& excluded);

  // Node 0 is the root (the empty prefix, no token).
  const std::vector<TrieNode>& nodes() const { return nodes_; }
  // Token ids in byte order of their pieces.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  size_t memory_bytes() const { return nodes_.capacity() * sizeof(TrieNode) + tokens_.capacity() * 4; }

 private:
  std::vector<TrieNode> nodes_;
  std::vector<int32_t> tokens_;
};

}  // namespace m40::grammar::detail

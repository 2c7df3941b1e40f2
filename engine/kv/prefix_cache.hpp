// prefix_cache: a radix tree over full blocks of tokens, mapping each cached prefix to the
// KV block that holds its last block of tokens (SGLang / vLLM style automatic prefix
// caching).
//
// A node is one full block. It is identified by a hash chained on its parent's hash, on a
// namespace key (per-tenant isolation: the same tokens under another namespace never
// match) and on its tokens; the tree is stored as a map from that hash to the node, whose
// parent hash and tokens are kept and compared on lookup, so a hash collision is a miss,
// never a wrong block. Partial blocks are never cached.
//
// Single-threaded: owned by one kv_block_manager.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv/block_id.hpp"

namespace troupe {

class prefix_cache {
 public:
  explicit prefix_cache(uint32_t num_blocks) : block_hash_(num_blocks) {}

  // The hash of the root's (empty prefix's) children's parent, for a namespace.
  static uint64_t root(uint64_t ns);
  static uint64_t chain(uint64_t parent, std::span<const int32_t> tokens);

  std::optional<block_id> find(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;
  // Caches block b as the node (hash, parent, tokens); false if that node is cached already.
  bool insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, block_id b);
  // Forgets the node block b holds, if any (the block is being reused).
  void evict(block_id b);
  bool holds(block_id b) const { return block_hash_[b.value].has_value(); }
  size_t size() const { return nodes_.size(); }

 private:
  struct node {
    block_id block;
    uint64_t parent;
    std::vector<int32_t> tokens;
  };
  std::unordered_map<uint64_t, node> nodes_;
  std::vector<std::optional<uint64_t>> block_hash_;  // per block: the node it holds
};

}  // namespace troupe

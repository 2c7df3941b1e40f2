// prefix_block_index: which KV block holds each cached prefix, by full blocks of tokens
// (vLLM's automatic prefix caching; not a radix tree: there are no child links to walk,
// and a prefix is found one block at a time, by hash).
//
// An entry is one full block of tokens, keyed by a hash chained on its parent's hash, on a
// namespace key (per-tenant isolation: the same tokens under another namespace never
// match) and on its tokens. Each entry keeps its parent hash and tokens, compared on
// lookup, so a hash collision is a miss, never a wrong block. A prompt's longest cached
// prefix is its first blocks found in order; partial blocks are never cached.
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

class prefix_block_index {
 public:
  explicit prefix_block_index(uint32_t num_blocks) : block_hash_(num_blocks) {}

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
  // Each cached node's hash, in no order.
  template <class F>
  void for_each_hash(F&& f) const {
    for (const auto& [hash, n] : nodes_) f(hash);
  }

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

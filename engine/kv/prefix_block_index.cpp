#include "engine/kv/prefix_block_index.hpp"

#include <algorithm>

namespace troupe {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

}  // namespace

uint64_t prefix_block_index::root(uint64_t ns) { return mix(0x74726f7570650001ull, ns); }

uint64_t prefix_block_index::chain(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent, tokens.size());
  for (int32_t t : tokens) h = mix(h, static_cast<uint32_t>(t));
  return h;
}

std::optional<block_id> prefix_block_index::find(uint64_t hash, uint64_t parent,
                                           std::span<const int32_t> tokens) const {
  auto it = nodes_.find(hash);
  if (it == nodes_.end() || it->second.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(), it->second.tokens.end()))
    return std::nullopt;
  return it->second.block;
}

bool prefix_block_index::insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, block_id b) {
  if (block_hash_[b.value]) return false;  // the block already holds a node
  if (!nodes_.try_emplace(hash, node{b, parent, {tokens.begin(), tokens.end()}}).second) return false;
  block_hash_[b.value] = hash;
  return true;
}

void prefix_block_index::evict(block_id b) {
  if (auto& h = block_hash_[b.value]) {
    nodes_.erase(*h);
    h.reset();
  }
}

}  // namespace troupe

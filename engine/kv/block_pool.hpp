// block_pool: the bookkeeping of a fixed number of KV blocks: reference counts and a free
// list kept in eviction order. It never touches tensors (those live in the shards).
//
// A block is in use while its reference count is above zero. A block whose count drops to
// zero joins the tail of the free list; allocate() takes from the head, so the block freed
// longest ago is reused first (least recently used). A free block may still hold a cached
// prefix (the prefix cache knows which); ref() on it takes it back out of the free list
// (a cache hit), and allocate() reports it as evicted when it is reused.
//
// Single-threaded: owned by one kv_block_manager.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/kv/block_id.hpp"

namespace troupe {

class block_pool {
 public:
  explicit block_pool(uint32_t num_blocks);

  // The least recently freed block with reference count 1, or nullopt if none is free.
  std::optional<block_id> allocate();
  void ref(block_id b);    // +1; a free block leaves the free list
  void unref(block_id b);  // -1; at zero the block joins the tail of the free list

  uint32_t ref_count(block_id b) const { return refs_[b.value]; }
  uint32_t num_blocks() const { return static_cast<uint32_t>(refs_.size()); }
  uint32_t num_free() const { return num_free_; }
  // Free blocks from the next to be allocated to the last (for tests and reports).
  std::vector<block_id> free_order() const;

 private:
  void unlink(uint32_t b);
  void push_back(uint32_t b);

  static constexpr uint32_t none = UINT32_MAX;
  std::vector<uint32_t> refs_;
  std::vector<uint32_t> prev_, next_;  // the free list, intrusive
  uint32_t head_ = none, tail_ = none;
  uint32_t num_free_ = 0;
};

}  // namespace troupe

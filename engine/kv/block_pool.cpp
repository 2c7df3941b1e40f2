#include "engine/kv/block_pool.hpp"

#include "kernels/common/assert.hpp"

namespace troupe {

block_pool::block_pool(uint32_t num_blocks)
    : refs_(num_blocks, 0), prev_(num_blocks, none), next_(num_blocks, none) {
  for (uint32_t b = 0; b < num_blocks; ++b) push_back(b);
}

std::optional<block_id> block_pool::allocate() {
  if (head_ == none) return std::nullopt;
  const uint32_t b = head_;
  unlink(b);
  refs_[b] = 1;
  return block_id{b};
}

void block_pool::ref(block_id id) {
  const uint32_t b = id.value;
  TROUPE_ASSERT(b < refs_.size(), b);
  if (refs_[b]++ == 0) unlink(b);
}

void block_pool::unref(block_id id) {
  const uint32_t b = id.value;
  TROUPE_ASSERT(b < refs_.size() && refs_[b] > 0, b);
  if (--refs_[b] == 0) push_back(b);
}

std::vector<block_id> block_pool::free_order() const {
  std::vector<block_id> out;
  for (uint32_t b = head_; b != none; b = next_[b]) out.push_back(block_id{b});
  return out;
}

void block_pool::unlink(uint32_t b) {
  if (prev_[b] != none) next_[prev_[b]] = next_[b]; else head_ = next_[b];
  if (next_[b] != none) prev_[next_[b]] = prev_[b]; else tail_ = prev_[b];
  prev_[b] = next_[b] = none;
  --num_free_;
}

void block_pool::push_back(uint32_t b) {
  prev_[b] = tail_;
  next_[b] = none;
  if (tail_ != none) next_[tail_] = b; else head_ = b;
  tail_ = b;
  ++num_free_;
}

}  // namespace troupe

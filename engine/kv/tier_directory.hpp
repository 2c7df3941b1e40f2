// tier_directory: which blocks the scheduler believes the KV tiers hold, by content address
// (engine/kv/kv_tiers.hpp): the blocks it ordered saved, the most recent `capacity` of
// them. A prefix found here is loaded rather than computed; a load that finds the block
// gone or corrupt is computed again (the directory guides, the shards' checks decide).
//
// Single-threaded: owned by one scheduler.
#pragma once

#include <cstddef>
#include <list>
#include <unordered_map>

#include "engine/kv/tier_types.hpp"

namespace troupe {

class tier_directory {
 public:
  explicit tier_directory(size_t capacity) : capacity_(capacity) {}

  bool contains(const tier_key& k) const { return at_.count(k) != 0; }
  // Notes k as stored (just now: the least likely to be dropped by the tiers).
  void add(const tier_key& k) {
    if (auto it = at_.find(k); it != at_.end()) {
      order_.splice(order_.end(), order_, it->second);
      return;
    }
    order_.push_back(k);
    at_.emplace(k, std::prev(order_.end()));
    if (order_.size() > capacity_) {
      at_.erase(order_.front());
      order_.pop_front();
    }
  }
  void forget(const tier_key& k) {
    auto it = at_.find(k);
    if (it == at_.end()) return;
    order_.erase(it->second);
    at_.erase(it);
  }
  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  struct hash {
    size_t operator()(const tier_key& k) const noexcept { return static_cast<size_t>(k.hi ^ (k.lo * 0x9e3779b97f4a7c15ull)); }
  };
  size_t capacity_;
  std::list<tier_key> order_;
  std::unordered_map<tier_key, std::list<tier_key>::iterator, hash> at_;
};

}  // namespace troupe

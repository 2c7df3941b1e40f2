// tier_failures: the KV-tier loads that failed in any shard of a tensor-parallel stage, per
// step. Each shard adds its own before its forward pass; the all-reduces inside the pass
// wait for every shard, so after it each sees them all (take) and none saves blocks of a
// request whose loads failed in another. Thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "engine/kv/block_id.hpp"

namespace troupe {

class tier_failures {
 public:
  explicit tier_failures(int32_t shards) : shards_(shards) {}

  void add(uint64_t step, std::span<const request_id> failed) {
    std::lock_guard lock(mu_);
    // Steps that some shard never took (it failed mid-step) are dropped after a while.
    while (!steps_.empty() && steps_.begin()->first + 64 < step) steps_.erase(steps_.begin());
    auto& e = steps_[step];
    for (request_id id : failed)
      if (std::find(e.failed.begin(), e.failed.end(), id) == e.failed.end()) e.failed.push_back(id);
  }
  // Every shard's failures of `step`, once all have added theirs.
  std::vector<request_id> take(uint64_t step) {
    std::lock_guard lock(mu_);
    auto it = steps_.find(step);
    if (it == steps_.end()) return {};
    std::vector<request_id> out = it->second.failed;
    if (++it->second.taken == shards_) steps_.erase(it);
    return out;
  }

 private:
  struct entry {
    std::vector<request_id> failed;
    int32_t taken = 0;
  };
  int32_t shards_;
  std::mutex mu_;
  std::map<uint64_t, entry> steps_;
};

}  // namespace troupe

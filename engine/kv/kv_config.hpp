// kv_config: a replica's KV cache, as a topology's [kv] table sets it, carried whole to
// every component that keeps or plans blocks: the scheduler and its block manager, the kv
// manager actor, and the stages' shards; the gateways read its prefix-cache scope.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/kv/tier_types.hpp"

#include "kernels/common/dtype.hpp"

namespace troupe {

struct kv_config {
  int32_t block_size = 16;           // tokens per block
  uint32_t num_blocks = 1024;        // blocks in the replica's pool, and in each shard's cache
  bool prefix_caching = true;        // cached prompt blocks serve later requests
  bool prefix_cache_per_key = true;  // ... of the same API key only (each key a namespace)
  std::optional<dtype> cache_type;   // what shards keep K and V in (none: the model's default,
                                     // kv_cache_type_for)
  std::vector<tier_config> tiers;    // where cached prefix blocks go below the pool, fastest
                                     // first (engine/kv/kv_tiers.hpp); empty: nowhere
};

}  // namespace troupe

#include "actors/replica.hpp"

#include <caf/all.hpp>

#include "actors/shard_actor.hpp"
#include "actors/stage_actor.hpp"

namespace troupe {

replica_handles spawn_replica(caf::actor_system& sys, const model& m, const std::vector<stage_layout>& stages,
                              uint32_t num_blocks, int32_t block_size, int32_t max_step_tokens) {
  replica_handles out;
  caf::actor next;
  for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
    std::shared_ptr<local_collective_group> group;
    if (it->tp > 1) group = std::make_shared<local_collective_group>(it->tp);
    std::vector<caf::actor> shards;
    for (int32_t r = 0; r < it->tp; ++r) {
      shard_setup s;
      s.m = &m;
      s.spec = shard_spec{it->first_layer, it->end_layer, tp_slice{r, it->tp}};
      s.group = group;
      s.num_blocks = num_blocks;
      s.block_size = block_size;
      s.threads = it->threads_per_shard;
      s.max_step_tokens = max_step_tokens;
      shards.push_back(spawn_shard(sys, s));
      out.actors.push_back(shards.back());
    }
    next = spawn_stage(sys, shards, next);
    out.actors.push_back(next);
  }
  out.entry = next;
  return out;
}

}  // namespace troupe

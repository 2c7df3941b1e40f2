#include "actors/replica.hpp"

#include <caf/all.hpp>

#include "actors/shard_actor.hpp"
#include "actors/stage_actor.hpp"

namespace troupe {

replica_handles spawn_replica_stage(caf::actor_system& sys, const model& m, const stage_layout& stage,
                                    caf::actor next, uint32_t num_blocks, int32_t block_size,
                                    int32_t max_step_tokens) {
  replica_handles out;
  std::shared_ptr<local_collective_group> group;
  if (stage.tp > 1) group = std::make_shared<local_collective_group>(stage.tp);
  std::vector<caf::actor> shards;
  for (int32_t r = 0; r < stage.tp; ++r) {
    shard_setup s;
    s.m = &m;
    s.spec = shard_spec{stage.first_layer, stage.end_layer, tp_slice{r, stage.tp}};
    s.group = group;
    s.num_blocks = num_blocks;
    s.block_size = block_size;
    s.threads = stage.threads_per_shard;
    s.max_step_tokens = max_step_tokens;
    if (stage.tp == 1) s.next = next;
    shards.push_back(spawn_shard(sys, s));
    out.actors.push_back(shards.back());
  }
  out.entry = spawn_stage(sys, shards, std::move(next));
  out.actors.push_back(out.entry);
  return out;
}

replica_handles spawn_replica(caf::actor_system& sys, const model& m, const std::vector<stage_layout>& stages,
                              uint32_t num_blocks, int32_t block_size, int32_t max_step_tokens) {
  replica_handles out;
  caf::actor next;
  for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
    auto one = spawn_replica_stage(sys, m, *it, next, num_blocks, block_size, max_step_tokens);
    out.actors.insert(out.actors.end(), one.actors.begin(), one.actors.end());
    next = one.entry;
  }
  out.entry = next;
  return out;
}

}  // namespace troupe

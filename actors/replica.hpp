// replica: one copy of the model as actors in this process: a chain of stage actors, each
// with its shard actors, built from a layout (layer ranges and tensor-parallel sizes).
// Steps enter at the first stage; the reply is the last stage's logits.
#pragma once

#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/model/model.hpp"

namespace troupe {

struct stage_layout {
  int32_t first_layer = 0;
  int32_t end_layer = 0;  // exclusive
  int32_t tp = 1;
  int32_t threads_per_shard = 1;
};

struct replica_handles {
  caf::actor entry;                 // the first stage
  std::vector<caf::actor> actors;   // every stage and shard, for shutdown
};

replica_handles spawn_replica(caf::actor_system& sys, const model& m, const std::vector<stage_layout>& stages,
                              uint32_t num_blocks, int32_t block_size, int32_t max_step_tokens);

// One stage and its shards, handing steps on to `next` (invalid for the last stage).
replica_handles spawn_replica_stage(caf::actor_system& sys, const model& m, const stage_layout& stage,
                                    caf::actor next, uint32_t num_blocks, int32_t block_size,
                                    int32_t max_step_tokens);

}  // namespace troupe

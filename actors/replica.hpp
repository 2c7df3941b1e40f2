// replica: the supervised units that make up one copy of the model, and an in-process
// replica (every stage in this process, under one node agent) for tests and one-process
// topologies. Names: "<replica>/stage<i>" for a stage (its shards are
// "<replica>/stage<i>/shard<r>"), "<replica>/scheduler" for its scheduler, "<replica>/kv"
// for its kv manager (a unit of its own, beside the scheduler: either restarts alone), and
// "<replica>/draft" for its draft actor (speculative decoding by a draft model or early
// exit; a unit of its own too).
#pragma once

#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/draft_actor.hpp"
#include "actors/kv_manager_actor.hpp"
#include "actors/node_agent.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/stage_actor.hpp"

namespace troupe {

std::string stage_name(const std::string& replica, size_t index);
std::string scheduler_name(const std::string& replica);
std::string kv_manager_name(const std::string& replica);
std::string draft_name(const std::string& replica);

unit_spec stage_unit(const model& m, const std::string& replica, size_t index, const stage_layout& layout);
// The scheduler's setup names its stages; a local stage address is filled in with the
// spawning agent.
unit_spec scheduler_unit(const std::string& replica, scheduler_setup setup);
unit_spec kv_manager_unit(const std::string& replica, const kv_manager_setup& setup);
unit_spec draft_unit(const std::string& replica, const draft_setup& setup);

struct local_replica {
  caf::actor agent;                  // supervises every stage and the kv manager
  std::vector<stage_address> stages; // for a scheduler_setup
  std::string kv_manager;            // likewise
  stage_address draft;               // likewise, when it has a draft actor
};

// Its stages and a kv manager (of the first stage's kv config, the model's context) under
// one agent; and a draft actor over the same pool when `draft` has a model.
local_replica spawn_replica(caf::actor_system& sys, const model& m, const std::vector<stage_layout>& stages,
                            const std::string& name = "r0", draft_setup draft = {});

}  // namespace troupe

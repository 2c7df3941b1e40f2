// node_agent: one per process. It spawns the process's actors as supervised units (a
// pipeline stage with its shards, a scheduler), monitors every member, and when one dies
// kills the rest of its unit and spawns the unit anew after a backoff (50 ms, doubling to
// 2 s while restarts keep coming within 10 s of each other). Other actors, local or on
// other nodes (through the agent published at the node's port), find units by name.
//
//   (lookup_atom, name)      -> the named actor, if alive ("r0/stage1", "r0/scheduler",
//                               "r0/stage1/shard0", ...)
//   (kill_atom, name)        -> bool: kills the named actor (failure injection)
//   (health_atom)            -> NodeHealth frame: every member, alive, restarts, the
//                               process's KV-tier figures (the meter's, if given) and
//                               what its step links and KV landings saw of their peers
//                               (the link meter's, if given)
//   (ping_atom, x)           -> x
//
// An exit message (the process stops) ends every unit without restarting any.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/wire/control_codec.hpp"
#include "engine/kv/kv_tiers.hpp"

namespace troupe {

struct unit_member {
  std::string name;
  wire::actor_kind kind = wire::actor_kind::stage;
  caf::actor handle;
};

struct unit_instance {
  std::vector<unit_member> members;  // members[0] is the one lookups of the unit's name find
  std::function<void()> abort;       // run when a member dies (releases peers blocked on it)
};

struct unit_spec {
  std::string name;
  // Spawns the unit; `agent` is the node agent, for units that look others up.
  std::function<unit_instance(caf::actor agent)> spawn;
};

caf::actor spawn_node_agent(caf::actor_system& sys, std::string node, std::vector<unit_spec> units,
                            std::shared_ptr<tier_meter> meter = nullptr, std::shared_ptr<link_meter> links = nullptr);

}  // namespace troupe

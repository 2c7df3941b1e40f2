// kv_manager_actor: one replica's KV block manager (block pool and prefix block index) as
// an actor. Its scheduler claims blocks for each step with one message and gets the
// blocks of the requests that fit (schema/kv.capnp, actors/wire/kv_codec.hpp):
//
//   (claim_atom, KvStep frame) -> KvGrants frame
//   (stats_atom)               -> (kv used, kv free, cached, known requests)
//   (prefix_atom)              -> the prefix cache's summary, as words
//                                 (engine/kv/prefix_summary.hpp)
//
// The block manager's state lives only here. When this actor dies (its supervisor spawns
// it anew, empty), the scheduler learns it from the down message or from the refusal of
// its next claims (a new kv manager serves no session until reset), forgets its KV and
// has its running requests recompute.
#pragma once

#include <cstdint>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/kv/kv_config.hpp"

namespace troupe {

struct kv_manager_setup {
  kv_config kv;         // the replica's pool
  int32_t context = 0;  // tokens per sequence at most
};

caf::actor spawn_kv_manager(caf::actor_system& sys, const kv_manager_setup& setup);

}  // namespace troupe

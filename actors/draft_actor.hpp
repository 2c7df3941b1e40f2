// draft_actor: a replica's speculative proposer as an actor of its own: a draft model, or
// the target's first layers for early exit, each with a KV cache of its own laid out in the
// replica's block ids (engine/speculative/draft_exchange.hpp, schema/draft.capnp):
//
//   (draft_atom, DraftOrder frame) -> Drafts frame   (a refusal, with why, for an order
//                                                     that fails its checks)
//
// It runs beside the pipeline, on the node the topology gives it (by default its
// scheduler's, where the drafts need no link), under that node's agent as the unit
// "<replica>/draft". Its copies of the requests live only here: when it dies and is spawned
// anew, it answers `unknown` for the requests it has not seen, and the scheduler sends them
// whole. While it is gone, the replica serves without drafts.
#pragma once

#include <cstdint>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/kv/kv_config.hpp"
#include "engine/model/model.hpp"
#include "engine/speculative/speculative.hpp"

namespace troupe {

struct draft_setup {
  const model* m = nullptr;  // the draft model (spec.method draft), or the target (early exit)
  speculative_config spec;
  kv_config kv;              // the replica's pool: its drafts' blocks are the requests'
  int32_t context = 0;       // tokens per sequence at most
  int32_t threads = 1;
};

caf::actor spawn_draft(caf::actor_system& sys, const draft_setup& setup);

}  // namespace troupe

// The project's CAF types and atoms, in one type-ID block.
#pragma once

#include <cstdint>
#include <vector>

#include <caf/type_id.hpp>

#include "actors/caf/wire_message.hpp"
#include "actors/scheduler_figures.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(troupe, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(troupe, (troupe::wire_message))
  CAF_ADD_TYPE_ID(troupe, (std::vector<uint64_t>))
  CAF_ADD_TYPE_ID(troupe, (troupe::scheduler_figures))
  CAF_ADD_ATOM(troupe, troupe, step_atom, "step")
  CAF_ADD_ATOM(troupe, troupe, health_atom, "health")
  CAF_ADD_ATOM(troupe, troupe, heartbeat_atom, "heartbeat")
  CAF_ADD_ATOM(troupe, troupe, generate_atom, "generate")
  CAF_ADD_ATOM(troupe, troupe, cancel_atom, "cancel")
  CAF_ADD_ATOM(troupe, troupe, stats_atom, "stats")
  CAF_ADD_ATOM(troupe, troupe, chunk_atom, "chunk")
  CAF_ADD_ATOM(troupe, troupe, done_atom, "done")
  CAF_ADD_ATOM(troupe, troupe, lookup_atom, "lookup")
  CAF_ADD_ATOM(troupe, troupe, ping_atom, "ping")
  CAF_ADD_ATOM(troupe, troupe, kill_atom, "kill")
  CAF_ADD_ATOM(troupe, troupe, respawn_atom, "respawn")
  CAF_ADD_ATOM(troupe, troupe, resolve_atom, "resolve")
  CAF_ADD_ATOM(troupe, troupe, tick_atom, "tick")
  CAF_ADD_ATOM(troupe, troupe, metrics_atom, "metrics")
  CAF_ADD_ATOM(troupe, troupe, claim_atom, "claim")
  CAF_ADD_ATOM(troupe, troupe, link_atom, "link")
  CAF_ADD_ATOM(troupe, troupe, connect_atom, "connect")
  CAF_ADD_ATOM(troupe, troupe, link_in_atom, "linkin")
  CAF_ADD_ATOM(troupe, troupe, link_out_atom, "linkout")
  CAF_ADD_ATOM(troupe, troupe, unlink_atom, "unlink")
  CAF_ADD_ATOM(troupe, troupe, draft_atom, "draft")
  CAF_ADD_ATOM(troupe, troupe, status_atom, "status")
  CAF_ADD_ATOM(troupe, troupe, prefix_atom, "prefix")
CAF_END_TYPE_ID_BLOCK(troupe)

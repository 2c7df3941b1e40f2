// The project's CAF types and atoms, in one type-ID block.
#pragma once

#include <caf/type_id.hpp>

#include "actors/caf/wire_message.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(troupe, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(troupe, (troupe::wire_message))
  CAF_ADD_ATOM(troupe, troupe, step_atom, "step")
  CAF_ADD_ATOM(troupe, troupe, health_atom, "health")
  CAF_ADD_ATOM(troupe, troupe, heartbeat_atom, "heartbeat")
CAF_END_TYPE_ID_BLOCK(troupe)

// router_calls: what both gateways ask the router, from their own threads (KJ's, or an
// HTTP worker's), waiting at most a second for the answer.
#pragma once

#include <cstdint>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

namespace troupe {

struct router_health {
  bool ready = false;  // a replica can serve now (and the gateway is not draining)
  uint32_t replicas = 0, replicas_ready = 0;
  uint64_t outages = 0;
  uint64_t last_down_ms = 0;  // when a replica last stopped being ready (Unix time, ms; 0: never)
  std::string detail = "the router does not answer";
};
router_health ask_health(caf::actor_system& sys, const caf::actor& router, bool draining);

struct router_stats {
  uint32_t kv_used = 0, kv_free = 0, running = 0, waiting = 0;
};
router_stats ask_stats(caf::actor_system& sys, const caf::actor& router);

}  // namespace troupe

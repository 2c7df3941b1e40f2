#include "actors/gateway/router_calls.hpp"

#include <chrono>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"

namespace troupe {

router_health ask_health(caf::actor_system& sys, const caf::actor& router, bool draining) {
  router_health h;
  caf::scoped_actor self{sys};
  self->request(router, std::chrono::seconds(1), health_atom_v)
      .receive(
          [&](bool ready, uint32_t replicas, uint32_t replicas_ready, const std::string& detail, uint64_t outages,
              uint64_t last_down_ms) { h = router_health{ready, replicas, replicas_ready, outages, last_down_ms, detail}; 
          },
          [](caf::error&) {});
  if (draining) {
    h.ready = false;
    h.detail = "the gateway is draining";
  }
  return h;
}

router_stats ask_stats(caf::actor_system& sys, const caf::actor& router) {
  router_stats s;
  caf::scoped_actor self{sys};
  self->request(router, std::chrono::seconds(1), stats_atom_v)
      .receive([&](uint32_t used, uint32_t free, uint32_t running, uint32_t waiting) { s = {used, free, running, waiting}; },
               [](caf::error&) {});
  return s;
}

}  // namespace troupe

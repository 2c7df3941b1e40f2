// system_config: the CAF configuration every troupe process starts from: the project's
// message types, and middleman heartbeats with finite timeouts (CAF 0.17 sends none by
// default, so a hung peer would never be noticed). The same values must be set on every
// node: a node with a timeout drops peers that send no heartbeats.
#pragma once

#include <chrono>

#include <caf/actor_system_config.hpp>

namespace troupe {

struct failure_detection {
  std::chrono::milliseconds heartbeat_interval{100};
  std::chrono::milliseconds connection_timeout{500};
};

class system_config : public caf::actor_system_config {
 public:
  explicit system_config(const failure_detection& fd = {});
};

}  // namespace troupe

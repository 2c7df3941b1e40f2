// node_serving: troupe-node's actors and its two ways to serve, wired from a node_plan. A
// node runs its stages (and the schedulers placed on it) under its node agent; the
// gateway's node also runs the router and the client endpoints. Each serving function
// returns when a stop signal (SIGINT, SIGTERM) arrives, with the process's exit code.
#pragma once

#include <signal.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/node_agent.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/common/node_plan.hpp"

namespace troupe::tools {

// The node agent's units: its stages, then each replica's kv manager and scheduler.
std::vector<unit_spec> units_of(const node_plan& p, const model& m);

// Measures the round trip to the plan's next hop once it answers (200 pings) and prints it,
// so that operators see what a pipeline hop costs; ends early when `stopping` is set.
std::thread report_hop(caf::actor_system& sys, const node_plan& p, std::atomic<bool>& stopping);

// A node without the gateway: says `node: NAME` and serves its stages until a stop signal.
int serve_stages(const node_plan& p, const sigset_t& stop_signals);

// The gateway's node: the router over every replica, the Cap'n Proto and HTTP endpoints
// (announced once a replica is ready, or after the recovery timeout with a warning), and on
// a stop signal a drain of up to 30 s before it stops.
int serve_gateway(caf::actor_system& sys, const caf::actor& agent, const node_plan& p, const topology& t,
                  const loaded_model& model, std::vector<std::string> api_keys, const sigset_t& stop_signals);

}  // namespace troupe::tools

// router_actor: the gateway's way to the replicas. The decisions are request_router's
// (engine/serve/request_router.hpp): each request to the ready replica its policy picks
// (least-loaded: the fewest requests; kv-aware: the lowest cost of computing what that
// replica lacks of the prompt behind its queue); its chunks relayed to its sink with the router's own numbers; when a replica's
// scheduler dies (its actor killed, its node gone or hung past the heartbeat timeout),
// its requests resubmitted to another ready replica (or the same one, once it is back)
// with the output already delivered, so that each stream continues where it stopped and
// the client sees every token once, in order. Requests wait for a ready replica for at
// most `wait_timeout`, then end with an error. This actor finds and polls the schedulers
// and carries out those decisions.
//
//   (generate_atom, id, GenerateRequest frame, sink) -> ()   the caller's id
//   (generate_atom, GenerateRequest frame, sink)     -> id
//   (cancel_atom, id)                                -> found (bool)
//   (stats_atom)   -> (kv used, kv free, running, waiting), summed over the replicas
//   (health_atom)  -> (ready, replicas, replicas ready, detail, outages: how often a
//                     replica stopped being ready, when one last did: Unix time in
//                     ms, 0 if never)
//   (health_atom, n) -> replicas ready, answered once at least n are (the caller's
//                     timeout bounds the wait)
//   (metrics_atom) -> Prometheus text: replicas ready, failovers, resubmitted requests,
//                     actor restarts per node (every node agent asked once a second),
//                     each SLO class's requests by outcome and its attainment
//
// Each finished request is logged (spdlog, one line: id, outcome, replica, tokens in and
// out, time to first token, end-to-end time, resubmissions; never prompt or output text).
// Replicas are polled for health every 100 ms (kv-aware: for their prefix summaries every
// 500 ms, and text prompts tokenized here to route them), and schedulers say at once when they stop
// or start being ready; a scheduler is found by name through the node agent of its node,
// local or at HOST:PORT. Time is the actor system's clock (CAF's test clock in tests).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/sched/slo.hpp"
#include "engine/serve/request_router.hpp"
#include "engine/tokenizer/tokenizer.hpp"

namespace troupe {

struct replica_address {
  std::string name;        // the replica
  std::string scheduler;   // the scheduler's name at its node's agent
  std::string host;        // empty: the local agent
  uint16_t port = 0;
  replica_role role = replica_role::both;
};

// A node whose agent the router asks for restart counts (empty host: this node).
struct node_address {
  std::string name;
  std::string host;
  uint16_t port = 0;
};

struct router_setup {
  std::vector<replica_address> replicas;
  std::vector<node_address> nodes;
  caf::actor agent;  // this node's agent, for local schedulers
  std::chrono::milliseconds wait_timeout{30000};
  route_config route;              // the policy and its weights (its wait_timeout: the above)
  const tokenizer* tok = nullptr;  // kv-aware: reads text prompts (none: prompts of ids only)
  int32_t block_size = 16;         // kv-aware: the replicas' KV block size
  int32_t context = 0;             // kv-aware: longest prompt worth reading (0: any)
  std::vector<slo_class> classes;  // SLO classes, for their attainment in /metrics
  int32_t default_class = -1;      // the class of requests that name none
};

caf::actor spawn_router(caf::actor_system& sys, const router_setup& setup);

}  // namespace troupe

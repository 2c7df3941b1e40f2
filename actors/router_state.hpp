// router_actor's inside, shared by its files: router_actor.cpp (messages, and carrying
// out request_router's actions) and router_polls.cpp (finding and polling the schedulers
// and node agents, and the metrics they feed). Internal to actors/.
#pragma once

#include <array>
#include <memory>
#include <chrono>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/caf/wire_message.hpp"
#include "actors/router_actor.hpp"
#include "actors/scheduler_figures.hpp"
#include "actors/wire/control_codec.hpp"
#include "engine/serve/request_router.hpp"

namespace troupe::router_actor_impl {

// A replica's scheduler as this actor knows it: how to reach it, and what it last said.
struct replica_slot {
  replica_address addr;
  caf::actor sched = {};  // invalid while unknown or down
  caf::actor agent = {};  // the agent that names it (remote ones are looked up once)
  bool resolving = false;
  // What its scheduler last said of its work (`now`, which counts from zero when the
  // scheduler restarts), and what the replica's earlier schedulers counted (`base`).
  scheduler_figures base = {}, now = {};
  bool polled = false;  // `now` is a scheduler's answer
  caf::actor_addr counted = {};  // the scheduler `now` is of
  // What its scheduler last said of itself, for the status page.
  uint32_t kv_used = 0, kv_free = 0, running = 0, waiting = 0;
  bool summary_asked = false;  // kv-aware: a prefix summary is being asked for
};

// A change the status page lists: a replica ready or not (and why), lost, or found.
struct router_event {
  std::chrono::system_clock::time_point at;
  std::string what;
};

// Where a request's messages go, and the frame it came in (sent again on resubmission).
struct client {
  caf::actor sink;
  wire_message request;
  int32_t slo = -1;  // its SLO class (router_setup::classes), or -1
};

struct node_slot {
  node_address addr;
  caf::actor agent = {};
  bool asking = false;
  uint32_t restarts = 0;  // over the node's supervised actors, as its agent last said
  bool answered = false;
  std::vector<wire::tier_figures> tiers = {};  // its process's KV tiers, as its agent last said
  std::vector<wire::link_figures> links = {};  // what its step links and KV landings saw of their peers
};

struct router_state {
  static inline const char* name = "troupe.router";
  router_setup setup;
  std::unique_ptr<request_router> core;
  std::vector<replica_slot> replicas;
  std::vector<std::string> names;  // of the replicas, for health
  std::unordered_map<uint64_t, client> clients;
  std::vector<node_slot> nodes;
  uint64_t next_client = uint64_t{3} << 62;  // ids for callers that let the router choose
  uint64_t ticks = 0;
  // Callers waiting for at least so many replicas to be ready.
  std::vector<std::pair<uint32_t, caf::response_promise>> ready_waiters;
  std::vector<std::array<uint64_t, slo_outcomes>> slo_counts;  // per class, by slo_outcome
  std::deque<router_event> events;  // the latest, oldest first (at most max_events)
  static constexpr size_t max_events = 32;
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();

  void note(std::string what) {
    events.push_back({std::chrono::system_clock::now(), std::move(what)});
    if (events.size() > max_events) events.pop_front();
  }
};

using self_ptr = caf::stateful_actor<router_state>*;

// A replica's scheduler said whether it is ready (and why not): request_router hears it,
// and callers waiting for replicas are answered.
void health_of(self_ptr self, size_t k, bool ready, const std::string& detail);

// router_polls.cpp
void poll_one(self_ptr self, size_t k);
void poll_nodes(self_ptr self);
// kv-aware routing: asks replica k's scheduler for its prefix summary.
void poll_summary(self_ptr self, size_t k);

// router_metrics.cpp
std::string render_metrics(const router_state& st);
// The status page's figures, as JSON (actors/gateway/status_page.hpp).
std::string render_status(const router_state& st);
// For /health: the nodes whose step links or KV landings saw a stall in the last minute
// ("node n1: a step link stalled 4 s ago, 2 in all"); empty when none did.
std::string recent_link_stalls(const router_state& st);

}  // namespace troupe::router_actor_impl

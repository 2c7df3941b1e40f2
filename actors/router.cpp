#include "actors/router.hpp"

#include <deque>
#include <unordered_map>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/agent_link.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/control_codec.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;

struct replica_slot {
  replica_address addr;
  caf::actor sched = {};  // invalid while unknown or down
  caf::actor agent = {};  // the agent that names it (remote ones are looked up once)
  bool resolving = false;
  bool ready = false;
  std::string detail = "not found yet";
  uint32_t used = 0, free = 0, running = 0, waiting = 0, cached = 0;
  // Prefix-cache counts: of the schedulers this replica had before (base), and of its
  // scheduler now, which counts from zero when it restarts.
  uint64_t hit_base = 0, queried_base = 0, hit_now = 0, queried_now = 0;
  caf::actor_addr counted = {};  // the scheduler hit_now and queried_now are of
  size_t active = 0;  // requests routed here and not finished
};

struct routed {
  caf::actor sink;
  wire_message request;
  std::vector<int32_t> delivered;
  uint32_t seq = 0;           // next chunk number for the client
  uint64_t attempt = 0;       // 0: waiting for a replica
  int32_t replica = -1;
  clock_type::time_point waiting_since = clock_type::now();
  clock_type::time_point arrived = clock_type::now();
  double ttft_ms = -1;
  uint32_t resubmits = 0;
  bool cancelled = false;     // the client cancelled: never resubmitted
};

struct node_slot {
  node_address addr;
  caf::actor agent = {};
  bool asking = false;
  uint32_t restarts = 0;  // over the node's supervised actors, as its agent last said
  bool answered = false;
};

struct router_state {
  static inline const char* name = "troupe.router";
  router_setup setup;
  std::vector<replica_slot> replicas;
  std::unordered_map<uint64_t, routed> requests;   // by client id
  std::unordered_map<uint64_t, uint64_t> attempts; // attempt id -> client id
  std::deque<uint64_t> parked;                     // client ids waiting for a replica
  uint64_t next_attempt = uint64_t{2} << 62;  // ids of resubmissions (a first attempt
                                              // uses the client's id)
  uint64_t next_client = uint64_t{3} << 62;        // ids for callers that let the router choose (above
                                                   // the gateways' ranges)
  uint64_t resubmitted = 0;
  uint64_t failovers = 0;  // replica schedulers lost (the actor or its node)
  uint64_t outages = 0;    // times a replica stopped being ready (health reports it, so a
                           // failure repaired between two health polls is still seen)
  std::vector<node_slot> nodes;
  uint64_t ticks = 0;
};

using self_ptr = caf::stateful_actor<router_state>*;

void set_ready(router_state& st, replica_slot& rep, bool ready) {
  if (rep.ready && !ready) ++st.outages;
  rep.ready = ready;
}

// One structured line per finished request; never the prompt or the output.
void log_finished(const router_state& st, uint64_t id, const routed& r, const char* outcome, uint32_t tokens_in,
                  uint32_t tokens_out) {
  const double e2e = std::chrono::duration<double, std::milli>(clock_type::now() - r.arrived).count();
  spdlog::info("request id={} outcome={} replica={} tokens_in={} tokens_out={} ttft_ms={:.1f} e2e_ms={:.1f} resubmits={}", id,
               outcome, r.replica >= 0 ? st.replicas[r.replica].addr.name : "-", tokens_in, tokens_out,
               r.ttft_ms < 0 ? 0.0 : r.ttft_ms, e2e, r.resubmits);
}

void finish_with_error(self_ptr self, uint64_t id, const std::string& why, wire::error_kind kind) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  step_output out;
  out.id = request_id{id};
  out.finished = true;
  out.num_output_tokens = static_cast<int32_t>(it->second.delivered.size());
  self->send(it->second.sink, done_atom_v,
             wire_message(wire_kind::none, wire::encode_generate_result(id, out, it->second.seq, why, kind)));
  log_finished(st, id, it->second, "error", 0, static_cast<uint32_t>(it->second.delivered.size()));
  if (it->second.attempt) st.attempts.erase(it->second.attempt);
  if (it->second.replica >= 0) --st.replicas[it->second.replica].active;
  st.requests.erase(it);
}

// Sends a request to the least busy ready replica, or parks it.
void submit(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  routed& r = it->second;
  int32_t best = -1;
  for (size_t k = 0; k < st.replicas.size(); ++k)
    if (st.replicas[k].ready && st.replicas[k].sched && (best < 0 || st.replicas[k].active < st.replicas[best].active))
      best = static_cast<int32_t>(k);
  if (best < 0) {
    r.attempt = 0;
    r.replica = -1;
    st.parked.push_back(id);
    return;
  }
  wire_message frame = r.request;
  if (!r.delivered.empty()) {
    auto with = wire::with_delivered(*r.request.bytes, r.delivered);
    if (!with) return finish_with_error(self, id, with.err().message, wire::error_kind::internal);
    frame = wire_message(wire_kind::none, std::move(with).value());
  }
  // A first attempt carries the client's id, so its chunks pass through unchanged.
  r.attempt = r.resubmits == 0 && !st.attempts.count(id) ? id : st.next_attempt++;
  r.replica = best;
  st.attempts[r.attempt] = id;
  ++st.replicas[best].active;
  self->send(st.replicas[best].sched, generate_atom_v, r.attempt, frame, caf::actor_cast<caf::actor>(self));
}

void unpark(self_ptr self) {
  auto& st = self->state;
  std::deque<uint64_t> parked;
  parked.swap(st.parked);
  for (uint64_t id : parked) {
    auto it = st.requests.find(id);
    if (it == st.requests.end() || it->second.attempt != 0) continue;
    if (clock_type::now() - it->second.waiting_since > st.setup.wait_timeout) {
      finish_with_error(self, id,
                        "no replica could serve the request within " + std::to_string(st.setup.wait_timeout.count() / 1000) + " s",
                        wire::error_kind::unavailable);
      continue;
    }
    submit(self, id);
  }
}

// The replica's scheduler is gone: its requests go elsewhere with what they delivered.
void replica_lost(self_ptr self, size_t k, const std::string& why) {
  auto& st = self->state;
  replica_slot& rep = st.replicas[k];
  if (rep.sched) self->demonitor(rep.sched);
  rep.sched = caf::actor{};
  set_ready(st, rep, false);
  rep.detail = why;
  rep.active = 0;
  std::vector<uint64_t> moved, cancelled;
  for (auto& [id, r] : st.requests)
    if (r.replica == static_cast<int32_t>(k) && r.cancelled) {
      cancelled.push_back(id);
    } else if (r.replica == static_cast<int32_t>(k)) {
      st.attempts.erase(r.attempt);
      r.attempt = 0;
      r.replica = -1;
      r.waiting_since = clock_type::now();
      ++r.resubmits;
      moved.push_back(id);
    }
  if (!moved.empty())
    std::fprintf(stderr, "troupe: replica %s lost (%s): %zu request(s) resubmitted\n", rep.addr.name.c_str(), why.c_str(),
                 moved.size());
  st.resubmitted += moved.size();
  ++st.failovers;
  // A request the client cancelled ends now, as cancelled, wherever its replica went.
  for (uint64_t id : cancelled) {
    routed& r = st.requests.at(id);
    st.attempts.erase(r.attempt);
    step_output out;
    out.id = request_id{id};
    out.finished = true;
    out.reason = finish_reason::aborted;
    out.num_output_tokens = static_cast<int32_t>(r.delivered.size());
    self->send(r.sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(id, out, r.seq)));
    log_finished(st, id, r, "cancelled", 0, static_cast<uint32_t>(r.delivered.size()));
    st.requests.erase(id);
  }
  for (uint64_t id : moved) submit(self, id);
}

void poll_one(self_ptr self, size_t k);

void find_scheduler(self_ptr self, size_t k) {
  auto& st = self->state;
  replica_slot& rep = st.replicas[k];
  if (rep.resolving) return;
  rep.resolving = true;
  with_agent(
      self, st.setup.agent, rep.agent, rep.addr.host, rep.addr.port,
      [self, k](caf::actor agent, bool fresh) {
        replica_slot& rep = self->state.replicas[k];
        if (fresh) {
          rep.agent = agent;
          self->monitor(agent);
        }
        self->request(agent, std::chrono::seconds(2), lookup_atom_v, rep.addr.scheduler)
            .then(
                [self, k](const caf::actor& sched) {
                  replica_slot& rep = self->state.replicas[k];
                  rep.resolving = false;
                  if (!sched) return;
                  rep.sched = sched;
                  self->monitor(sched);
                  if (rep.counted != sched.address()) {  // a new scheduler, not the same one found again
                    rep.hit_base += rep.hit_now;
                    rep.queried_base += rep.queried_now;
                    rep.hit_now = rep.queried_now = 0;
                    rep.counted = sched.address();
                  }
                  poll_one(self, k);
                },
                [self, k](caf::error& e) {
                  replica_slot& rep = self->state.replicas[k];
                  rep.resolving = false;
                  rep.detail = "scheduler not found: " + self->system().render(e);
                  rep.agent = caf::actor{};  // connect again next time
                });
      },
      [self, k](caf::error& e) {
        replica_slot& rep = self->state.replicas[k];
        rep.resolving = false;
        rep.detail = "node " + rep.addr.host + ":" + std::to_string(rep.addr.port) + " unreachable: " + self->system().render(e);
      });
}

void poll_one(self_ptr self, size_t k) {
  replica_slot& rep = self->state.replicas[k];
  if (!rep.sched) return find_scheduler(self, k);
  self->request(rep.sched, std::chrono::seconds(1), health_atom_v)
      .then(
          [self, k](bool ready, uint32_t used, uint32_t free, uint32_t running, uint32_t waiting, const std::string& detail) {
            replica_slot& rep = self->state.replicas[k];
            if (!rep.sched) return;
            const bool was = rep.ready;
            set_ready(self->state, rep, ready);
            rep.detail = detail;
            rep.used = used;
            rep.free = free;
            rep.running = running;
            rep.waiting = waiting;
            if (ready && !was) unpark(self);
          },
          [self, k](caf::error&) {
            replica_slot& rep = self->state.replicas[k];
            set_ready(self->state, rep, false);
            rep.detail = "the scheduler does not answer";
          });
  self->request(rep.sched, std::chrono::seconds(1), metrics_atom_v)
      .then(
          [self, k](uint32_t cached, uint64_t hits, uint64_t queried) {
            replica_slot& rep = self->state.replicas[k];
            rep.cached = cached;
            rep.hit_now = hits;
            rep.queried_now = queried;
          },
          [](caf::error&) {});
}

void poll(self_ptr self) {
  for (size_t k = 0; k < self->state.replicas.size(); ++k) poll_one(self, k);
}

// Every node agent's restart count, for /metrics.
void poll_nodes(self_ptr self) {
  auto& st = self->state;
  for (size_t k = 0; k < st.nodes.size(); ++k) {
    node_slot& n = st.nodes[k];
    if (n.asking) continue;
    n.asking = true;
    with_agent(
        self, st.setup.agent, n.agent, n.addr.host, n.addr.port,
        [self, k](caf::actor agent, bool fresh) {
          if (fresh) self->state.nodes[k].agent = agent;
          self->request(agent, std::chrono::seconds(1), health_atom_v)
              .then(
                  [self, k](const wire_message& m) {
                    node_slot& n = self->state.nodes[k];
                    n.asking = false;
                    auto h = m.bytes ? wire::decode_node_health(*m.bytes) : expected<wire::node_health>(error{"empty"});
                    if (!h) return;
                    n.restarts = 0;
                    for (auto& a : h->actors) n.restarts = std::max(n.restarts, a.restarts);
                    n.answered = true;
                  },
                  [self, k](caf::error&) {
                    node_slot& n = self->state.nodes[k];
                    n.asking = n.answered = false;
                    n.agent = caf::actor{};  // connect again next time
                  });
        },
        [self, k](caf::error&) { self->state.nodes[k].asking = self->state.nodes[k].answered = false; });
  }
}

std::string render_metrics(const router_state& st) {
  std::string out;
  uint32_t ready = 0;
  for (auto& rep : st.replicas) ready += rep.ready && rep.sched ? 1 : 0;
  out += "# HELP troupe_replicas Replicas behind the router.\n# TYPE troupe_replicas gauge\n";
  out += "troupe_replicas " + std::to_string(st.replicas.size()) + "\n";
  out += "# HELP troupe_replicas_ready Replicas that can serve now.\n# TYPE troupe_replicas_ready gauge\n";
  out += "troupe_replicas_ready " + std::to_string(ready) + "\n";
  out += "# HELP troupe_replica_failovers_total Replica schedulers lost (their requests moved to a ready replica).\n"
         "# TYPE troupe_replica_failovers_total counter\n";
  out += "troupe_replica_failovers_total " + std::to_string(st.failovers) + "\n";
  out += "# HELP troupe_requests_resubmitted_total Requests resubmitted to another replica.\n"
         "# TYPE troupe_requests_resubmitted_total counter\n";
  out += "troupe_requests_resubmitted_total " + std::to_string(st.resubmitted) + "\n";
  uint32_t cached = 0;
  uint64_t hits = 0, queried = 0;
  for (auto& rep : st.replicas) {
    cached += rep.cached;
    hits += rep.hit_base + rep.hit_now;
    queried += rep.queried_base + rep.queried_now;
  }
  out += "# HELP troupe_kv_blocks_cached KV blocks holding a cached prefix, in use or free.\n"
         "# TYPE troupe_kv_blocks_cached gauge\n";
  out += "troupe_kv_blocks_cached " + std::to_string(cached) + "\n";
  out += "# HELP troupe_prefix_cache_hit_tokens_total Prompt tokens served by the prefix cache.\n"
         "# TYPE troupe_prefix_cache_hit_tokens_total counter\n";
  out += "troupe_prefix_cache_hit_tokens_total " + std::to_string(hits) + "\n";
  out += "# HELP troupe_prefix_cache_queried_tokens_total Prompt tokens looked up in the prefix cache.\n"
         "# TYPE troupe_prefix_cache_queried_tokens_total counter\n";
  out += "troupe_prefix_cache_queried_tokens_total " + std::to_string(queried) + "\n";
  out += "# HELP troupe_actor_restarts_total Restarts of a node's supervised actors (the most of any unit), since "
         "the node process started.\n# TYPE troupe_actor_restarts_total counter\n";
  for (auto& n : st.nodes)
    if (n.answered) out += "troupe_actor_restarts_total{node=\"" + n.addr.name + "\"} " + std::to_string(n.restarts) + "\n";
  return out;
}

caf::behavior router_behavior(self_ptr self, router_setup setup) {
  auto& st = self->state;
  st.setup = setup;
  for (auto& a : setup.replicas) st.replicas.push_back(replica_slot{a});
  for (auto& n : setup.nodes) st.nodes.push_back(node_slot{n});
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t k = 0; k < st.replicas.size(); ++k) {
      if (st.replicas[k].sched && st.replicas[k].sched.address() == dm.source)
        return replica_lost(self, k, "scheduler down: " + self->system().render(dm.reason));
      if (st.replicas[k].agent && st.replicas[k].agent.address() == dm.source) st.replicas[k].agent = caf::actor{};
    }
  });
  self->send(self, tick_atom_v);
  auto accept = [self](uint64_t id, const wire_message& req, const caf::actor& sink) {
    auto& st = self->state;
    if (st.requests.count(id)) {
      step_output out;
      out.finished = true;
      self->send(sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(id, out, 0, "request id in use")));
      return;
    }
    if (!req.bytes) {
      step_output out;
      out.finished = true;
      self->send(sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(id, out, 0, "empty request")));
      return;
    }
    routed r;
    r.sink = sink;
    r.request = req;
    st.requests.emplace(id, std::move(r));
    submit(self, id);
  };
  return {
      [accept](generate_atom, uint64_t id, const wire_message& req, const caf::actor& sink) { accept(id, req, sink); },
      [self, accept](generate_atom, const wire_message& req, const caf::actor& sink) -> uint64_t {
        const uint64_t id = self->state.next_client++;
        accept(id, req, sink);
        return id;
      },
      [self](cancel_atom, uint64_t id) -> bool {
        auto& st = self->state;
        auto it = st.requests.find(id);
        if (it == st.requests.end()) return false;
        if (it->second.attempt == 0) {
          step_output out;
          out.id = request_id{id};
          out.finished = true;
          out.reason = finish_reason::aborted;
          out.num_output_tokens = static_cast<int32_t>(it->second.delivered.size());
          self->send(it->second.sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(id, out, it->second.seq)));
          log_finished(st, id, it->second, "cancelled", 0, static_cast<uint32_t>(it->second.delivered.size()));
          st.requests.erase(it);
          return true;
        }
        it->second.cancelled = true;
        // Anonymous: the scheduler's answer (whether it knew the request) has no use here.
        caf::anon_send(st.replicas[it->second.replica].sched, cancel_atom_v, it->second.attempt);
        return true;
      },
      [self](chunk_atom, const wire_message& m) {
        auto& st = self->state;
        if (!m.bytes) return;
        auto c = wire::peek_token_chunk(*m.bytes);
        if (!c) return;
        auto a = st.attempts.find(c->request);
        if (a == st.attempts.end()) return;  // an attempt the router gave up on
        routed& r = st.requests.at(a->second);
        wire_message forward = m;
        if (c->request != a->second || c->seq != r.seq) {
          auto out = wire::renumber_chunk(*m.bytes, a->second, r.seq);
          if (!out) return;
          forward = wire_message(wire_kind::none, std::move(out).value());
        }
        ++r.seq;
        if (r.ttft_ms < 0 && !c->tokens.empty())
          r.ttft_ms = std::chrono::duration<double, std::milli>(clock_type::now() - r.arrived).count();
        r.delivered.insert(r.delivered.end(), c->tokens.begin(), c->tokens.end());
        self->send(r.sink, chunk_atom_v, std::move(forward));
      },
      [self](done_atom, const wire_message& m) {
        auto& st = self->state;
        if (!m.bytes) return;
        auto res = wire::decode_generate_result(*m.bytes);
        if (!res) return;
        auto a = st.attempts.find(res->request);
        if (a == st.attempts.end()) return;
        const uint64_t id = a->second;
        routed& r = st.requests.at(id);
        auto parts = wire::split_final_result(*m.bytes, id, r.seq);
        if (!parts) return finish_with_error(self, id, parts.err().message, wire::error_kind::internal);
        if (parts->last) self->send(r.sink, chunk_atom_v, wire_message(wire_kind::none, std::move(*parts->last)));
        self->send(r.sink, done_atom_v, wire_message(wire_kind::none, std::move(parts->result)));
        if (r.ttft_ms < 0 && !parts->last_tokens.empty())
          r.ttft_ms = std::chrono::duration<double, std::milli>(clock_type::now() - r.arrived).count();
        const char* outcome = !res->error.empty() ? "error"
                              : res->reason == finish_reason::aborted ? "cancelled"
                              : res->reason == finish_reason::length  ? "length"
                                                                      : "stop";
        log_finished(st, id, r, outcome, res->prompt_tokens, res->output_tokens);
        --st.replicas[r.replica].active;
        st.attempts.erase(a);
        st.requests.erase(id);
      },
      [self](stats_atom) -> caf::result<uint32_t, uint32_t, uint32_t, uint32_t> {
        // Asked afresh of every scheduler that is there (the polls lag by up to 100 ms).
        auto& st = self->state;
        auto rp = self->make_response_promise<uint32_t, uint32_t, uint32_t, uint32_t>();
        struct sum {
          uint32_t used = 0, free = 0, running = 0;
          size_t pending = 0;
        };
        auto total = std::make_shared<sum>();
        auto finish = [self, rp, total]() mutable {
          if (--total->pending != 0) return;
          // Waiting: everything admitted here and not running (exact).
          const uint32_t all = static_cast<uint32_t>(self->state.requests.size());
          const uint32_t running = std::min(total->running, all);
          rp.deliver(total->used, total->free, running, all - running);
        };
        total->pending = 1;
        for (auto& rep : st.replicas) {
          if (!rep.sched) continue;
          ++total->pending;
          self->request(rep.sched, std::chrono::seconds(1), stats_atom_v)
              .then(
                  [total, finish](uint32_t used, uint32_t free, uint32_t running, uint32_t) mutable {
                    total->used += used;
                    total->free += free;
                    total->running += running;
                    finish();
                  },
                  [finish](caf::error&) mutable { finish(); });
        }
        finish();
        return rp;
      },
      [self](health_atom) {
        auto& st = self->state;
        uint32_t ready = 0;
        std::string detail;
        for (auto& rep : st.replicas) {
          if (rep.ready && rep.sched) {
            ++ready;
          } else {
            if (!detail.empty()) detail += "; ";
            detail += "replica " + rep.addr.name + ": " + (rep.detail.empty() ? "not ready" : rep.detail);
          }
        }
        return caf::make_message(ready > 0, static_cast<uint32_t>(st.replicas.size()), ready, detail, st.outages);
      },
      [self](health_atom, bool ready) {
        // A scheduler says it stopped or started being ready.
        auto& st = self->state;
        for (auto& rep : st.replicas)
          if (rep.sched && rep.sched.address() == self->current_sender()) {
            const bool was = rep.ready;
            set_ready(st, rep, ready);
            if (!ready) rep.detail = "recovering";
            if (ready && !was) unpark(self);
          }
      },
      [self](metrics_atom) { return render_metrics(self->state); },
      [self](tick_atom) {
        poll(self);
        unpark(self);
        if (self->state.ticks++ % 10 == 0) poll_nodes(self);
        self->delayed_send(self, std::chrono::milliseconds(100), tick_atom_v);
      },
  };
}

}  // namespace

caf::actor spawn_router(caf::actor_system& sys, const router_setup& setup) { return sys.spawn(router_behavior, setup); }

}  // namespace troupe

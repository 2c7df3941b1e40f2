// The router actor's lookups and polls: each replica's scheduler found through its
// node's agent and asked for its health, prefix-cache counts and speculative decoding
// figures, every node agent asked for its restarts, KV tiers and links (router_state.hpp;
// the metrics they make: router_metrics.cpp).
#include "actors/agent_link.hpp"
#include "actors/caf/errors.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/router_state.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/wire/control_codec.hpp"

namespace troupe::router_actor_impl {

namespace {

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
                    if (rep.polled) {
                      add_counters(rep.base, rep.now);
                      rep.base.spec_method = rep.now.spec_method;  // whose speculation counts they are
                    }
                    rep.now = {};
                    rep.polled = false;
                    rep.counted = sched.address();
                  }
                  self->state.core->replica_found(k);
                  poll_one(self, k);
                },
                [self, k](caf::error& e) {
                  replica_slot& rep = self->state.replicas[k];
                  rep.resolving = false;
                  self->state.core->replica_detail(k, "scheduler not found: " + reason_of(e));
                  rep.agent = caf::actor{};  // connect again next time
                });
      },
      [self, k](caf::error& e) {
        replica_slot& rep = self->state.replicas[k];
        rep.resolving = false;
        self->state.core->replica_detail(
            k, "node " + rep.addr.host + ":" + std::to_string(rep.addr.port) + " unreachable: " + reason_of(e));
      });
}

}  // namespace

void poll_one(self_ptr self, size_t k) {
  replica_slot& rep = self->state.replicas[k];
  if (!rep.sched) return find_scheduler(self, k);
  const caf::actor_addr asked = rep.sched.address();
  self->request(rep.sched, std::chrono::seconds(1), health_atom_v)
      .then(
          [self, k, asked](bool ready, uint32_t used, uint32_t free, uint32_t running, uint32_t waiting,
                           const std::string& detail) {
            replica_slot& rep = self->state.replicas[k];
            if (rep.sched.address() != asked) return;
            rep.kv_used = used;
            rep.kv_free = free;
            self->state.core->replica_free_blocks(k, free);
            rep.running = running;
            rep.waiting = waiting;
            health_of(self, k, ready, detail);
          },
          [self, k, asked](caf::error&) {
            if (self->state.replicas[k].sched.address() == asked) health_of(self, k, false, "the scheduler does not answer");
          });
  self->request(rep.sched, std::chrono::seconds(1), metrics_atom_v)
      .then(
          [self, k, asked](const scheduler_figures& f) {
            replica_slot& rep = self->state.replicas[k];
            if (rep.counted != asked) return;  // a scheduler since replaced
            rep.now = f;
            rep.polled = true;
          },
          [](caf::error&) {});
}

void poll_summary(self_ptr self, size_t k) {
  replica_slot& rep = self->state.replicas[k];
  if (!rep.sched || rep.summary_asked) return;
  rep.summary_asked = true;
  const caf::actor_addr asked = rep.sched.address();
  self->request(rep.sched, std::chrono::seconds(1), prefix_atom_v)
      .then(
          [self, k, asked](const std::vector<uint64_t>& words) {
            replica_slot& rep = self->state.replicas[k];
            rep.summary_asked = false;
            if (rep.sched.address() != asked) return;  // a scheduler since lost
            // Empty: the scheduler is recovering (its cache is being rebuilt).
            self->state.core->replica_summary(k, prefix_summary::from_words(words).value_or(prefix_summary{}));
          },
          [self, k](caf::error&) { self->state.replicas[k].summary_asked = false; });
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
                    n.tiers = std::move(h->tiers);
                    n.links = std::move(h->links);
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

}  // namespace troupe::router_actor_impl

#include "actors/node_agent.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <caf/all.hpp>

#include "actors/caf/errors.hpp"
#include "actors/caf/type_ids.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;

struct unit_state {
  unit_spec spec;
  unit_instance now;
  bool up = false;
  uint32_t restarts = 0;
  int32_t streak = 0;  // restarts in quick succession, for the backoff
  clock_type::time_point last_down{};
};

struct agent_state {
  static inline const char* name = "troupe.node_agent";
  std::string node;
  std::vector<unit_state> units;
  bool stopping = false;
  std::shared_ptr<tier_meter> meter;
  std::shared_ptr<link_meter> links;  // its step links' and KV landings' peers
};

using self_ptr = caf::stateful_actor<agent_state>*;

void start_unit(self_ptr self, size_t i) {
  unit_state& u = self->state.units[i];
  u.now = u.spec.spawn(caf::actor_cast<caf::actor>(self));
  u.up = true;
  for (auto& m : u.now.members) self->monitor(m.handle);
}

void unit_down(self_ptr self, size_t i) {
  auto& st = self->state;
  unit_state& u = st.units[i];
  if (!u.up) return;
  u.up = false;
  if (u.now.abort) u.now.abort();
  for (auto& m : u.now.members) self->send_exit(m.handle, caf::exit_reason::kill);
  if (st.stopping) return;
  const auto now = clock_type::now();
  u.streak = now - u.last_down < std::chrono::seconds(10) ? std::min(u.streak + 1, 6) : 0;
  u.last_down = now;
  const auto backoff = std::chrono::milliseconds(50) * (1 << u.streak);  // 50 ms .. 3.2 s
  self->delayed_send(self, std::min<std::chrono::milliseconds>(backoff, std::chrono::seconds(2)), respawn_atom_v,
                     static_cast<uint64_t>(i));
}

// (The node and units come as spawn arguments: CAF 0.17 binds a reference to a null
// pointer when it starts an actor whose function takes no argument beyond self.)
caf::behavior node_agent_behavior(self_ptr self, std::string node, std::vector<unit_spec> units,
                                  std::shared_ptr<tier_meter> meter, std::shared_ptr<link_meter> links) {
  auto& st = self->state;
  st.node = std::move(node);
  st.meter = std::move(meter);
  st.links = std::move(links);
  for (auto& spec : units) st.units.push_back(unit_state{spec, {}, false, 0, 0, {}});
  for (size_t i = 0; i < st.units.size(); ++i) start_unit(self, i);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t i = 0; i < st.units.size(); ++i)
      for (auto& m : st.units[i].now.members)
        if (m.handle.address() == dm.source) return unit_down(self, i);
  });
  self->set_exit_handler([self](const caf::exit_msg& em) {
    auto& st = self->state;
    st.stopping = true;
    // Last started first: a replica's scheduler goes before the stages it drives, so it
    // does not report them lost while the node stops.
    for (size_t i = st.units.size(); i-- > 0;) unit_down(self, i);
    self->quit(em.reason);
  });
  return {
      [self](respawn_atom, uint64_t i) {
        auto& st = self->state;
        if (st.stopping || i >= st.units.size() || st.units[i].up) return;
        ++st.units[i].restarts;
        start_unit(self, i);
      },
      [self](lookup_atom, const std::string& name) -> caf::result<caf::actor> {
        for (auto& u : self->state.units)
          if (u.up)
            for (auto& m : u.now.members)
              if (m.name == name) return m.handle;
        return make_error(error_code::not_found, "no live actor named '" + name + "' on node " + self->state.node);
      },
      [self](kill_atom, const std::string& name) -> bool {
        for (auto& u : self->state.units)
          if (u.up)
            for (auto& m : u.now.members)
              if (m.name == name) {
                self->send_exit(m.handle, caf::exit_reason::kill);
                return true;
              }
        return false;
      },
      [self](health_atom) {
        auto& st = self->state;
        wire::node_health h;
        h.node = st.node;
        h.pid = static_cast<uint32_t>(getpid());
        h.ready = true;
        for (auto& u : st.units) {
          h.ready = h.ready && u.up;
          for (auto& m : u.now.members) h.actors.push_back({m.name, m.kind, u.up, u.restarts});
        }
        if (st.meter)
          for (const auto& [kind, s] : st.meter->totals()) h.tiers.push_back({std::string(tier_kind_name(kind)), s});
        if (st.links)
          for (link_kind k : all_link_kinds) h.links.push_back({k, st.links->counts(k)});
        return wire_message(wire_kind::node_health, wire::encode_node_health(h));
      },
      [](ping_atom, uint64_t x) { return x; },
  };
}

}  // namespace

caf::actor spawn_node_agent(caf::actor_system& sys, std::string node, std::vector<unit_spec> units,
                            std::shared_ptr<tier_meter> meter, std::shared_ptr<link_meter> links) {
  return sys.spawn(node_agent_behavior, std::move(node), std::move(units), std::move(meter), std::move(links));
}

}  // namespace troupe

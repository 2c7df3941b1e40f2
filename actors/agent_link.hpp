// agent_link: how an actor reaches a node's agent to look something up there. The local
// agent when the address has no port; otherwise a remote agent the caller connected
// before (`known`), or, when it has none, a connection made now through node_links
// (troupe's middleman actor: within a time limit, over TLS where the topology says so).
// `use(agent, fresh)` runs with the agent (`fresh`: just connected, for the caller to
// keep and monitor); `fail(error)` when the node cannot be reached. Callers forget a
// remote agent when a request to it fails, so the next call connects again.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "actors/tls/node_links.hpp"

namespace troupe {

constexpr int connect_s = 8;  // for a connection: TCP (1 s), TLS (5 s) and CAF's handshake

template <class Self, class Use, class Fail>
void with_agent(Self* self, const caf::actor& local, const caf::actor& known, const std::string& host, uint16_t port,
                Use use, Fail fail) {
  if (port == 0) return use(local, false);
  if (known) return use(known, false);
  self->request(node_links(self->system()), std::chrono::seconds(connect_s), caf::connect_atom_v, host, port)
      .then([use](const caf::node_id&, caf::strong_actor_ptr& ptr,
                  const std::set<std::string>&) mutable { use(caf::actor_cast<caf::actor>(ptr), true); },
            [fail](caf::error& e) mutable { fail(e); });
}

// The blocking form, for threads outside actors (tools, a node's own threads).
caf::expected<caf::actor> connect_agent(caf::actor_system& sys, const std::string& host, uint16_t port);

}  // namespace troupe

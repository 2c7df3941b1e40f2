// agent_link: how an actor reaches a node's agent to look something up there. The local
// agent when the address has no port; otherwise a remote agent the caller connected
// before (`known`), or, when it has none, a connection made now through the middleman.
// `use(agent, fresh)` runs with the agent (`fresh`: just connected, for the caller to
// keep and monitor); `fail(error)` when the node cannot be reached. Callers forget a
// remote agent when a request to it fails, so the next call connects again.
//
// Connections go through node_links (troupe's middleman actor: within a time limit, over
// TLS where the topology says so). Where no node_links_scope serves the system, CAF's
// middleman connects, with a blocking connect() in its one thread: it is then asked only
// for an address that has just completed a TCP handshake (probed in a thread of its own,
// within probe_ms), so a peer that drops SYNs cannot hold it for the kernel's minutes.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "actors/tls/node_links.hpp"

namespace troupe {

constexpr int probe_ms = 1000;
constexpr int connect_s = 2;  // for the middleman's connection and handshake, after the probe

// A detached actor that answers one connect_atom with true once host:port completes a TCP
// handshake, or an error saying why not within probe_ms, then quits.
caf::behavior tcp_probe(caf::event_based_actor* self, std::string host, uint16_t port);

// The blocking form for threads outside actors (tools, a node's own threads): the
// connection (after the probe, through CAF's middleman), within its time.
caf::expected<caf::actor> connect_agent(caf::actor_system& sys, const std::string& host, uint16_t port);

template <class Self, class Use, class Fail>
void with_agent(Self* self, const caf::actor& local, const caf::actor& known, const std::string& host, uint16_t port,
                Use use, Fail fail) {
  if (port == 0) return use(local, false);
  if (known) return use(known, false);
  auto connect = [self, host, port, use, fail]() mutable {
    self->request(node_links(self->system()), std::chrono::seconds(connect_s), caf::connect_atom_v, host, port)
        .then([use](const caf::node_id&, caf::strong_actor_ptr& ptr,
                    const std::set<std::string>&) mutable { use(caf::actor_cast<caf::actor>(ptr), true); },
              [fail](caf::error& e) mutable { fail(e); });
  };
  if (own_links(self->system())) return connect();
  auto probe = self->system().template spawn<caf::detached>(tcp_probe, host, port);
  self->request(probe, std::chrono::milliseconds(probe_ms + 1000), caf::connect_atom_v)
      .then([connect](bool) mutable { connect(); }, [fail](caf::error& e) mutable { fail(e); });
}

}  // namespace troupe

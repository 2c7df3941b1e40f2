// node_links: how a node's actors reach other nodes. Plain, through CAF's own middleman
// actor; with [tls], through troupe's: the same BASP protocol over TLS 1.3, both ends
// showing a certificate of the cluster's CA. A peer that fails the handshake (no
// certificate, another cluster's, no TLS at all) is refused, and the node's log says who
// and why; one that has not finished its handshake within handshake_ms is closed. Either
// way connections are made within a time limit (a peer that drops SYNs costs seconds, not
// the kernel's minutes in the middleman's one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/io/middleman_actor.hpp>

#include "actors/tls/tls_context.hpp"
#include "engine/util/link_stream.hpp"

namespace troupe {

constexpr int handshake_ms = link_handshake_ms;

// Troupe's middleman actor for links to other nodes, for the scope's lifetime (declare it
// after the actor system, so it ends first): over TLS with `ctx`, plain TCP without; its
// connections are made within a time limit either way.
class node_links_scope {
 public:
  explicit node_links_scope(caf::actor_system& sys, std::shared_ptr<tls::context> ctx = nullptr);
  ~node_links_scope();
  node_links_scope(const node_links_scope&) = delete;
  node_links_scope& operator=(const node_links_scope&) = delete;

 private:
  caf::actor_system& sys_;
  caf::io::middleman_actor links_;
};

// The middleman actor for links to other nodes: a live node_links_scope's, else CAF's.
caf::io::middleman_actor node_links(caf::actor_system& sys);

// Publishes `agent` at host:port (0: any) through node_links: the port bound, or why not.
caf::expected<uint16_t> publish_agent(caf::actor_system& sys, const caf::actor& agent, uint16_t port,
                                      const std::string& host);

}  // namespace troupe

#include "actors/agent_link.hpp"

#include <unistd.h>

#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

expected<bool> probe(const std::string& host, uint16_t port) {
  auto fd = tcp::connect_to(host, port, probe_ms, "node " + host + ":" + std::to_string(port));
  if (!fd) return fd.err();
  ::close(*fd);
  return true;
}

}  // namespace

caf::behavior tcp_probe(caf::event_based_actor* self, std::string host, uint16_t port) {
  return {[self, host, port](caf::connect_atom) -> caf::result<bool> {
    self->quit();
    auto up = probe(host, port);
    if (!up) return caf::make_error(caf::sec::cannot_connect_to_node, up.err().message);
    return true;
  }};
}

caf::expected<caf::actor> connect_agent(caf::actor_system& sys, const std::string& host, uint16_t port) {
  if (!own_links(sys))
    if (auto up = probe(host, port); !up) return caf::make_error(caf::sec::cannot_connect_to_node, up.err().message);
  caf::scoped_actor self{sys};
  caf::expected<caf::actor> agent{caf::sec::cannot_connect_to_node};
  self->request(node_links(sys), std::chrono::seconds(connect_s), caf::connect_atom_v, host, port)
      .receive([&](const caf::node_id&, caf::strong_actor_ptr& ptr,
                   const std::set<std::string>&) { agent = caf::actor_cast<caf::actor>(ptr); },
               [&](caf::error& e) { agent = std::move(e); });
  if (agent && !*agent) return caf::make_error(caf::sec::no_actor_published_at_port, "nothing published at that port");
  return agent;
}

}  // namespace troupe

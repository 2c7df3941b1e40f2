#include "actors/agent_link.hpp"

namespace troupe {

caf::expected<caf::actor> connect_agent(caf::actor_system& sys, const std::string& host, uint16_t port) {
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

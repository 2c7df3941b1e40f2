#include "actors/agent_link.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

// An agent stand-in that answers any string with its reverse, after `prefix`. (Spawned
// with an argument: CAF 0.17 reads a null argument tuple for a function spawned with none,
// which UBSan reports.)
caf::behavior reverser(std::string prefix) {
  return {[prefix](const std::string& s) { return prefix + std::string(s.rbegin(), s.rend()); }};
}

// A listening port whose accept queue is full (nobody accepts): the kernel drops every
// further SYN, as a firewall or a host gone dark does, so a blocking connect() to it
// waits out the kernel's retries.
struct full_port {
  int listen_fd = -1;
  std::vector<int> fillers;
  uint16_t port = 0;
  full_port() {
    auto l = tcp::listen_on("127.0.0.1", 0, "the full port", 0);
    REQUIRE(l.has_value());
    listen_fd = l->fd;
    port = l->port;
    for (int i = 0; i < 16; ++i) {
      auto fd = tcp::connect_to("127.0.0.1", port, 200, "a filler");
      if (!fd) break;
      fillers.push_back(*fd);
    }
    REQUIRE(!fillers.empty());
    REQUIRE(fillers.size() < 16);  // the queue did fill
  }
  ~full_port() {
    for (int fd : fillers) ::close(fd);
    ::close(listen_fd);
  }
};

}  // namespace

TEST_CASE("connect_agent: an address that drops SYNs is refused in time and leaves node links free") {
  // The agent on a node of its own (a second actor system), as a real one is. (With the
  // agent in the connecting system, one sanitized run under load hung in that system's
  // shutdown, waiting for an actor while it held a connection to itself.)
  system_config remote_cfg;
  remote_cfg.load<caf::io::middleman>();
  caf::actor_system remote{remote_cfg};
  auto agent = remote.spawn(reverser, std::string());
  auto published = remote.middleman().publish(agent, 0, "127.0.0.1", true);
  REQUIRE(published);
  system_config cfg;
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  node_links_scope links(sys);

  full_port dark;
  auto refused = connect_agent(sys, "127.0.0.1", dark.port);
  REQUIRE(!refused);
  CHECK(refused.error() == caf::sec::cannot_connect_to_node);
  CHECK(sys.render(refused.error()).find(std::to_string(dark.port)) != std::string::npos);

  // Its connect gave up after a second, so it connects elsewhere at once (CAF's middleman
  // would sit in connect() for minutes, this request timing out behind it).
  auto reached = connect_agent(sys, "127.0.0.1", *published);
  REQUIRE(reached);
  caf::scoped_actor self{sys};
  std::string answer;
  self->request(*reached, std::chrono::seconds(5), std::string("agent")).receive(
      [&](const std::string& s) { answer = s; }, [&](caf::error& e) { answer = sys.render(e); });
  CHECK(answer == "tnega");
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("connect_agent: a closed port is an error naming it") {
  system_config cfg;
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  node_links_scope links(sys);
  auto l = tcp::listen_on("127.0.0.1", 0, "a port");
  REQUIRE(l.has_value());
  const uint16_t closed = l->port;
  ::close(l->fd);
  auto no_one = connect_agent(sys, "127.0.0.1", closed);
  REQUIRE(!no_one);
  CHECK(sys.render(no_one.error()).find("connect to 127.0.0.1:" + std::to_string(closed)) != std::string::npos);
}

}  // namespace troupe

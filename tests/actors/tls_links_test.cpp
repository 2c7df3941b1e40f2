#include <csignal>
#include <filesystem>
#include <string>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <doctest/doctest.h>

#include "actors/agent_link.hpp"
#include "actors/caf/system_config.hpp"
#include "actors/tls/node_links.hpp"
#include "actors/tls/tls_context.hpp"
#include "actors/tls/tls_files.hpp"
#include "tests/actors/tls_clusters.hpp"
#include "tests/support/byte_relay.hpp"

namespace troupe {

namespace {

using test::clusters;

// (Spawned with an argument: CAF 0.17 reads a null argument tuple for a function spawned
// with none, which UBSan reports.)
caf::behavior echo(std::string prefix) {
  return {[prefix](const std::string& s) { return prefix + s; }};
}

std::string ask(caf::actor_system& sys, const caf::actor& who, const std::string& what = "hello") {
  caf::scoped_actor self{sys};
  std::string answer;
  self->request(who, std::chrono::seconds(5), what)
      .receive([&](const std::string& s) { answer = s; }, [&](caf::error& e) { answer = "error: " + sys.render(e); });
  return answer;
}

system_config with_middleman() {
  system_config cfg;
  cfg.load<caf::io::middleman>();
  return cfg;
}

}  // namespace

TEST_CASE("tls files: a cluster's certificates check against their CA and no other") {
  clusters c;
  CHECK(tls::check(c.of("a1", "a")));
  CHECK(tls::check(c.of("b1", "b")));
  auto foreign = tls::check(c.of("b1", "a"));
  REQUIRE(!foreign);
  CHECK(foreign.err().message.find("b1.pem") != std::string::npos);
  CHECK(foreign.err().message.find("the cluster's CA") != std::string::npos);
  // A key that is not the certificate's.
  auto swapped = tls::check({c.path("a", "pem"), c.path("a1", "pem"), c.path("a2", "key")});
  REQUIRE(!swapped);
  CHECK(swapped.err().message.find("not the key of") != std::string::npos);
  // Not PEM at all, and missing.
  auto not_pem = tls::check({c.path("a", "pem"), c.path("a1", "key"), c.path("a1", "key")});
  REQUIRE(!not_pem);
  CHECK(not_pem.err().message.find("not a PEM certificate") != std::string::npos);
  auto missing = tls::check({c.path("a", "pem"), c.path("zz", "pem"), c.path("a1", "key")});
  REQUIRE(!missing);
  CHECK(missing.err().message.find("cannot open") != std::string::npos);
  auto d = tls::describe(c.path("a1", "pem"));
  REQUIRE(d.has_value());
  CHECK(d->rfind("a1, signed by CA a, valid until", 0) == 0);
}

TEST_CASE("tls links: a node of the cluster joins, another cluster's and a plain one do not") {
  std::signal(SIGPIPE, SIG_IGN);
  clusters c;
  auto server_cfg = with_middleman();
  caf::actor_system server{server_cfg};
  node_links_scope server_links(server, c.context("a1", "a"));
  auto agent = server.spawn(echo, std::string("echo "));
  auto port = publish_agent(server, agent, 0, "127.0.0.1");
  REQUIRE(port);

  SUBCASE("same cluster") {
    auto cfg = with_middleman();
    caf::actor_system sys{cfg};
    node_links_scope links(sys, c.context("a2", "a"));
    auto reached = connect_agent(sys, "127.0.0.1", *port);
    REQUIRE(reached);
    CHECK(ask(sys, *reached) == "echo hello");
  }
  SUBCASE("another cluster's certificate") {
    auto cfg = with_middleman();
    caf::actor_system sys{cfg};
    node_links_scope links(sys, c.context("b1", "b"));
    auto refused = connect_agent(sys, "127.0.0.1", *port);
    REQUIRE(!refused);
    CHECK(refused.error() == caf::sec::disconnect_during_handshake);  // each side logs why
  }
  SUBCASE("another cluster's certificate, trusting this cluster's CA") {
    // It trusts the server, but the server does not trust it.
    auto cfg = with_middleman();
    caf::actor_system sys{cfg};
    auto ctx = tls::context::load({c.path("a", "pem"), c.path("b1", "pem"), c.path("b1", "key")});
    REQUIRE(!ctx);  // troupe's own check refuses it before any connection
    CHECK(ctx.err().message.find("b1.pem") != std::string::npos);
  }
  SUBCASE("plain TCP, valid CAF frames") {
    auto cfg = with_middleman();
    caf::actor_system sys{cfg};
    node_links_scope links(sys);
    auto refused = connect_agent(sys, "127.0.0.1", *port);
    REQUIRE(!refused);
    CHECK(refused.error() == caf::sec::disconnect_during_handshake);
  }
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("plain links: troupe's middleman actor connects and publishes without TLS") {
  auto server_cfg = with_middleman();
  caf::actor_system server{server_cfg};
  node_links_scope server_links(server);
  auto agent = server.spawn(echo, std::string("echo "));
  auto port = publish_agent(server, agent, 0, "127.0.0.1");
  REQUIRE(port);
  auto cfg = with_middleman();
  caf::actor_system sys{cfg};
  node_links_scope links(sys);
  auto reached = connect_agent(sys, "127.0.0.1", *port);
  REQUIRE(reached);
  CHECK(ask(sys, *reached) == "echo hello");
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("tls links carry no plaintext: the bytes between two nodes, recorded") {
  std::signal(SIGPIPE, SIG_IGN);
  clusters c;
  const std::string secret = "Once upon a time, a secret prompt";
  for (const bool secured : {false, true}) {
    CAPTURE(secured);
    auto server_cfg = with_middleman();
    caf::actor_system server{server_cfg};
    node_links_scope server_links(server, secured ? c.context("a1", "a") : nullptr);
    auto agent = server.spawn(echo, std::string("echo "));
    auto port = publish_agent(server, agent, 0, "127.0.0.1");
    REQUIRE(port);
    test::byte_relay wire(*port);
    {
      auto cfg = with_middleman();
      caf::actor_system sys{cfg};
      node_links_scope links(sys, secured ? c.context("a2", "a") : nullptr);
      auto reached = connect_agent(sys, "127.0.0.1", wire.port());
      REQUIRE(reached);
      CHECK(ask(sys, *reached, secret) == "echo " + secret);
    }
    // In the clear, the recording holds the message; over TLS, not even CAF's own names.
    CHECK(wire.saw(secret) == !secured);
    CHECK(wire.saw("echo ") == !secured);
    CHECK(wire.bytes().size() > secret.size());
    caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  }
}

}  // namespace troupe

// The topology's nodes, links and gateways: replica roles, link ports, [tls], the client
// endpoints' TLS files and more gateway nodes, each mistake named.
#include <string>

#include <doctest/doctest.h>

#include "tests/tools/topology_test_support.hpp"
#include "tools/common/topology.hpp"

namespace troupe::tools {

using namespace topology_test;

TEST_CASE("replica roles: each half needs the other, decode stages a kv_port, both the same split") {
  const std::string prefill = R"(
[[replica]]
name = "p0"
role = "prefill"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "3-4", devices = ["cpu"] } ])";
  const std::string decode = R"(
[[replica]]
name = "d0"
role = "decode"
stages = [ { node = "n1", layers = "0-2", devices = ["cpu"], kv_port = 7420 }, { node = "n0", layers = "3-4", devices = ["cpu"], kv_port = 7421 } ])";
  CHECK(problem(prefill + decode) == "");
  CHECK(problem(prefill).find("need a decode replica") != std::string::npos);
  CHECK(problem(decode).find("need a prefill replica") != std::string::npos);
  CHECK(problem(R"([[replica]]
name = "x"
role = "decoder"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ])").find("role must be") != std::string::npos);
  CHECK(problem(prefill + R"(
[[replica]]
name = "d0"
role = "decode"
stages = [ { node = "n1", layers = "all", devices = ["cpu"] } ])").find("need a kv_port") != std::string::npos);
  CHECK(problem(R"(
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"], kv_port = 7420 } ])").find("kv_port is for a decode replica") !=
        std::string::npos);
  // The same layers and tensor-parallel sizes, stage for stage.
  CHECK(problem(prefill + R"(
[[replica]]
name = "d0"
role = "decode"
stages = [ { node = "n1", layers = "all", devices = ["cpu"], kv_port = 7420 } ])").find("same stages") != std::string::npos);
  CHECK(problem(prefill + R"(
[[replica]]
name = "d0"
role = "decode"
stages = [ { node = "n1", layers = "0-2", devices = ["cpu", "cpu"], kv_port = 7420 }, { node = "n0", layers = "3-4", devices = ["cpu"], kv_port = 7422 } ])")
            .find("same stages") != std::string::npos);
  // A KV port is a port like any other: no clash with a node's, nor a second shard's.
  CHECK(problem(prefill + R"(
[[replica]]
name = "d0"
role = "decode"
stages = [ { node = "n1", layers = "0-2", devices = ["cpu"], kv_port = 7410 }, { node = "n0", layers = "3-4", devices = ["cpu"], kv_port = 7421 } ])")
            .find("port clash") != std::string::npos);
  CHECK(problem(prefill + R"(
[[replica]]
name = "d0"
role = "decode"
stages = [ { node = "n1", layers = "0-2", devices = ["cpu"], kv_port = 70000 }, { node = "n0", layers = "3-4", devices = ["cpu"], kv_port = 7421 } ])")
            .find("not in 1..65535") != std::string::npos);
  CHECK(problem(R"([[replica]]
name = "p0"
role = "prefill"
landing_mb = 64
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ])").find("landing_mb is for a decode replica") != std::string::npos);
  CHECK(problem(R"([kv]
prefix_caching = false
)" + prefill + decode).find("prefix_caching must be on") != std::string::npos);
}

TEST_CASE("a node's link_ports: a port or a range, any port without, mistakes and clashes named") {
  // A third node, with link ports, after the two of `base`.
  auto with_ports = [](const std::string& value, const std::string& host = "127.0.0.1") {
    return "[[node]]\nname = \"n2\"\nhost = \"" + host + "\"\nport = 7412\nlink_ports = " + value + "\n" + ok_replica;
  };
  auto parsed = parse_topology_text(std::string(base) + with_ports(R"("20000-20099")"), "t.toml", "/d");
  REQUIRE(parsed.has_value());
  CHECK(parsed->nodes[0].link_ports.any());
  CHECK(parsed->nodes[2].link_ports.first == 20000);
  CHECK(parsed->nodes[2].link_ports.last == 20099);
  CHECK(parsed->nodes[2].link_ports.str() == "20000-20099");
  auto single = parse_topology_text(std::string(base) + with_ports("20000"), "t.toml", "/d");
  REQUIRE(single.has_value());
  CHECK(single->nodes[2].link_ports.str() == "20000");
  CHECK(problem(with_ports(R"("20000")")) == "");

  CHECK(problem(with_ports(R"("20000-")")).find("link_ports is a port (20000) or a range") != std::string::npos);
  CHECK(problem(with_ports(R"("a-b")")).find("link_ports is a port") != std::string::npos);
  CHECK(problem(with_ports("true")).find("link_ports is a port") != std::string::npos);
  CHECK(problem(with_ports(R"("0-10")")).find("port 0 is not in 1..65535") != std::string::npos);
  CHECK(problem(with_ports(R"("20000-70000")")).find("port 70000 is not in 1..65535") != std::string::npos);
  CHECK(problem(with_ports(R"("20099-20000")")).find("20099-20000 ends before it starts") != std::string::npos);
  // The range may not hold another endpoint of the same host; another host's is fine.
  CHECK(problem(with_ports(R"("7395-7405")")).find("port clash: link_ports 7395-7405 of node 'n2' take port 7400, "
                                                    "which the gateway's capnp endpoint uses") != std::string::npos);
  CHECK(problem(with_ports(R"("7411-7420")")).find("take port 7411, which node 'n1' uses") != std::string::npos);
  CHECK(problem(with_ports(R"("7395-7411")", "127.0.0.2")) == "");
  CHECK(problem(with_ports(R"("7412-7420")")).find("take port 7412, which node 'n2' uses") != std::string::npos);
}

TEST_CASE("an integer key given a float is refused, however large the float") {
  for (const char* value : {"2.0", "7.4e31", "-1e300", "inf", "nan"}) {
    CAPTURE(value);
    auto t = parse_topology_text(std::string(base) + ok_replica + "[scheduler]\nmax_running = " + value + "\n", "t.toml", "/d");
    REQUIRE_FALSE(t.has_value());
    CHECK(t.err().message.find("'max_running' must be an integer") != std::string::npos);
  }
}

TEST_CASE("[tls]: each node's files by {node}, paths from the topology's folder, mistakes named") {
  const std::string tls = "[tls]\nca = \"certs/ca.pem\"\ncert = \"certs/{node}.pem\"\nkey = \"/keys/{node}-{node}.key\"\n";
  auto t = parse_topology_text(std::string(base) + ok_replica + tls, "t.toml", "/d");
  REQUIRE(t.has_value());
  CHECK(t->tls.on());
  CHECK(t->tls.ca == "/d/certs/ca.pem");
  CHECK(t->tls.ca_key() == "/d/certs/ca.key");
  CHECK(t->tls.cert_of("n1") == "/d/certs/n1.pem");
  CHECK(t->tls.key_of("n1") == "/keys/n1-n1.key");
  auto plain = parse_topology_text(std::string(base) + ok_replica, "t.toml", "/d");
  REQUIRE(plain.has_value());
  CHECK_FALSE(plain->tls.on());

  auto refused = [&](const std::string& table) {
    auto r = parse_topology_text(std::string(base) + ok_replica + table, "t.toml", "/d");
    return r ? std::string() : r.err().message;
  };
  CHECK(refused("[tls]\nca = \"ca.pem\"\ncert = \"n.pem\"\nkey = \"{node}.key\"\n").find("'cert' names every node's own file: it must hold {node}") != std::string::npos);
  CHECK(refused("[tls]\nca = \"ca.pem\"\ncert = \"{node}.pem\"\n").find("'key'") != std::string::npos);
  CHECK(refused("[tls]\nca = \"ca.key\"\ncert = \"{node}.pem\"\nkey = \"{node}.key\"\n").find("its key is kept beside it") != std::string::npos);
  CHECK(refused("[tls]\nca = \"ca.pem\"\ncert = \"{node}.pem\"\nkey = \"{node}.pem\"\n").find("three files") != std::string::npos);
  CHECK(refused("[tls]\nca = \"ca.pem\"\ncert = \"{node}.pem\"\nkey = \"{node}.key\"\ncafile = \"x\"\n").find("cafile") != std::string::npos);
  const std::string launch_node = "[[node]]\nname = \"troupe-launch\"\nhost = \"127.0.0.1\"\nport = 7412\n";
  CHECK(refused(launch_node + tls).find("the operator's certificate under [tls]") != std::string::npos);
  CHECK(refused(launch_node) == "");
}

TEST_CASE("[gateway] tls_cert and tls_key: the Cap'n Proto endpoint's files, together or not at all") {
  auto with = [&](const std::string& keys) {
    std::string text = base;
    const std::string at = "capnp = \"127.0.0.1:7400\"\n";
    text.replace(text.find(at), at.size(), at + keys);
    return parse_topology_text(text + ok_replica, "t.toml", "/d");
  };
  auto t = with("tls_cert = \"certs/gw.pem\"\ntls_key = \"/k/gw.key\"\n");
  REQUIRE(t.has_value());
  CHECK(t->gateway.tls_cert == "/d/certs/gw.pem");
  CHECK(t->gateway.tls_key == "/k/gw.key");
  auto plain = with("");
  REQUIRE(plain.has_value());
  CHECK(plain->gateway.tls_cert.empty());
  auto half = with("tls_cert = \"gw.pem\"\n");
  REQUIRE(!half);
  CHECK(half.err().message.find("'tls_cert' and 'tls_key' go together") != std::string::npos);
}

TEST_CASE("more gateway nodes: [[gateway.also]], each its node and endpoints, none twice") {
  auto with = [](const std::string& also) {
    return parse_topology_text(std::string(base) + ok_replica + also, "t.toml", "/d");
  };
  auto t = with("[[gateway.also]]\nnode = \"n1\"\ncapnp = \"127.0.0.1:7402\"\nhttp = \"127.0.0.1:7403\"\n");
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.err().message));
  const auto places = t->gateway.places();
  REQUIRE(places.size() == 2);
  CHECK(places[0].node == "n0");
  CHECK(places[1].node == "n1");
  CHECK(places[1].capnp.port == 7402);
  CHECK(places[1].http.port == 7403);
  CHECK(t->gateway.index_of("n1") == 1);
  CHECK(t->gateway.index_of("n0") == 0);
  struct bad_case {
    std::string also, says;
  };
  for (const auto& b : {bad_case{"[[gateway.also]]\nnode = \"n9\"\ncapnp = \"127.0.0.1:7402\"\n", "unknown node 'n9'"},
                        bad_case{"[[gateway.also]]\nnode = \"n0\"\ncapnp = \"127.0.0.1:7402\"\n", "names node 'n0' twice"},
                        bad_case{"[[gateway.also]]\nnode = \"n1\"\ncapnp = \"127.0.0.1:7400\"\n", "port clash"},
                        bad_case{"[[gateway.also]]\nnode = \"n1\"\n", "capnp"},
                        bad_case{"[[gateway.also]]\nnode = \"n1\"\ncapnp = \"127.0.0.1:7402\"\nport = 3\n", "port"}}) {
    CAPTURE(b.also);
    auto v = with(b.also);
    REQUIRE_FALSE(v.has_value());
    CHECK(v.err().message.find(b.says) != std::string::npos);
  }
}

}  // namespace troupe::tools

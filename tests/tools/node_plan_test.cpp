// What each node of a topology runs, read off its plan: no process, no actor started.
#include "tools/common/node_plan.hpp"

#include <doctest/doctest.h>

#include "tests/support/test_support.hpp"

namespace troupe::tools {

namespace {

topology deployed(const std::string& file) {
  auto t = parse_topology(std::string(TROUPE_SOURCE_DIR) + "/deploy/" + file);
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.err().message));
  return std::move(t).value();
}

}  // namespace

TEST_CASE("node plans: two replicas of two stages, each node its part, the gateway the router") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const topology t = deployed("pp2x2.toml");
  auto a0 = plan_node(t, l.m, l.tok, "a0");
  REQUIRE(a0.has_value());
  REQUIRE(a0->stages.size() == 1);
  CHECK(a0->stages[0].replica == "r0");
  CHECK(a0->stages[0].index == 0);
  CHECK(a0->stages[0].layout.first_layer == 0);
  CHECK(a0->stages[0].layout.end_layer == 3);
  CHECK(a0->stages[0].layout.link_host == "127.0.0.1");
  // Its replica's scheduler and kv manager: the first stage here, the second through a1.
  REQUIRE(a0->schedulers.size() == 1);
  const scheduler_setup& s = a0->schedulers[0].setup;
  REQUIRE(s.stages.size() == 2);
  CHECK(s.stages[0].name == "r0/stage0");
  CHECK(s.stages[0].port == 0);
  CHECK(s.stages[1].name == "r0/stage1");
  CHECK(s.stages[1].host == "127.0.0.1");
  CHECK(s.stages[1].port == 7422);
  CHECK(s.max_in_flight == 2);
  CHECK(s.config.micro_batches == 2);
  CHECK(s.config.context == 512);
  CHECK(s.kv_manager == "r0/kv");
  CHECK(s.recovery_timeout == std::chrono::seconds(30));
  REQUIRE(a0->next_hop.has_value());
  CHECK(a0->next_hop->name == "a1");
  CHECK_FALSE(a0->gateway.has_value());
  CHECK(a0->failure.heartbeat_interval == std::chrono::milliseconds(300));
  // a1: the second stage alone; no scheduler, no next hop.
  auto a1 = plan_node(t, l.m, l.tok, "a1");
  REQUIRE(a1.has_value());
  REQUIRE(a1->stages.size() == 1);
  CHECK(a1->stages[0].layout.first_layer == 3);
  CHECK(a1->schedulers.empty());
  CHECK_FALSE(a1->next_hop.has_value());
  // g: no stage, the router over both replicas' schedulers and every node's agent.
  auto g = plan_node(t, l.m, l.tok, "g");
  REQUIRE(g.has_value());
  CHECK(g->stages.empty());
  CHECK(g->schedulers.empty());
  REQUIRE(g->gateway.has_value());
  const router_setup& r = g->gateway->router;
  REQUIRE(r.replicas.size() == 2);
  CHECK(r.replicas[1].name == "r1");
  CHECK(r.replicas[1].scheduler == "r1/scheduler");
  CHECK(r.replicas[1].port == 7423);  // b0, the first stage's node
  CHECK(r.nodes.size() == 5);
  CHECK(r.nodes[0].port == 0);  // its own agent
  CHECK(g->gateway->capnp_endpoint.str() == "127.0.0.1:7400");
  CHECK(g->gateway->serve_http);
  CHECK(g->gateway->http.port == 7401);
}

TEST_CASE("node plans: a tensor-parallel stage splits the node's threads, and the KV config reaches every part whole") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const topology t = deployed("pp2-tp2.toml");
  auto n0 = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(n0.has_value());
  REQUIRE(n0->stages.size() == 1);
  const stage_layout& s = n0->stages[0].layout;
  CHECK(s.tp == 2);
  CHECK(s.threads_per_shard == 1);  // 2 threads, 2 shards
  CHECK(s.kv.num_blocks == 512);
  REQUIRE(n0->schedulers.size() == 1);
  CHECK(n0->schedulers[0].setup.config.kv.num_blocks == 512);
  CHECK(n0->schedulers[0].kv.kv.num_blocks == 512);
  CHECK(n0->schedulers[0].kv.kv.block_size == 16);
  REQUIRE(n0->gateway.has_value());
  CHECK_FALSE(n0->gateway->serve_http);
  CHECK(n0->gateway->rpc.max_requests == 64 * 4);  // max_running 64
  CHECK(n0->gateway->http.max_requests == 64 * 4);
}

TEST_CASE("node plans: the node's flags move the endpoints, and a node the topology lacks is an error") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const topology t = deployed("single.toml");
  endpoint_overrides o;
  o.capnp = endpoint{"127.0.0.1", 0};
  o.http = endpoint{"127.0.0.1", 9001};
  auto n0 = plan_node(t, l.m, l.tok, "n0", o);
  REQUIRE(n0.has_value());
  REQUIRE(n0->gateway.has_value());
  CHECK(n0->gateway->capnp_endpoint.port == 0);
  CHECK(n0->gateway->serve_http);
  CHECK(n0->gateway->http.port == 9001);
  CHECK(n0->gateway->http.model_id == "stories260K");
  auto none = plan_node(t, l.m, l.tok, "n9");
  REQUIRE_FALSE(none.has_value());
  CHECK(none.err().message.find("no node named 'n9'") != std::string::npos);
}

TEST_CASE("node plans: a node's link_ports reach its stages, any port elsewhere") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const topology t = deployed("pp2.toml");  // n1 names link_ports, n0 does not
  auto n1 = plan_node(t, l.m, l.tok, "n1");
  REQUIRE(n1.has_value());
  REQUIRE(n1->stages.size() == 1);
  CHECK(n1->stages[0].layout.link_ports.str() == "7440-7449");
  auto n0 = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(n0.has_value());
  REQUIRE(n0->stages.size() == 1);
  CHECK(n0->stages[0].layout.link_ports.any());
}

TEST_CASE("node plans: [speculative] reaches each scheduler, and the draft actor runs where the replica says") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  topology t = deployed("pp2.toml");
  auto plain = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(plain.has_value());
  REQUIRE(plain->schedulers.size() == 1);
  CHECK_FALSE(plain->schedulers[0].setup.spec.enabled());
  CHECK(plain->drafts.empty());
  CHECK(t.replicas[0].draft_node == "n0");  // by default, the scheduler's node

  // Early exit: the target's first layers in a draft actor beside the scheduler, with the
  // node's threads and the replica's pool.
  t.speculative.method = "early-exit";
  t.speculative.exit_layer = 3;
  t.nodes[0].threads = 2;
  auto early = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(early.has_value());
  const scheduler_setup& s = early->schedulers[0].setup;
  CHECK(s.spec.method == spec_method::early_exit);
  CHECK(s.spec.exit_layer == 3);
  CHECK(s.spec.k == speculative_config{}.k);
  CHECK(s.draft.name == "r0/draft");
  CHECK(s.draft.port == 0);  // found through the node's own agent
  REQUIRE(early->drafts.size() == 1);
  const draft_setup& d = early->drafts[0].setup;
  CHECK(early->drafts[0].replica == "r0");
  CHECK(d.m == &l.m);
  CHECK(d.threads == 2);
  CHECK(d.kv.num_blocks == t.kv.num_blocks);
  CHECK(d.context == l.m.config.max_seq_len);
  CHECK(plan_node(t, l.m, l.tok, "n1")->drafts.empty());

  // A draft model, its actor on the second node: the scheduler finds it there.
  t.speculative = {"draft", 4, "stories260K.gguf", 0, "", ""};
  auto unloaded = plan_node(t, l.m, l.tok, "n0");  // (loaded where its actor runs)
  REQUIRE_FALSE(unloaded.has_value());
  CHECK(unloaded.err().message.find("the draft model is not loaded") != std::string::npos);
  t.replicas[0].draft_node = "n1";
  auto n0 = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(n0.has_value());
  CHECK(n0->drafts.empty());
  CHECK(n0->schedulers[0].setup.spec.k == 4);
  CHECK(n0->schedulers[0].setup.draft.name == "r0/draft");
  CHECK(n0->schedulers[0].setup.draft.port == t.nodes[1].port);
  auto n1_unloaded = plan_node(t, l.m, l.tok, "n1");
  REQUIRE_FALSE(n1_unloaded.has_value());
  CHECK(n1_unloaded.err().message.find("the draft model is not loaded") != std::string::npos);
  auto n1 = plan_node(t, l.m, l.tok, "n1", {}, &l.m);
  REQUIRE(n1.has_value());
  REQUIRE(n1->drafts.size() == 1);
  CHECK(n1->drafts[0].setup.m == &l.m);
  CHECK(n1->schedulers.empty());

  // N-gram drafts need no actor.
  t.speculative = {"ngram", 3, "", 0, "", ""};
  auto ngram = plan_node(t, l.m, l.tok, "n1");
  REQUIRE(ngram.has_value());
  CHECK(ngram->drafts.empty());
  CHECK(plan_node(t, l.m, l.tok, "n0")->schedulers[0].setup.draft.name.empty());
}

TEST_CASE("node plans: [kv] eviction reaches each scheduler, and is refused where the replica cannot run it") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  topology t = deployed("pp2.toml");
  auto plain = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(plain.has_value());
  CHECK_FALSE(plain->schedulers[0].setup.config.eviction.enabled());
  CHECK(plain->schedulers[0].setup.config.no_eviction.empty());  // requests may still ask for it

  t.scheduler.eviction = {kv_policy::h2o, 128, -1, 32, 16};
  auto h2o = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(h2o.has_value());
  const scheduler_config& c = h2o->schedulers[0].setup.config;
  CHECK(c.eviction.policy == kv_policy::h2o);
  CHECK(c.eviction.budget == 128);
  CHECK(c.eviction.window == 32);

  t.scheduler.eviction.budget = l.m.config.max_seq_len + 1;
  auto long_budget = plan_node(t, l.m, l.tok, "n0");
  REQUIRE_FALSE(long_budget.has_value());
  CHECK(long_budget.err().message.find("[kv] budget 513 is past the model's context of 512") != std::string::npos);

  // Token trees do not run with eviction: a default that evicts is refused, and without
  // one, each request that asks is (the reason travels with the plan).
  t.scheduler.eviction.budget = 128;
  t.speculative.method = "early-exit";
  auto early = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(early.has_value());  // early exit's cache follows the evictions
  t.speculative.tree = "2,2";
  auto tree = plan_node(t, l.m, l.tok, "n0");
  REQUIRE_FALSE(tree.has_value());
  CHECK(tree.err().message.find("[kv] policy h2o in replica 'r0': token trees and KV eviction do not run together") !=
        std::string::npos);
  t.scheduler.eviction = {};
  auto refusing = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(refusing.has_value());
  CHECK(refusing->schedulers[0].setup.config.no_eviction.find("token trees and KV eviction") != std::string::npos);

  // GPU shards sum attention and compact as CPU ones do.
  t.speculative = {};
  t.replicas[0].stages[1].devices = {"cuda:0"};
  t.scheduler.eviction = {kv_policy::streaming, 128, 4, -1, 16};
  auto gpu = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(gpu.has_value());
  CHECK(gpu->schedulers[0].setup.config.no_eviction.empty());
  CHECK(gpu->schedulers[0].setup.config.eviction.policy == kv_policy::streaming);
}

}  // namespace troupe::tools

namespace troupe::tools {

TEST_CASE("node plans: a prefill replica's shards send to the decode replica's, which take KV into host memory") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const topology t = deployed("disagg.toml");
  auto n0 = plan_node(t, l.m, l.tok, "n0");
  REQUIRE(n0.has_value());
  REQUIRE(n0->stages.size() == 1);
  const stage_layout& p = n0->stages[0].layout;
  CHECK(p.kv.num_blocks == 48);
  CHECK(p.kv_listen_port == 0);
  REQUIRE(p.kv_peers.size() == 1);
  CHECK(p.kv_peers[0].replica == "d0");
  CHECK(p.kv_peers[0].host == "127.0.0.1");
  CHECK(p.kv_peers[0].port == 7420);
  REQUIRE(n0->schedulers.size() == 1);
  CHECK(n0->schedulers[0].setup.config.tier_blocks == 0);  // the prefill replica keeps no tiers
  REQUIRE(n0->gateway.has_value());
  REQUIRE(n0->gateway->router.replicas.size() == 2);
  CHECK(n0->gateway->router.replicas[0].role == replica_role::prefill);
  CHECK(n0->gateway->router.replicas[1].role == replica_role::decode);

  auto n1 = plan_node(t, l.m, l.tok, "n1");
  REQUIRE(n1.has_value());
  REQUIRE(n1->stages.size() == 1);
  const stage_layout& d = n1->stages[0].layout;
  CHECK(d.kv.num_blocks == 256);
  CHECK(d.kv_listen_host == "127.0.0.1");
  CHECK(d.kv_listen_port == 7420);
  CHECK(d.kv_peers.empty());
  REQUIRE(d.kv.tiers.size() == 1);
  CHECK(d.kv.tiers[0].capacity_bytes == uint64_t{256} << 20);
  REQUIRE(n1->schedulers.size() == 1);
  const scheduler_config& c = n1->schedulers[0].setup.config;
  CHECK(c.kv.num_blocks == 256);
  CHECK(c.tier_blocks > 0);  // its directory learns what lands
  CHECK(n1->schedulers[0].kv.kv.num_blocks == 256);
}

}  // namespace troupe::tools

// The topology parser and validator: deploy/'s files, each table's keys and defaults, and
// every mistake named with its file and line (nodes, links and gateways:
// topology_links_test.cpp).
#include "tools/common/topology.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>

#include <doctest/doctest.h>

#include "engine/model/model.hpp"
#include "tests/support/test_support.hpp"
#include "tests/tools/topology_test_support.hpp"

namespace troupe::tools {

using namespace topology_test;

TEST_CASE("every topology in deploy/ parses and fits stories260K") {
  const std::string dir = std::string(TROUPE_SOURCE_DIR) + "/deploy";
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".toml") continue;
    CAPTURE(f.path().string());
    auto t = parse_topology(f.path().string());
    REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.err().message));
    CHECK(std::filesystem::exists(t->model.path));
    CHECK(validate_topology(*t, stories(), 0).has_value());
    CHECK(topology_warnings(*t, stories()).empty());
    ++n;
  }
  CHECK(n == 13);
  auto disagg = parse_topology(dir + "/disagg.toml");
  REQUIRE(disagg.has_value());
  REQUIRE(disagg->replicas.size() == 2);
  CHECK(disagg->replicas[0].role == replica_role::prefill);
  CHECK(disagg->replicas[1].role == replica_role::decode);
  CHECK(disagg->replicas[1].stages[0].kv_port == 7420);
  CHECK(kv_of(*disagg, disagg->replicas[0]).num_blocks == 48);
  const kv_config landing = kv_of(*disagg, disagg->replicas[1]);
  CHECK(landing.num_blocks == 256);
  REQUIRE(landing.tiers.size() == 1);
  CHECK(landing.tiers[0].kind == tier_kind::host);
  CHECK(landing.tiers[0].capacity_bytes == uint64_t{256} << 20);
  CHECK(kv_of(*disagg, disagg->replicas[0]).tiers.empty());
  auto tenants = parse_topology(dir + "/tenants.toml");
  REQUIRE(tenants.has_value());
  CHECK(tenants->router.policy == route_policy::kv_aware);
  REQUIRE(tenants->scheduler.classes.size() == 2);
  CHECK(tenants->scheduler.default_class == 0);
  CHECK(tenants->scheduler.slo_admission);
  auto tiers = parse_topology(dir + "/tiers.toml");
  REQUIRE(tiers.has_value());
  REQUIRE(tiers->kv.tiers.size() == 3);
  CHECK(tiers->kv.tiers[2].address == "127.0.0.1:6379");
  auto two = parse_topology(dir + "/pp2x2.toml");
  REQUIRE(two.has_value());
  CHECK(two->replicas.size() == 2);
  CHECK(two->replicas[1].scheduler_node == "b0");  // the first stage's node by default
  CHECK(two->failure.heartbeat_ms == 300);
  CHECK(two->failure.timeout_ms == 450);
  CHECK(two->failure.restart);
  auto pp = parse_topology(dir + "/pp2-tp2.toml");
  REQUIRE(pp.has_value());
  REQUIRE(pp->replicas.size() == 1);
  REQUIRE(pp->replicas[0].stages.size() == 2);
  CHECK(pp->replicas[0].stages[1].first_layer == 3);
  CHECK(pp->replicas[0].stages[1].devices.size() == 2);
  CHECK(pp->kv.num_blocks == 512);
  CHECK(pp->gateway.capnp.str() == "127.0.0.1:7400");
}

TEST_CASE("a correct two-stage replica passes") {
  CHECK(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "3-4", devices = ["cpu", "cpu"] } ])") == "");
}

TEST_CASE("layers \"all\" and \"N-end\" reach the model's last layer") {
  CHECK(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ])") == "");
  CHECK(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "3-end", devices = ["cpu"] } ])") == "");
  CHECK(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-end", devices = ["cpu"] }, { node = "n1", layers = "3-end", devices = ["cpu"] } ])")
            .find("overlaps") != std::string::npos);
}

TEST_CASE("topology mistakes are rejected with the mistake named") {
  auto has = [](const std::string& msg, const std::string& part) {
    CAPTURE(msg);
    CHECK(msg.find(part) != std::string::npos);
    CHECK(msg.find("t.toml") != std::string::npos);
  };
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "2-4", devices = ["cpu"] } ])"),
      "overlaps");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-1", devices = ["cpu"] }, { node = "n1", layers = "3-4", devices = ["cpu"] } ])"),
      "leaves layers 2-2");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-3", devices = ["cpu"] } ])"),
      "leaves layers 4-4");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-5", devices = ["cpu"] } ])"),
      "past the model's last layer");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu", "cpu", "cpu"] } ])"),
      "cannot be split 3 ways");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n9", layers = "0-4", devices = ["cpu"] } ])"),
      "unknown node 'n9'");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "4-0", devices = ["cpu"] } ])"),
      "is not FIRST-LAST");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["tpu"] } ])"),
      "\"cpu\" or \"cuda:N\"");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cuda:0", "cpu"] } ])"),
      "mix \"cpu\" and GPUs");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cuda:1", "cuda:1"] } ])"),
      "cuda:1 is named twice");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cuda:1", "cuda:01"] } ])"),
      "cuda:01 is named twice");
  has(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu"] } ]
[[replica]]
name = "r0"
stages = [ { node = "n1", layers = "0-4", devices = ["cpu"] } ])"),
      "used twice");
  has(problem(std::string("[[node]]\nname = \"n2\"\nhost = \"127.0.0.1\"\nport = 7411\n") + ok_replica), "port clash");
  has(problem(std::string("[[node]]\nname = \"n2\"\nhost = \"127.0.0.1\"\nport = 7400\n") + ok_replica), "port clash");
  has(problem(std::string("[[node]]\nname = \"n2\"\nhost = \"127.0.0.1\"\nport = 70000\n") + ok_replica), "not in 1..65535");
  has(problem(std::string("[[node]]\nname = \"n1\"\nhost = \"127.0.0.1\"\nport = 7412\n") + ok_replica), "used twice");
  has(problem(std::string("[[node]]\nname = \"n2\"\nhost = \"bad host!\"\nport = 7412\n") + ok_replica), "not a host name");
  has(problem(std::string("[[node]]\nname = \"n2\"\nport = 7412\n") + ok_replica), "'host' is missing");
  has(problem(std::string("[[node]]\nname = \"n2\"\nhost = 5\nport = 7412\n") + ok_replica), "must be a string");
  has(problem(""), "no [[replica]]");
  has(problem("this is = not [toml"), "t.toml:");
  // Placement, failure handling and GPU settings.
  has(problem(R"([[replica]]
name = "r0"
scheduler = "n7"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu"] } ])"),
      "scheduler on unknown node 'n7'");
  has(problem(std::string("[failure]\nrestart = \"sometimes\"\n") + ok_replica), "restart must be");
  has(problem(std::string("[failure]\nheartbeat_ms = 500\ntimeout_ms = 400\n") + ok_replica), "timeout_ms must exceed");
  has(problem(std::string("[failure]\nheartbeat_ms = 1\n") + ok_replica), "heartbeat_ms must be in");
  has(problem(std::string("[failure]\nrecovery_timeout_s = 0\n") + ok_replica), "recovery_timeout_s must be in");
  has(problem(std::string("[gpu]\nweights = \"int4\"\n") + ok_replica), "weights must be bf16, f16 or f32");
  has(problem(std::string("[kv]\ncache_type = \"int4\"\n") + ok_replica), "cache_type \"int4\": not a KV cache type");
  has(problem(std::string("[kv]\nprefix_cache_scope = \"tenant\"\n") + ok_replica), "prefix_cache_scope must be \"key\"");
  has(problem(std::string("[model]\n") + ok_replica), "t.toml");  // a second [model] table
}

TEST_CASE("HTTP gateway settings: defaults, what a topology sets, and values out of range") {
  // The gateway table of `base` with `extra` added to it.
  auto with_gateway = [](const std::string& extra) {
    std::string text = std::string(base) + ok_replica;
    const std::string at = "capnp = \"127.0.0.1:7400\"\n";
    text.insert(text.find(at) + at.size(), extra);
    return parse_topology_text(text, "t.toml", "/d");
  };
  auto t = with_gateway("");
  REQUIRE(t.has_value());
  CHECK(t->gateway.max_connections == 0);  // as the open-file limit allows
  CHECK(t->gateway.read_timeout_s == 30);
  CHECK(t->gateway.idle_timeout_s == 60);
  auto u = with_gateway("max_connections = 200\nread_timeout_s = 5\nidle_timeout_s = 600\n");
  REQUIRE(u.has_value());
  CHECK(u->gateway.max_connections == 200);
  CHECK(u->gateway.read_timeout_s == 5);
  CHECK(u->gateway.idle_timeout_s == 600);
  auto idle0 = with_gateway("idle_timeout_s = 0\n");
  REQUIRE_FALSE(idle0.has_value());
  CHECK(idle0.err().message.find("idle_timeout_s must be in 1..86400") != std::string::npos);
  for (const char* bad : {"max_connections = 0\n", "max_connections = 100000\n"}) {
    auto v = with_gateway(bad);
    REQUIRE_FALSE(v.has_value());
    CHECK(v.err().message.find("max_connections must be in 1..65536") != std::string::npos);
  }
  auto w = with_gateway("read_timeout_s = 0\n");
  REQUIRE_FALSE(w.has_value());
  CHECK(w.err().message.find("read_timeout_s must be in 1..3600") != std::string::npos);
  auto x = with_gateway("read_timeout_s = \"soon\"\n");
  REQUIRE_FALSE(x.has_value());
  CHECK(x.err().message.find("'read_timeout_s' must be an integer") != std::string::npos);
  // Browser origins: scheme and host (and port), or "*".
  CHECK(t->gateway.cors_origins.empty());
  auto o = with_gateway("cors_origins = [\"https://app.example\", \"http://localhost:3000\", \"*\"]\n");
  REQUIRE(o.has_value());
  CHECK(o->gateway.cors_origins == std::vector<std::string>{"https://app.example", "http://localhost:3000", "*"});
  for (const char* bad : {"cors_origins = [\"app.example\"]\n", "cors_origins = [\"https://app.example/ui\"]\n",
                          "cors_origins = [5]\n"}) {
    auto v = with_gateway(bad);
    REQUIRE_FALSE(v.has_value());
    CHECK(v.err().message.find("cors_origins entry 0 must be an origin") != std::string::npos);
  }
  auto y = with_gateway("cors_origins = \"*\"\n");
  REQUIRE_FALSE(y.has_value());
  CHECK(y.err().message.find("'cors_origins' must be an array") != std::string::npos);
}

TEST_CASE("a stage split over two GPUs passes, as does one of two CPU shards") {
  CHECK(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cuda:0", "cuda:1"] } ])") == "");
  CHECK(problem(R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu", "cpu"] } ])") == "");
}

TEST_CASE("failure, GPU and KV cache settings: defaults, and what a topology sets") {
  auto t = parse_topology_text(std::string(base) + ok_replica, "t.toml", "/d");
  REQUIRE(t.has_value());
  CHECK(t->failure.heartbeat_ms == 200);
  CHECK(t->failure.timeout_ms == 400);
  CHECK(t->failure.restart);
  CHECK(t->gpu.weights == dtype::bf16);
  CHECK(t->model.chat_template == "auto");
  CHECK(t->replicas[0].scheduler_node == "n0");
  CHECK_FALSE(t->kv.cache_type.has_value());
  CHECK(t->kv.prefix_cache_per_key);
  auto u = parse_topology_text(std::string(base) + "[failure]\nheartbeat_ms = 100\ntimeout_ms = 250\nrestart = \"never\"\n"
                                                  "[gpu]\nweights = \"f32\"\n[kv]\ncache_type = \"q8_0\"\nprefix_cache_scope = \"all\"\n" + R"([[replica]]
name = "r0"
scheduler = "n1"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu"] } ])",
                               "t.toml", "/d");
  REQUIRE_MESSAGE(u.has_value(), (u ? "" : u.err().message));
  CHECK(u->failure.heartbeat_ms == 100);
  CHECK(u->failure.timeout_ms == 250);
  CHECK_FALSE(u->failure.restart);
  CHECK(u->gpu.weights == dtype::f32);
  CHECK(u->kv.cache_type == dtype::q8_0);
  CHECK_FALSE(u->kv.prefix_cache_per_key);
  CHECK(u->replicas[0].scheduler_node == "n1");
}

TEST_CASE("[router]: kv-aware by default, least-loaded on request, mistakes named") {
  auto t = parse_topology_text(std::string(base) + ok_replica, "t.toml", "/d");
  REQUIRE(t.has_value());
  CHECK(t->router.policy == route_policy::kv_aware);
  CHECK(t->router.stream_tokens == 64);
  auto u = parse_topology_text(std::string(base) + "[router]\npolicy = \"least-loaded\"\nstream_tokens = 8\n" + ok_replica,
                               "t.toml", "/d");
  REQUIRE_MESSAGE(u.has_value(), (u ? "" : u.err().message));
  CHECK(u->router.policy == route_policy::least_loaded);
  CHECK(u->router.stream_tokens == 8);
  auto has = [](const std::string& msg, const std::string& part) {
    CAPTURE(msg);
    CHECK(msg.find(part) != std::string::npos);
    CHECK(msg.find("t.toml:") != std::string::npos);
  };
  has(problem("[router]\npolicy = \"random\"\n" + ok_replica), "policy must be \"kv-aware\"");
  has(problem("[router]\nstream_tokens = -1\n" + ok_replica), "stream_tokens must be in 0..1048576");
  has(problem("[router]\npolcy = \"kv-aware\"\n" + ok_replica), "polcy");
}

TEST_CASE("[[class]] tables and [scheduler] default_class: targets, priorities, admission, mistakes named") {
  auto t = parse_topology_text(std::string(base) + R"([[class]]
name = "chat"
ttft_ms = 500
tpot_ms = 50
[[class]]
name = "batch"
ttft_ms = 60000
priority = 1
[[class]]
name = "urgent"
ttft_ms = 100
priority = -10
[scheduler]
default_class = "chat"
)" + ok_replica, "t.toml", "/d");
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.err().message));
  REQUIRE(t->scheduler.classes.size() == 3);
  CHECK(t->scheduler.classes[2].priority == -10);  // lower runs first: below 0 too
  CHECK(t->scheduler.classes[0].name == "chat");
  CHECK(t->scheduler.classes[0].ttft_ms == 500);
  CHECK(t->scheduler.classes[0].tpot_ms == 50);
  CHECK(t->scheduler.classes[1].priority == 1);
  CHECK(t->scheduler.classes[1].tpot_ms == 0);
  CHECK(t->scheduler.default_class == 0);
  CHECK(t->scheduler.slo_admission);
  // Without [scheduler], the classes hold and admission is on; without classes, off.
  auto u = parse_topology_text(std::string(base) + "[[class]]\nname = \"x\"\ntpot_ms = 20\n" + ok_replica, "t.toml", "/d");
  REQUIRE(u.has_value());
  CHECK(u->scheduler.classes.size() == 1);
  CHECK(u->scheduler.slo_admission);
  CHECK(u->scheduler.default_class == -1);
  auto v = parse_topology_text(std::string(base) + "[[class]]\nname = \"x\"\ntpot_ms = 20\n[scheduler]\nslo_admission = false\n" +
                                   ok_replica, "t.toml", "/d");
  REQUIRE(v.has_value());
  CHECK_FALSE(v->scheduler.slo_admission);
  CHECK_FALSE(parse_topology_text(std::string(base) + ok_replica, "t.toml", "/d")->scheduler.slo_admission);
  auto has = [](const std::string& msg, const std::string& part) {
    CAPTURE(msg);
    CHECK(msg.find(part) != std::string::npos);
    CHECK(msg.find("t.toml:") != std::string::npos);
  };
  has(problem("[[class]]\nname = \"x\"\n" + ok_replica), "a class needs a target");
  has(problem("[[class]]\nttft_ms = 100\n" + ok_replica), "name");
  has(problem("[[class]]\nname = \"x\"\nttft_ms = 1\n" + ok_replica), "ttft_ms must be in 10..3600000");
  has(problem("[[class]]\nname = \"x\"\ntpot_ms = 0\n" + ok_replica), "tpot_ms must be in 1..600000");
  has(problem("[[class]]\nname = \"x\"\nttft_ms = 20\ntpot_ms = 50\n" + ok_replica), "ttft_ms (20) is below tpot_ms (50)");
  has(problem("[[class]]\nname = \"x\"\nttft_ms = 100\n[[class]]\nname = \"x\"\nttft_ms = 200\n" + ok_replica),
      "class name 'x' is used twice");
  has(problem("[[class]]\nname = \"x y\"\nttft_ms = 100\n" + ok_replica), "without spaces");
  has(problem("[[class]]\nname = \"x\"\nttft_ms = 100\n[scheduler]\ndefault_class = \"y\"\n" + ok_replica),
      "default_class 'y' is not a [[class]] (the classes: x)");
  has(problem("[scheduler]\ndefault_class = \"y\"\n" + ok_replica), "(none is declared)");
  has(problem("[scheduler]\nslo_admission = true\n" + ok_replica), "slo_admission needs [[class]] tables");
  has(problem("[class]\nname = \"x\"\n" + ok_replica), "[[class]] must be an array of tables");
}

TEST_CASE("a [speculative] table: the command line's names, the draft beside the file, mistakes named") {
  auto none = parse_topology_text(std::string(base) + ok_replica, "t.toml", "/d");
  REQUIRE(none.has_value());
  CHECK(none->speculative.method == "none");
  auto t = parse_topology_text(std::string(base) + ok_replica +
                                   "[speculative]\nmethod = \"draft\"\nk = 5\ndraft = \"drafts/small.gguf\"\n",
                               "t.toml", "/d");
  REQUIRE(t.has_value());
  CHECK(t->speculative.method == "draft");
  CHECK(t->speculative.k == 5);
  CHECK(t->speculative.draft == "/d/drafts/small.gguf");
  auto e = parse_topology_text(std::string(base) + ok_replica + "[speculative]\nmethod = \"early-exit\"\nexit-layer = 3\n",
                               "t.toml", "/d");
  REQUIRE(e.has_value());
  CHECK(e->speculative.exit_layer == 3);
  CHECK(problem(ok_replica + "[speculative]\nmethod = \"early-exit\"\nexit_layer = 2\n").empty());
  CHECK(problem(ok_replica + "[speculative]\nmethod = \"ngram\"\n").empty());
  // Trained heads beside the file, and a token tree as an array or as the command line spells it.
  auto h = parse_topology_text(std::string(base) + ok_replica +
                                   "[speculative]\nmethod = \"medusa\"\nheads = \"h/medusa.gguf\"\ntree = [3, 2, 1]\n",
                               "t.toml", "/d");
  REQUIRE_MESSAGE(h.has_value(), (h ? "" : h.err().message));
  CHECK(h->speculative.heads == "/d/h/medusa.gguf");
  CHECK(h->speculative.tree == "3,2,1");
  auto a = parse_topology_text(std::string(base) + ok_replica + "[speculative]\nmethod = \"ngram\"\ntree = \"auto:12\"\n",
                               "t.toml", "/d");
  REQUIRE_MESSAGE(a.has_value(), (a ? "" : a.err().message));
  CHECK(a->speculative.tree == "auto:12");
  CHECK(problem(ok_replica + "[speculative]\nmethod = \"ngram\"\ntree = \"2,2\"\n").empty());

  auto says = [](const std::string& extra, const std::string& part) {
    const std::string p = problem(ok_replica + "[speculative]\n" + extra);
    CAPTURE(p);
    CHECK(p.find(part) != std::string::npos);
  };
  says("method = \"hydra\"\n", "t.toml:20: [speculative]: method must be ngram, draft, early-exit, medusa, eagle or none");
  says("method = \"medusa\"\n", "[speculative] method medusa needs [speculative] heads = FILE");
  says("method = \"ngram\"\nheads = \"h.gguf\"\n", "[speculative] heads applies to medusa and eagle");
  says("method = \"ngram\"\ntree = [2, 0]\n", "tree's widths must be integers in 1..16");
  says("method = \"ngram\"\ntree = []\n", "tree is empty");
  says("method = \"ngram\"\ntree = 3\n", "tree must be widths by depth");
  says("method = \"ngram\"\ntree = \"2,,1\"\n", "'2,,1' is not widths by depth");
  says("method = \"ngram\"\ntree = [2, 2]\nk = 3\n", "a tree sets how many drafts");
  says("method = \"ngram\"\nk = 0\n", "k must be in 1..16");
  says("method = \"ngram\"\nk = 17\n", "k must be in 1..16");
  says("method = \"ngram\"\ndraft_length = 2\n", "draft_length");
  says("method = \"early-exit\"\nexit_layer = 5\n", "exit layer 5 is outside the model: it has 5 layers");
  says("method = \"early-exit\"\nexit_layer = 2\nexit-layer = 2\n", "given twice");
  says("method = \"ngram\"\nexit_layer = 2\n", "[speculative] exit_layer applies to early-exit");
  says("method = \"draft\"\n", "[speculative] method draft needs [speculative] draft = FILE");
  says("k = 4\n", "apply with [speculative] method ngram, draft, early-exit, medusa or eagle");
  // The step's budget for drafts: larger batches get drafts; a tree needs room for itself.
  auto budget = parse_topology_text(std::string(base) + ok_replica + "[speculative]\nmethod = \"ngram\"\nmax_step_tokens = 64\n",
                                    "t.toml", "/d");
  REQUIRE(budget.has_value());
  auto budget_config = speculative_config_of(budget->speculative, stories(), true);
  REQUIRE(budget_config.has_value());
  CHECK(budget_config->max_step_tokens == 64);
  says("method = \"ngram\"\ntree = [2, 2]\nmax_step_tokens = 6\n",
       "[speculative] max_step_tokens must be at least 7 (the tree's nodes and its root)");
  says("method = \"ngram\"\nmax_step_tokens = 0\n", "max_step_tokens must be in 1..65536");
  says("max_step_tokens = 16\n", "apply with [speculative] method");
}

TEST_CASE("[kv] eviction keys: troupe-run's names, the deployment's default, mistakes named") {
  auto none = parse_topology_text(std::string(base) + ok_replica, "t.toml", "/d");
  REQUIRE(none.has_value());
  CHECK_FALSE(none->scheduler.eviction.enabled());
  auto t = parse_topology_text(std::string(base) + ok_replica +
                                   "[kv]\npolicy = \"scissorhands\"\nbudget = 96\nwindow = 32\nhistory = 8\n",
                               "t.toml", "/d");
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.err().message));
  CHECK(t->scheduler.eviction.policy == kv_policy::scissorhands);
  CHECK(t->scheduler.eviction.budget == 96);
  CHECK(t->scheduler.eviction.window == 32);
  CHECK(t->scheduler.eviction.history == 8);
  auto flags = parse_topology_text(std::string(base) + ok_replica +
                                       "[kv]\nkv-policy = \"streaming\"\nkv-budget = 64\nsinks = 2\n",
                                   "t.toml", "/d");
  REQUIRE_MESSAGE(flags.has_value(), (flags ? "" : flags.err().message));
  CHECK(flags->scheduler.eviction.policy == kv_policy::streaming);
  CHECK(flags->scheduler.eviction.budget == 64);
  CHECK(flags->scheduler.eviction.sinks == 2);
  // [scheduler] after [kv] in the file keeps the eviction keys.
  auto later = parse_topology_text(std::string(base) + ok_replica +
                                       "[kv]\nkv_policy = \"h2o\"\nkv_budget = 64\n[scheduler]\nmax_running = 4\n",
                                   "t.toml", "/d");
  REQUIRE(later.has_value());
  CHECK(later->scheduler.eviction.policy == kv_policy::h2o);
  CHECK(later->scheduler.max_running == 4);

  auto says = [](const std::string& extra, const std::string& part) {
    const std::string p = problem(ok_replica + "[kv]\n" + extra);
    CAPTURE(p);
    CHECK(p.find(part) != std::string::npos);
  };
  says("policy = \"lru\"\nbudget = 64\n", "t.toml:20: [kv]: policy \"lru\" is none, streaming, h2o or scissorhands");
  says("policy = \"streaming\"\nbudget = 16\nsinks = 4\nwindow = 16\n", "budget must be at least sinks + window");
  says("policy = \"h2o\"\nbudget = 16\nwindow = 16\n", "window must be below budget");
  says("policy = \"h2o\"\n", "needs budget of 2 tokens or more");
  says("budget = 64\n", "KV eviction settings without a policy");
  says("policy = \"h2o\"\nbudget = 64\nkv_budget = 64\n", "given twice");
  says("policy = \"scissorhands\"\nbudget = 64\nhistory = 40\n", "history must be in 1..32");
}

TEST_CASE("[[tier]] tables: host, disk and Redis in order, paths beside the file, mistakes named") {
  auto t = parse_topology_text(std::string(base) + ok_replica + R"(
[[tier]]
kind = "host"
capacity_mb = 512
[[tier]]
kind = "disk"
path = "kv-blocks"
capacity_mb = 4096
[[tier]]
kind = "redis"
address = "127.0.0.1:6379"
timeout_ms = 50
)",
                               "t.toml", "/d");
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.err().message));
  REQUIRE(t->kv.tiers.size() == 3);
  CHECK(t->kv.tiers[0].kind == tier_kind::host);
  CHECK(t->kv.tiers[0].capacity_bytes == uint64_t{512} << 20);
  CHECK(t->kv.tiers[1].kind == tier_kind::disk);
  CHECK(t->kv.tiers[1].path == "/d/kv-blocks");
  CHECK(t->kv.tiers[2].kind == tier_kind::redis);
  CHECK(t->kv.tiers[2].address == "127.0.0.1:6379");
  CHECK(t->kv.tiers[2].timeout_ms == 50);
  CHECK(problem(ok_replica + "[[tier]]\nkind = \"host\"\n").empty());

  auto says = [](const std::string& extra, const std::string& part) {
    const std::string p = problem(ok_replica + extra);
    CAPTURE(p);
    CHECK(p.find(part) != std::string::npos);
  };
  says("[[tier]]\nkind = \"tape\"\n", "kind \"tape\" is not a tier");
  says("[[tier]]\ncapacity_mb = 5\n", "'kind' is missing");
  says("[[tier]]\nkind = \"disk\"\n", "'path' is missing");
  says("[[tier]]\nkind = \"redis\"\naddress = \"localhost\"\n", "needs an address as HOST:PORT");
  says("[[tier]]\nkind = \"redis\"\naddress = \"h:99999\"\n", "no port in 1..65535");
  says("[[tier]]\nkind = \"host\"\npath = \"x\"\n", "'path' belongs to disk tiers");
  says("[[tier]]\nkind = \"disk\"\npath = \"x\"\naddress = \"h:1\"\n", "'address' belongs to redis tiers");
  says("[[tier]]\nkind = \"host\"\ncapacity_mb = 0\n", "capacity_mb must be in");
  says("[[tier]]\nkind = \"disk\"\npath = \"x\"\n[[tier]]\nkind = \"host\"\n", "the host tier comes first");
  says("[[tier]]\nkind = \"host\"\ncolour = 1\n", "unknown key 'colour'");
  says("[kv]\nprefix_caching = false\n[[tier]]\nkind = \"host\"\n", "prefix_caching must be on");
  says("[tier]\nkind = \"host\"\n", "[[tier]] must be an array of tables");
}

TEST_CASE("what a GPU shard would ignore is refused at the line that asks for it") {
  const std::string gpu = "[[replica]]\nname = \"g\"\nstages = [ { node = \"n0\", layers = \"all\", devices = [\"cuda:0\"] } ]\n";
  const int base_lines = static_cast<int>(std::count(base, base + std::strlen(base), '\n'));
  auto at = [&](int line) { return "t.toml:" + std::to_string(base_lines + line) + ": "; };
  // (Each refusal's line is counted from the end of `base`.)
  CHECK(problem("[kv]\nblock_size = 16\ncache_type = \"q8_0\"\n" + gpu) ==
        at(3) + "[kv] cache_type \"q8_0\": replica 'g' runs on cuda:0, and a GPU shard keeps its KV cache in F32: "
                "cache_type applies to CPU shards");
  CHECK(problem("[kv]\ncache_type = \"f16\"\n" + ok_replica) == "");  // CPU shards honour it
  CHECK(problem(gpu + "[[tier]]\nkind = \"host\"\n") ==
        at(4) + "replica 'g' runs on cuda:0: KV tiers ([[tier]]) serve CPU shards; a GPU shard's cache stays on its device");
  CHECK(problem("[speculative]\nmethod = \"eagle\"\nheads = \"h.gguf\"\n" + gpu) ==
        at(2) + "replica 'g' runs on cuda:0: [speculative] method eagle drafts from the features CPU shards return; a GPU "
                "shard proposes by n-gram only");
  CHECK(problem("[speculative]\nmethod = \"ngram\"\n\ntree = \"2,2\"\n" + gpu) ==
        at(4) + "replica 'g' runs on cuda:0: [speculative] tree: on a GPU, speculative decoding verifies chains, not token trees");
  // The second stage on a GPU is enough; roles name the replica's role line.
  const std::string roles = R"([[replica]]
name = "p"
role = "prefill"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "3-4", devices = ["cuda:1"] } ]
[[replica]]
name = "d"
role = "decode"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"], kv_port = 7500 }, { node = "n1", layers = "3-4", devices = ["cpu"], kv_port = 7501 } ]
)";
  CHECK(problem(roles) == at(3) + "replica 'p' (prefill) runs on cuda:1: prefill and decode replicas run on CPU shards (KV "
                                  "between GPUs is not sent yet)");
  CHECK(problem(std::regex_replace(roles, std::regex("cuda:1"), "cpu")) == "");
  // The environment's KV type likewise (nodes and troupe-launch read it).
  setenv("TROUPE_KV_TYPE", "f16", 1);
  const std::string env = problem(gpu);
  const std::string cpu = problem(ok_replica);
  unsetenv("TROUPE_KV_TYPE");
  CHECK(env == "TROUPE_KV_TYPE=f16 is set, but t.toml runs replica 'g' on cuda:0, and a GPU shard keeps its KV cache in "
               "F32: the KV cache type applies to CPU shards");
  CHECK(cpu == "");
}

TEST_CASE("a node off loopback needs [tls] or says insecure_internal_ports, and its refusal names the line") {
  const std::string off = "[[node]]\nname = \"n2\"\nhost = \"10.1.2.3\"\nport = 7412\n";
  const std::string refused = problem(off + ok_replica);
  CAPTURE(refused);
  CHECK(refused.find("t.toml:17:") == 0);  // the host's line
  CHECK(refused.find("[[node]] #3 'n2': host 10.1.2.3 is not loopback, and without [tls]") != std::string::npos);
  CHECK(refused.find("insecure_internal_ports = true") != std::string::npos);
  CHECK(problem("[[node]]\nname = \"n2\"\nhost = \"troupe-n2.svc\"\nport = 7412\n" + ok_replica) != "");
  // Loopback, however written; or said insecure; or with [tls].
  CHECK(problem("[[node]]\nname = \"n2\"\nhost = \"127.0.0.2\"\nport = 7412\n" + ok_replica) == "");
  CHECK(problem("[[node]]\nname = \"n2\"\nhost = \"localhost\"\nport = 7412\n" + ok_replica) == "");
  auto insecure = parse_topology_text(std::string(base) + off + "insecure_internal_ports = true\n" + ok_replica, "t.toml", "/d");
  REQUIRE(insecure.has_value());
  CHECK(insecure->nodes[2].insecure_internal_ports);
  CHECK(insecure_ports_warning(*insecure, insecure->nodes[2]).find("WARNING: node n2's internal ports") == 0);
  CHECK(insecure_ports_warning(*insecure, insecure->nodes[0]).empty());  // on loopback
  auto secured = parse_topology_text(std::string(base) + off + ok_replica +
                                         "[tls]\nca = \"ca.pem\"\ncert = \"{node}.pem\"\nkey = \"{node}.key\"\n",
                                     "t.toml", "/d");
  REQUIRE(secured.has_value());
  CHECK(insecure_ports_warning(*secured, secured->nodes[2]).empty());
  const std::string not_bool =
      problem("[[node]]\nname = \"n2\"\nhost = \"10.1.2.3\"\nport = 7412\ninsecure_internal_ports = 1\n" + ok_replica);
  CAPTURE(not_bool);
  CHECK(not_bool.find("'insecure_internal_ports' must be true or false") != std::string::npos);
  CHECK_FALSE(loopback_host("127.0.0.256"));
  CHECK_FALSE(loopback_host("127.0.0.1x"));
  CHECK_FALSE(loopback_host("128.0.0.1"));
  CHECK(loopback_host("127.255.0.9"));
}

TEST_CASE("a missing topology file and a gateway on an unknown node are errors") {
  auto t = parse_topology("/nonexistent/topology.toml");
  REQUIRE_FALSE(t.has_value());
  CHECK(t.err().message.find("cannot open") != std::string::npos);
  auto g = parse_topology_text(R"([model]
path = "m"
[gateway]
node = "nx"
capnp = "127.0.0.1:1"
[[node]]
name = "n0"
host = "127.0.0.1"
port = 2
[[replica]]
name = "r"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu"] } ])", "g.toml", "/");
  REQUIRE_FALSE(g.has_value());
  CHECK(g.err().message.find("unknown node 'nx'") != std::string::npos);
}

TEST_CASE("a KV cache smaller than the model's context is warned of, with the figures") {
  auto small = parse_topology_text(std::string(base) + ok_replica + "[kv]\nnum_blocks = 4\nblock_size = 16\n", "t.toml", "/d");
  REQUIRE(small.has_value());
  REQUIRE(validate_topology(*small, stories(), 0).has_value());  // valid: only limited
  const std::string w = topology_warnings(*small, stories());
  CHECK(w.find("holds 64 tokens") != std::string::npos);
  CHECK(w.find("context of 512") != std::string::npos);
  auto enough = parse_topology_text(std::string(base) + ok_replica + "[kv]\nnum_blocks = 32\nblock_size = 16\n", "t.toml", "/d");
  REQUIRE(enough.has_value());
  CHECK(topology_warnings(*enough, stories()).empty());  // 512 tokens: the whole context
}

TEST_CASE("unknown tables and keys are errors, each with its file and line, and a near name suggested") {
  // A misspelled key in [model], an unknown table, a stray key in a stage: each used to pass.
  const std::string text = std::string(base) + ok_replica;
  auto with_model_key = parse_topology_text(
      std::string(text).insert(text.find("[gateway]"), "tokenizr = \"tok.bin\"\n"), "t.toml", "/d");
  REQUIRE_FALSE(with_model_key.has_value());
  CHECK(with_model_key.err().message == "t.toml:4: [model]: unknown key 'tokenizr'; did you mean 'tokenizer'?");
  auto foo = parse_topology_text(text + "[foo]\nbar = 1\n", "t.toml", "/d");
  REQUIRE_FALSE(foo.has_value());
  CHECK(foo.err().message.find("t.toml:19: unknown table [foo]") == 0);
  auto gpus = parse_topology_text(std::string(base) + R"([[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu"], gpus = 2 } ])",
                                  "t.toml", "/d");
  REQUIRE_FALSE(gpus.has_value());
  CHECK(gpus.err().message ==
        "t.toml:17: replica 'r0', stage 0: unknown key 'gpus' (it takes node, layers, devices, kv_port)");
  auto node_key = parse_topology_text(std::string(base) + "[[node]]\nname = \"n2\"\nhost = \"127.0.0.1\"\nport = 7412\nthread = 2\n" +
                                          ok_replica,
                                      "t.toml", "/d");
  REQUIRE_FALSE(node_key.has_value());
  CHECK(node_key.err().message == "t.toml:19: [[node]] #3: unknown key 'thread'; did you mean 'threads'?");
  // A value of the wrong type or out of range names its own line.
  auto range = parse_topology_text(text + "[kv]\nblock_size = 16\nnum_blocks = 0\n", "t.toml", "/d");
  REQUIRE_FALSE(range.has_value());
  CHECK(range.err().message == "t.toml:21: [kv]: num_blocks must be in 1..1073741824");
  // A table written as a value, and an array of tables written as one.
  CHECK(parse_topology_text("kv = 5\n" + text, "t.toml", "/d").err().message.find("t.toml:1: 'kv' must be a table") !=
        std::string::npos);
}

}  // namespace troupe::tools

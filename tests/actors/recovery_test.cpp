// Failures inside one process, with real stages, shards and schedulers: a stage or shard
// killed under a scheduler mid-generation, and a scheduler killed under the router while
// its replica streams. Every request ends once, its chunks numbered without gaps, with the
// tokens the engine gives alone. (The decisions themselves are tested event by event in
// tests/engine/serve/, and the scheduler actor's recovery on CAF's deterministic
// coordinator in scheduler_recovery_test.cpp.)
#include <atomic>
#include <chrono>
#include <map>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/replica.hpp"
#include "actors/router_actor.hpp"
#include "actors/wire/client_codec.hpp"
#include "engine/generate/generator.hpp"
#include "tests/actors/actor_test_support.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

const char* texts[] = {"Once upon a time", "The cat", "Lily and Tom went to the", "One day", "He was", "She saw a big",
                       "The sun was", "Tim had a red"};

std::vector<request_params> requests(const test::loaded& l) {
  std::vector<request_params> out;
  for (const char* t : texts) {
    request_params p;
    p.prompt = l.tok.encode(t, true);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 60;
    p.ignore_eos = true;
    out.push_back(p);
  }
  return out;
}

using test::alone_tokens;
using test::collect;
using test::ledger;

// Every request ended once, without an error, with the engine's tokens.
void check_as_alone(ledger& lg, const std::vector<generation_result>& alone) {
  for (size_t i = 0; i < alone.size(); ++i) {
    CAPTURE(texts[i]);
    CHECK(lg.ends[i + 1] == 1);
    CHECK(lg.results[i + 1].error.empty());
    CHECK(lg.tokens[i + 1] == alone[i].tokens);
  }
}

// Waits until the router has `n` ready replicas: the router answers when they are (30 s
// bounds a wait that would otherwise never end).
void wait_ready(caf::scoped_actor& self, const caf::actor& router, uint32_t n) {
  uint32_t ready = 0;
  self->request(router, std::chrono::seconds(30), health_atom_v, n)
      .receive([&](uint32_t r) { ready = r; }, [](caf::error&) {});
  REQUIRE(ready >= n);
}

}  // namespace

TEST_CASE("a stage, the kv manager, then a shard, killed under a running scheduler: the requests recompute and finish as alone") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const auto reqs = requests(l);
  const auto alone = alone_tokens(l, reqs);

  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto rep = spawn_replica(sys, l.m, test::with_kv({{0, 2, 1}, {2, 5, 2}}, test::small_kv(), 128));
  scheduler_setup s = test::scheduler_for(l, "r0", 2);
  s.agent = rep.agent;
  auto sched = spawn_scheduler(sys, s);
  for (size_t i = 0; i < reqs.size(); ++i)
    self->send(sched, generate_atom_v, uint64_t{i + 1},
               wire_message(wire_kind::none, wire::encode_generate_request_text(texts[i], reqs[i])), caf::actor{self});
  ledger lg;
  auto kill = [&](const char* name) {
    bool killed = false;
    self->request(rep.agent, std::chrono::seconds(5), kill_atom_v, std::string(name))
        .receive([&](bool k) { killed = k; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    CHECK(killed);
  };
  collect(self, lg, reqs.size(), [&](int n) {
    if (n == 40) kill("r0/stage1");
    if (n == 120) kill("r0/kv");  // the blocks it tracked are gone: recompute
    if (n == 200) kill("r0/stage1/shard1");  // TP=2: its peer is released from the all-reduce
  });
  check_as_alone(lg, alone);
  // The agent restarted the stage twice and the kv manager once; every block is free again.
  uint32_t used = 99;
  self->request(sched, std::chrono::seconds(5), stats_atom_v)
      .receive([&](uint32_t u, uint32_t, uint32_t, uint32_t) { used = u; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(used == 0);
  self->request(rep.agent, std::chrono::seconds(5), health_atom_v)
      .receive(
          [&](const wire_message& m) {
            auto h = wire::decode_node_health(*m.bytes);
            REQUIRE(h.has_value());
            CHECK(h->ready);
            int seen = 0;
            for (const auto& a : h->actors) {
              if (a.name == "r0/stage1") CHECK(a.restarts == 2);
              if (a.name == "r0/kv") CHECK(a.restarts == 1);
              seen += a.name == "r0/stage1" || a.name == "r0/kv";
            }
            CHECK(seen == 2);
          },
          [&](caf::error& e) { FAIL(sys.render(e)); });
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("a scheduler killed under the router: its requests continue on the other replica, each token once") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const auto reqs = requests(l);
  const auto alone = alone_tokens(l, reqs);

  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::vector<unit_spec> units;
  for (const char* r : {"r0", "r1"}) {
    const auto layouts = test::with_kv({{0, 3, 1}, {3, 5, 1}}, test::small_kv(), 128);
    units.push_back(stage_unit(l.m, r, 0, layouts[0]));
    units.push_back(stage_unit(l.m, r, 1, layouts[1]));
    units.push_back(kv_manager_unit(r, test::kv_manager_for(l)));
    units.push_back(scheduler_unit(r, test::scheduler_for(l, r, 2)));
  }
  auto agent = spawn_node_agent(sys, "local", units);
  router_setup rs;
  rs.agent = agent;
  rs.replicas = {{"r0", scheduler_name("r0"), "", 0}, {"r1", scheduler_name("r1"), "", 0}};
  auto router = spawn_router(sys, rs);
  wait_ready(self, router, 2);
  auto unix_ms = [] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  };
  const uint64_t before_kills = unix_ms();
  for (size_t i = 0; i < reqs.size(); ++i)
    self->send(router, generate_atom_v, uint64_t{i + 1},
               wire_message(wire_kind::none, wire::encode_generate_request_text(texts[i], reqs[i])), caf::actor{self});
  ledger lg;
  collect(self, lg, reqs.size(), [&](int n) {
    if (n == 60) self->send(agent, kill_atom_v, std::string("r0/scheduler"));
    if (n == 250) self->send(agent, kill_atom_v, std::string("r1/scheduler"));
  });
  check_as_alone(lg, alone);
  // A request cancelled just as its replica dies ends once, as cancelled, not resubmitted.
  wait_ready(self, router, 2);  // both replicas back
  request_params longer = reqs[0];
  longer.max_tokens = 400;
  self->send(router, generate_atom_v, uint64_t{100},
             wire_message(wire_kind::none, wire::encode_generate_request_text(texts[0], longer)), caf::actor{self});
  ledger one;
  bool cancelled = false;
  collect(self, one, 1, [&](int n) {
    if (n != 3) return;
    self->request(router, std::chrono::seconds(5), cancel_atom_v, uint64_t{100})
        .receive([&](bool found) { cancelled = found; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    self->send(agent, kill_atom_v, std::string("r0/scheduler"));
    self->send(agent, kill_atom_v, std::string("r1/scheduler"));
  });
  CHECK(cancelled);
  CHECK(one.ends[100] == 1);
  CHECK(one.results[100].error.empty());
  CHECK(one.results[100].reason == finish_reason::aborted);
  CHECK(one.tokens[100].size() < 400);

  // The router's health says when a replica last stopped being ready, by the wall clock:
  // since the kills began.
  uint64_t last_down_ms = 0;
  self->request(router, std::chrono::seconds(5), health_atom_v)
      .receive([&](bool, uint32_t, uint32_t, const std::string&, uint64_t, uint64_t at) { last_down_ms = at; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(last_down_ms + 1 >= before_kills);
  CHECK(last_down_ms <= unix_ms() + 1);

  std::string metrics;
  self->request(router, std::chrono::seconds(5), metrics_atom_v)
      .receive([&](const std::string& m) { metrics = m; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  // The first two kills are seen for sure; the last two, if the router had found the
  // restarted schedulers by then.
  const std::string key = "\ntroupe_replica_failovers_total ";
  const size_t at = metrics.find(key);
  REQUIRE(at != std::string::npos);
  CHECK(std::stoi(metrics.substr(at + key.size())) >= 2);
  self->send_exit(router, caf::exit_reason::user_shutdown);
  self->send_exit(agent, caf::exit_reason::user_shutdown);
}

}  // namespace troupe

// KV eviction through the scheduler actor: each request's own policy crosses the client
// codec, the stages sum the attention their layers saw (across pipeline stages, and over
// the heads of tensor-parallel shards), and every greedy stream is the engine's alone.
#include <map>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/replica.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/wire/client_codec.hpp"
#include "engine/generate/generator.hpp"
#include "tests/actors/actor_test_support.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

TEST_CASE("KV eviction through the scheduler actor: each request's policy, streams as the engine alone") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const char* texts[] = {"Once upon a time", "The cat", "Lily and Tom went to the", "One day", "She saw a big"};
  const kv_eviction_config policies[] = {{kv_policy::h2o, 48, -1, -1, 16},
                                         {kv_policy::scissorhands, 40, -1, 16, 8},
                                         {kv_policy::streaming, 32, 4, -1, 16},
                                         {},  // none: the whole cache
                                         {kv_policy::h2o, 64, -1, 24, 16}};
  std::vector<request_params> reqs;
  for (size_t i = 0; i < std::size(texts); ++i) {
    request_params p;
    p.prompt = l.tok.encode(texts[i], true);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 150;
    p.ignore_eos = true;
    p.eviction = policies[i];
    reqs.push_back(p);
  }
  generator_options o;
  o.max_step_tokens = 128;
  o.num_blocks = 128;
  generator gen(l.m, l.tok, o);
  auto alone = gen.generate(reqs);
  REQUIRE(alone.has_value());

  system_config cfg;
  caf::actor_system sys{cfg};
  // One stage; two stages, whose attention sums add up on the way; a stage of two
  // tensor-parallel shards, which sum each other's heads.
  for (const auto& layout : std::vector<std::vector<stage_layout>>{{{0, 5, 1}}, {{0, 2, 1}, {2, 5, 1}}, {{0, 2, 1}, {2, 5, 2}}}) {
    CAPTURE(layout.size());
    CAPTURE(layout.back().tp);
    scheduler_setup setup = test::scheduler_for(l, "r0", layout.size());
    auto rep = spawn_replica(sys, l.m, test::with_kv(layout, setup.config.kv, setup.config.max_step_tokens));
    setup.agent = rep.agent;
    setup.stages = rep.stages;
    auto sched = spawn_scheduler(sys, setup);
    caf::scoped_actor self{sys};
    std::map<uint64_t, size_t> index;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const wire_message msg(wire_kind::none, wire::encode_generate_request_text(texts[i], reqs[i]));
      self->request(sched, std::chrono::seconds(10), generate_atom_v, msg, caf::actor{self})
          .receive([&](uint64_t id) { index[id] = i; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    }
    test::ledger lg;
    test::collect(self, lg, reqs.size());
    for (const auto& [id, i] : index) {
      CAPTURE(texts[i]);
      CHECK(lg.ends[id] == 1);
      CHECK(lg.tokens[id] == (*alone)[i].tokens);
    }
    std::vector<uint64_t> eviction;
    self->request(sched, std::chrono::seconds(10), metrics_atom_v)
        .receive([&](uint32_t, uint64_t, uint64_t, const std::string&, const std::vector<uint64_t>&,
                     const std::vector<uint64_t>& e) { eviction = e; },
                 [&](caf::error& e) { FAIL(sys.render(e)); });
    REQUIRE(eviction.size() == eviction_figures_size);
    // Each evicting request dropped all but its budget, give or take the slack of a
    // compaction (at most an eighth of the budget or a block, and the decode token).
    uint64_t least = 0;
    for (const auto& r : reqs)
      if (r.eviction->enabled()) least += r.prompt.size() + r.max_tokens - r.eviction->budget - 16;
    CHECK(eviction[0] >= least);
    CHECK(eviction[1] == 0);  // nothing runs now
    uint32_t used = 99;
    self->request(sched, std::chrono::seconds(10), stats_atom_v)
        .receive([&](uint32_t u, uint32_t, uint32_t, uint32_t) { used = u; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    CHECK(used == 0);
    self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
    self->send_exit(sched, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("KV eviction through the actors: evicting requests copy the cached blocks they would change") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const std::string opening =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her big red "
      "ball. One day, she saw";
  const char* endings[] = {" a dog", " a cat", " a bird", " a tree", " a boy", " a car"};
  std::vector<request_params> reqs;
  std::vector<std::string> texts;
  for (size_t i = 0; i < std::size(endings); ++i) {
    request_params p;
    texts.push_back(opening + endings[i]);
    p.prompt = l.tok.encode(texts.back(), true);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 100;
    p.ignore_eos = true;
    if (i % 2 == 1) p.eviction = kv_eviction_config{i == 3 ? kv_policy::streaming : kv_policy::h2o, 48, 4, -1, 16};
    reqs.push_back(p);
  }
  auto alone = test::alone_tokens(l, reqs);
  system_config cfg;
  caf::actor_system sys{cfg};
  const std::vector<stage_layout> layout{{0, 2, 1}, {2, 5, 1}};
  scheduler_setup setup = test::scheduler_for(l, "r0", layout.size());
  auto rep = spawn_replica(sys, l.m, test::with_kv(layout, setup.config.kv, setup.config.max_step_tokens));
  setup.agent = rep.agent;
  setup.stages = rep.stages;
  auto sched = spawn_scheduler(sys, setup);
  caf::scoped_actor self{sys};
  std::map<uint64_t, size_t> index;
  auto send = [&](size_t i) {
    const wire_message msg(wire_kind::none, wire::encode_generate_request_text(texts[i], reqs[i]));
    self->request(sched, std::chrono::seconds(10), generate_atom_v, msg, caf::actor{self})
        .receive([&](uint64_t id) { index[id] = i; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  };
  // The first request caches the opening; the rest share it while some evict.
  send(0);
  test::ledger first;
  test::collect(self, first, 1);
  for (size_t i = 1; i < reqs.size(); ++i) send(i);
  test::ledger lg;
  test::collect(self, lg, reqs.size() - 1);
  for (const auto& [id, i] : index) {
    CAPTURE(i);
    const auto& got = i == 0 ? first.tokens[id] : lg.tokens[id];
    CHECK(got.size() == 100);
    if (!reqs[i].eviction) CHECK(got == alone[i].tokens);  // the shared blocks, unchanged
    if (i > 0) CHECK(lg.results[id].cached_prompt_tokens >= 32);
  }
  std::vector<uint64_t> eviction;
  self->request(sched, std::chrono::seconds(10), metrics_atom_v)
      .receive([&](uint32_t, uint64_t, uint64_t, const std::string&, const std::vector<uint64_t>&,
                   const std::vector<uint64_t>& e) { eviction = e; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  REQUIRE(eviction.size() == eviction_figures_size);
  CHECK(eviction[0] > 0);
  self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
  self->send_exit(sched, caf::exit_reason::user_shutdown);
}

TEST_CASE("KV eviction through the actors with n-gram speculation: drafts verified across stages, within budgets") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const std::string text = "The cat sat. The cat sat. The cat sat. The cat";
  request_params p;
  p.prompt = l.tok.encode(text, true);
  p.sampling.temperature = 0.0f;
  p.max_tokens = 160;
  p.ignore_eos = true;
  system_config cfg;
  caf::actor_system sys{cfg};
  const std::vector<stage_layout> layout{{0, 2, 1}, {2, 5, 1}};
  scheduler_setup setup = test::scheduler_for(l, "r0", layout.size());
  setup.config.eviction = {kv_policy::h2o, 40, -1, -1, 16};
  setup.spec.method = spec_method::ngram;
  setup.spec.k = 4;
  auto rep = spawn_replica(sys, l.m, test::with_kv(layout, setup.config.kv, setup.config.max_step_tokens));
  setup.agent = rep.agent;
  setup.stages = rep.stages;
  auto sched = spawn_scheduler(sys, setup);
  caf::scoped_actor self{sys};
  for (int i = 0; i < 3; ++i) {
    const wire_message msg(wire_kind::none, wire::encode_generate_request_text(text, p));
    self->request(sched, std::chrono::seconds(10), generate_atom_v, msg, caf::actor{self})
        .receive([](uint64_t) {}, [&](caf::error& e) { FAIL(sys.render(e)); });
  }
  test::ledger lg;
  test::collect(self, lg, 3);
  for (const auto& [id, toks] : lg.tokens) CHECK(toks.size() == 160);
  std::vector<uint64_t> spec, eviction;
  self->request(sched, std::chrono::seconds(10), metrics_atom_v)
      .receive([&](uint32_t, uint64_t, uint64_t, const std::string&, const std::vector<uint64_t>& s,
                   const std::vector<uint64_t>& e) { spec = s, eviction = e; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  REQUIRE(spec.size() == spec_figures_size);
  CHECK(spec[2] > 0);  // drafts accepted
  REQUIRE(eviction.size() == eviction_figures_size);
  CHECK(eviction[0] >= 3 * (160 - 40));
  self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
  self->send_exit(sched, caf::exit_reason::user_shutdown);
}

TEST_CASE("a request's KV policy is refused by a scheduler that cannot run it, with the reason") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  system_config cfg;
  caf::actor_system sys{cfg};
  scheduler_setup setup = test::scheduler_for(l, "r0", 1);
  setup.config.no_eviction = "KV eviction runs on CPU shards only";
  auto rep = spawn_replica(sys, l.m, test::with_kv({{0, 5, 1}}, setup.config.kv, setup.config.max_step_tokens));
  setup.agent = rep.agent;
  setup.stages = rep.stages;
  auto sched = spawn_scheduler(sys, setup);
  caf::scoped_actor self{sys};
  request_params p;
  p.prompt = l.tok.encode("Once upon a time", true);
  p.max_tokens = 8;
  p.eviction = kv_eviction_config{kv_policy::h2o, 64, -1, -1, 16};
  std::string why;
  self->request(sched, std::chrono::seconds(10), generate_atom_v,
                wire_message(wire_kind::none, wire::encode_generate_request_text("Once upon a time", p)), caf::actor{self})
      .receive([&](uint64_t) {}, [&](caf::error& e) { why = sys.render(e); });
  CHECK(why.find("KV eviction runs on CPU shards only") != std::string::npos);
  // Without it, served.
  p.eviction.reset();
  uint64_t id = 0;
  self->request(sched, std::chrono::seconds(10), generate_atom_v,
                wire_message(wire_kind::none, wire::encode_generate_request_text("Once upon a time", p)), caf::actor{self})
      .receive([&](uint64_t i) { id = i; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  test::ledger lg;
  test::collect(self, lg, 1);
  CHECK(lg.ends[id] == 1);
  self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
  self->send_exit(sched, caf::exit_reason::user_shutdown);
}

}  // namespace troupe

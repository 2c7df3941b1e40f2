// KV eviction through the scheduler actor: each request's own policy crosses the client
// codec, the stages sum the attention their layers saw (across pipeline stages, and over
// the heads of tensor-parallel shards), and every greedy stream is the engine's alone;
// evicting requests copy the shared blocks they would change; n-gram speculation, a draft
// model and early exit under a budget; a policy the replica cannot run is refused.
#include <map>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "engine/serve/llm_engine.hpp"
#include "tests/actors/actor_test_support.hpp"

namespace troupe {

namespace {

// A greedy request of `max_tokens` through end-of-sequence tokens, under `eviction`.
request_params greedy(const test::loaded& l, const std::string& text, int32_t max_tokens,
                      std::optional<kv_eviction_config> eviction = std::nullopt) {
  request_params p;
  p.prompt = l.tok.encode(text, true);
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.eviction = eviction;
  return p;
}

}  // namespace

TEST_CASE("KV eviction through the scheduler actor: each request's policy, streams as the engine alone") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const std::vector<std::string> texts{"Once upon a time", "The cat", "Lily and Tom went to the", "One day", "She saw a big"};
  const kv_eviction_config policies[] = {{kv_policy::h2o, 48, -1, -1, 16},
                                         {kv_policy::scissorhands, 40, -1, 16, 8},
                                         {kv_policy::streaming, 32, 4, -1, 16},
                                         {},  // none: the whole cache
                                         {kv_policy::h2o, 64, -1, 24, 16}};
  std::vector<request_params> reqs;
  for (size_t i = 0; i < texts.size(); ++i) reqs.push_back(greedy(l, texts[i], 150, policies[i]));
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
    auto r = test::start_replica(sys, l.m, test::scheduler_for(l, "r0", layout.size()), layout);
    caf::scoped_actor self{sys};
    std::map<uint64_t, size_t> index;
    for (size_t i = 0; i < reqs.size(); ++i) index[test::submit(self, r.sched, texts[i], reqs[i])] = i;
    test::ledger lg;
    test::collect(self, lg, reqs.size());
    for (const auto& [id, i] : index) {
      const std::string& text = texts[i];  // (a variable: clang 14 captures no binding)
      CAPTURE(text);
      CHECK(lg.ends[id] == 1);
      CHECK(lg.tokens[id] == (*alone)[i].tokens);
    }
    const eviction_figures eviction = test::metrics_of(self, r.sched).eviction;
    // Each evicting request dropped all but its budget, give or take the slack of a
    // compaction (at most an eighth of the budget or a block, and the decode token).
    uint64_t least = 0;
    for (const auto& p : reqs)
      if (p.eviction->enabled()) least += p.prompt.size() + p.max_tokens - p.eviction->budget - 16;
    CHECK(eviction.evicted_tokens >= least);
    CHECK(eviction.requests == 0);  // nothing runs now
    CHECK(eviction.held_tokens == 0);
    CHECK(test::kv_used(self, r.sched) == 0);
    r.stop(self);
  }
}

TEST_CASE("KV eviction through the actors: evicting requests copy the cached blocks they would change") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const std::string opening =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her big red "
      "ball and her little brown dog Max. One day, she saw";
  const char* endings[] = {" a dog", " a cat", " a bird", " a tree", " a boy", " a car"};
  std::vector<request_params> reqs;
  std::vector<std::string> texts;
  for (size_t i = 0; i < std::size(endings); ++i) {
    texts.push_back(opening + endings[i]);
    std::optional<kv_eviction_config> e;
    if (i % 2 == 1) e = kv_eviction_config{i == 3 ? kv_policy::streaming : kv_policy::h2o, 48, 4, -1, 16};
    reqs.push_back(greedy(l, texts.back(), 100, e));
  }
  auto alone = test::alone_tokens(l, reqs);
  system_config cfg;
  caf::actor_system sys{cfg};
  const std::vector<stage_layout> layout{{0, 2, 1}, {2, 5, 1}};
  auto r = test::start_replica(sys, l.m, test::scheduler_for(l, "r0", layout.size()), layout);
  caf::scoped_actor self{sys};
  // The first request caches the opening; the rest share it while some evict.
  const uint64_t first_id = test::submit(self, r.sched, texts[0], reqs[0]);
  test::ledger first;
  test::collect(self, first, 1);
  CHECK(first.tokens[first_id] == alone[0].tokens);
  std::map<uint64_t, size_t> index;
  for (size_t i = 1; i < reqs.size(); ++i) index[test::submit(self, r.sched, texts[i], reqs[i])] = i;
  test::ledger lg;
  test::collect(self, lg, reqs.size() - 1);
  for (const auto& [id, i] : index) {
    const size_t request = i;  // (a variable: clang 14 captures no binding)
    CAPTURE(request);
    CHECK(lg.tokens[id].size() == 100);
    // The shared blocks unchanged; an evicting request's text its own alone, hit or not.
    CHECK(lg.tokens[id] == alone[i].tokens);
    // An evicting request's hit leaves the last tokens of its first chunk (which ends at
    // its budget, 48) to compute: the 32 queries whose attention H2O counts, one token for
    // streaming; whole blocks of 16.
    const auto& e = reqs[i].eviction;
    if (e) CHECK(lg.results[id].cached_prompt_tokens == (e->policy == kv_policy::h2o ? 16 : 32));
    else CHECK(lg.results[id].cached_prompt_tokens >= 48);
  }
  CHECK(test::metrics_of(self, r.sched).eviction.evicted_tokens > 0);
  r.stop(self);
}

TEST_CASE("KV eviction through the actors with n-gram speculation: drafts verified across stages, within budgets") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const std::string text = "The cat sat. The cat sat. The cat sat. The cat";
  system_config cfg;
  caf::actor_system sys{cfg};
  const std::vector<stage_layout> layout{{0, 2, 1}, {2, 5, 1}};
  scheduler_setup setup = test::scheduler_for(l, "r0", layout.size());
  setup.config.eviction = {kv_policy::h2o, 40, -1, -1, 16};
  setup.spec.method = spec_method::ngram;
  setup.spec.k = 4;
  auto r = test::start_replica(sys, l.m, setup, layout);
  caf::scoped_actor self{sys};
  for (int i = 0; i < 3; ++i) test::submit(self, r.sched, text, greedy(l, text, 160));
  test::ledger lg;
  test::collect(self, lg, 3);
  for (const auto& [id, toks] : lg.tokens) CHECK(toks.size() == 160);
  const auto m = test::metrics_of(self, r.sched);
  CHECK(m.spec.accepted > 0);
  CHECK(m.eviction.evicted_tokens >= 3 * (160 - 40));
  r.stop(self);
}

TEST_CASE("KV eviction through the actors with a draft actor: its cache follows the slots, streams as the engine") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const std::vector<std::string> texts{"Once upon a time", "The cat", "Lily and Tom went to the"};
  const kv_eviction_config policies[] = {{kv_policy::h2o, 40, -1, -1, 16},
                                         {kv_policy::streaming, 32, 4, -1, 16},
                                         {kv_policy::scissorhands, 48, -1, 16, 8}};
  std::vector<request_params> reqs;
  for (size_t i = 0; i < texts.size(); ++i) reqs.push_back(greedy(l, texts[i], 150, policies[i]));
  generator_options o;
  o.max_step_tokens = 128;
  o.num_blocks = 128;
  generator gen(l.m, l.tok, o);
  auto alone = gen.generate(reqs);
  REQUIRE(alone.has_value());

  system_config cfg;
  caf::actor_system sys{cfg};
  const std::vector<stage_layout> layout{{0, 2, 1}, {2, 5, 1}};
  // The target as its own draft model, and early exit after four of its five layers: the
  // draft actor keeps a cache of its own, which the orders' slot positions keep in step.
  for (spec_method method : {spec_method::draft, spec_method::early_exit}) {
    CAPTURE(spec_method_name(method));
    scheduler_setup setup = test::scheduler_for(l, "r0", layout.size());
    setup.spec.method = method;
    setup.spec.k = 4;
    setup.spec.exit_layer = 4;
    draft_setup drafter;
    drafter.m = &l.m;
    drafter.spec = setup.spec;
    auto r = test::start_replica(sys, l.m, setup, layout, drafter);
    caf::scoped_actor self{sys};
    // The same requests with the whole cache first: how often drafts are kept without
    // eviction.
    for (size_t i = 0; i < reqs.size(); ++i) test::submit(self, r.sched, texts[i], greedy(l, texts[i], 150));
    test::ledger whole;
    test::collect(self, whole, reqs.size());
    const speculation_figures before = test::metrics_of(self, r.sched).spec;
    std::map<uint64_t, size_t> index;
    for (size_t i = 0; i < reqs.size(); ++i) index[test::submit(self, r.sched, texts[i], reqs[i])] = i;
    test::ledger lg;
    test::collect(self, lg, reqs.size());
    for (const auto& [id, i] : index) {
      const std::string& text = texts[i];  // (a variable: clang 14 captures no binding)
      CAPTURE(text);
      CHECK(lg.tokens[id] == (*alone)[i].tokens);
    }
    const scheduler_figures m = test::metrics_of(self, r.sched);
    CHECK(m.eviction.evicted_tokens > 0);
    // Drafts kept about as often as with the whole cache: a draft actor that lost track of
    // the slots would have them rejected.
    const double rate_before = static_cast<double>(before.accepted) / static_cast<double>(before.proposed);
    const double rate = static_cast<double>(m.spec.accepted - before.accepted) /
                        static_cast<double>(m.spec.proposed - before.proposed);
    CHECK(m.spec.proposed - before.proposed > 100);
    // (The target as its own draft keeps nearly all: the draft actor's cache makes the
    // target's compactions.)
    CHECK(rate > (method == spec_method::draft ? 0.95 : 0.75) * rate_before);
    CHECK(test::kv_used(self, r.sched) == 0);
    r.stop(self);
  }
}

TEST_CASE("a request's KV policy is refused by a scheduler that cannot run it, with the reason") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  system_config cfg;
  caf::actor_system sys{cfg};
  scheduler_setup setup = test::scheduler_for(l, "r0", 1);
  speculative_config trees;
  trees.method = spec_method::early_exit;
  trees.tree = {2, 2};
  const auto why_not = llm_engine::why_no_eviction(trees);
  REQUIRE(why_not.has_value());
  setup.config.no_eviction = *why_not;
  auto r = test::start_replica(sys, l.m, setup, {{0, 5, 1}});
  caf::scoped_actor self{sys};
  request_params p = greedy(l, "Once upon a time", 8, kv_eviction_config{kv_policy::h2o, 64, -1, -1, 16});
  std::string why;
  self->request(r.sched, std::chrono::seconds(10), generate_atom_v,
                wire_message(wire_kind::none, wire::encode_generate_request_text("Once upon a time", p)), caf::actor{self})
      .receive([&](uint64_t) {}, [&](caf::error& e) { why = sys.render(e); });
  CHECK(why.find(*why_not) != std::string::npos);
  // Without it, served.
  p.eviction.reset();
  const uint64_t id = test::submit(self, r.sched, "Once upon a time", p);
  test::ledger lg;
  test::collect(self, lg, 1);
  CHECK(lg.ends[id] == 1);
  r.stop(self);
}

}  // namespace troupe

// The scheduler actor over a TP=2 replica of actors: concurrent streams, a cancel, and
// the engine's tokens, greedy and seeded draws (chosen by the last stage, or, in steps
// with a request that needs more than the logits, by the scheduler); and speculative
// decoding by each proposer (trained heads and token trees too), whose greedy streams are
// the engine's alone.
#include "actors/scheduler_actor.hpp"

#include <map>
#include <thread>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/replica.hpp"
#include "actors/wire/client_codec.hpp"
#include "engine/generate/generator.hpp"
#include "engine/speculative/heads.hpp"
#include "tests/actors/actor_test_support.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

TEST_CASE("16 concurrent streams through the scheduler actor: complete, in order, greedy or drawn, as the engine alone") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const char* texts[] = {"Once upon a time", "The cat", "Lily and Tom went to the", "One day", "He was",
                         "She saw a big", "The sun was", "Tim had a red", "In the park", "A little bird",
                         "Mom said", "They played", "The dog ran", "There was a", "Ben wanted to", "It was a sunny day"};
  std::vector<request_params> reqs;
  for (const char* t : texts) {
    request_params p;
    p.prompt = l.tok.encode(t, true);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 48;
    const size_t i = reqs.size();
    if (i % 4 == 1) {  // drawn by the last stage
      p.sampling = {0.8f, 40, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 100 + i, -1, {}};
    } else if (i % 4 == 3) {  // a penalty needs the scheduler's sampler: steps return logits until these end
      p.sampling = {0.7f, 0, 1.0f, 0.05f, 1.2f, 0.0f, 0.0f, 200 + i, -1, {}};
      p.max_tokens = 12;
    } else if (i % 8 == 6) {  // so does a logit bias (below; it travels in the request's frame)
      p.max_tokens = 12;
    }
    reqs.push_back(p);
  }
  // The biased requests' greedy first token is banned.
  const auto plain = test::alone_tokens(l, {reqs[6], reqs[14]});
  reqs[6].sampling.logit_bias = {{plain[0].tokens.at(0), -100.0f}, {400, 2.5f}};
  reqs[14].sampling.logit_bias = {{plain[1].tokens.at(0), -100.0f}, {13, -1.0f}};
  const auto alone = test::alone_tokens(l, reqs);
  CHECK(alone[6].tokens.at(0) != plain[0].tokens[0]);
  CHECK(alone[14].tokens.at(0) != plain[1].tokens[0]);

  system_config cfg;
  caf::actor_system sys{cfg};
  // TP=2 in one stage with one step in flight; PP=2 with a step per stage in flight.
  for (const auto& [layout, in_flight] : std::vector<std::pair<std::vector<stage_layout>, int32_t>>{
           {{{0, 5, 2}}, 1}, {{{0, 2, 1}, {2, 5, 1}}, 2}}) {
  const int32_t steps_in_flight = in_flight;  // (a variable: clang 14 captures no binding)
  CAPTURE(steps_in_flight);
  scheduler_setup setup = test::scheduler_for(l, "r0", layout.size());
  auto rep = spawn_replica(sys, l.m, test::with_kv(layout, setup.config.kv, setup.config.max_step_tokens));
  setup.agent = rep.agent;
  setup.stages = rep.stages;
  auto sched = spawn_scheduler(sys, setup);
  caf::scoped_actor self{sys};

  std::map<uint64_t, size_t> index;  // request id -> prompt index
  for (size_t i = 0; i < reqs.size(); ++i) {
    const wire_message msg(wire_kind::none, wire::encode_generate_request_text(texts[i], reqs[i]));
    self->request(sched, std::chrono::seconds(10), generate_atom_v, msg, caf::actor{self})
        .receive([&](uint64_t id) { index[id] = i; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  }
  // One more request, cancelled at once.
  request_params longer = reqs[0];
  longer.max_tokens = 400;
  uint64_t cancelled = 0;
  self->request(sched, std::chrono::seconds(10), generate_atom_v,
                wire_message(wire_kind::none, wire::encode_generate_request_text("Once upon a time", longer)), caf::actor{self})
      .receive([&](uint64_t id) { cancelled = id; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  bool found = false;
  self->request(sched, std::chrono::seconds(10), cancel_atom_v, cancelled).receive([&](bool f) { found = f; }, [&](caf::error&) {});
  CHECK(found);

  test::ledger lg;
  test::collect(self, lg, reqs.size() + 1);  // checks numbering and the final chunks
  CHECK(lg.results[cancelled].reason == finish_reason::aborted);
  for (const auto& [id, i] : index) {
    const std::string& text = texts[i];  // (a variable: clang 14 captures no binding)
    CAPTURE(text);
    CHECK(lg.ends[id] == 1);
    CHECK(lg.tokens[id] == alone[i].tokens);
    CHECK(lg.results[id].output_tokens == alone[i].tokens.size());
  }
  uint32_t used = 99;
  self->request(sched, std::chrono::seconds(10), stats_atom_v)
      .receive([&](uint32_t u, uint32_t, uint32_t, uint32_t) { used = u; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(used == 0);

  // A malformed request is refused; the scheduler keeps serving.
  bool refused = false;
  self->request(sched, std::chrono::seconds(10), generate_atom_v, wire_message(wire_kind::none, {1, 2, 3}), caf::actor{self})
      .receive([&](uint64_t) {}, [&](caf::error&) { refused = true; });
  CHECK(refused);
  self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("speculative decoding through the scheduler actor: greedy streams as the engine alone, by each proposer") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const test::loaded draft = test::load(test::models_dir() + "/stories260K.gguf", test::models_dir() + "/tok512.bin");
  const char* texts[] = {"Once upon a time", "The cat", "Lily and Tom went to the", "One day", "She saw a big",
                         "Tim had a red"};
  std::vector<request_params> reqs;
  for (const char* t : texts) {
    request_params p;
    p.prompt = l.tok.encode(t, true);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 64;
    const size_t i = reqs.size();
    if (i == 1) p.speculative = 0;  // this one without
    if (i == 2) p.speculative = 1;  // this one one draft at a time
    if (i == 3) p.sampling = {0.0f, 0, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, 0, -1, {}};  // a penalty: verified here
    if (i == 5) p.sampling = {0.8f, 40, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 77, -1, {}};  // drawn: ends, in order
    reqs.push_back(p);
  }
  // A stop string inside an accepted run: a word from the middle of request 4's output.
  {
    const auto plain = test::alone_tokens(l, {reqs[4]});
    const std::string text = l.tok.decode_all(std::vector<int32_t>(plain[0].tokens.begin() + 20, plain[0].tokens.begin() + 24));
    reqs[4].stop_strings = {text.substr(1, 4)};
  }
  const auto alone = test::alone_tokens(l, reqs);
  REQUIRE(alone[4].tokens.size() <= 24);  // cut at the stop, well before max_tokens

  // Trained proposers (tests/data): heads draft in the scheduler from the features the
  // last stage returns; the trained draft model in the draft actor.
  auto trained = load_model(test::data_path("stories260K-draft.gguf"));
  REQUIRE(trained.has_value());
  auto heads = [&](const char* file) {
    auto h = load_heads(test::data_path(file), l.m, &l.tok.vocab());
    REQUIRE(h.has_value());
    return std::shared_ptr<const speculative_heads>(std::move(h).value());
  };
  const auto medusa = heads("stories260K-medusa.gguf"), eagle = heads("stories260K-eagle.gguf");

  system_config cfg;
  caf::actor_system sys{cfg};
  struct run {
    spec_method method;
    std::vector<stage_layout> layout;
    std::vector<int32_t> tree = {};
    int32_t tree_auto = 0;
  };
  for (const run& r : {run{spec_method::ngram, {{0, 5, 2}}}, run{spec_method::draft, {{0, 2, 1}, {2, 5, 1}}},
                       run{spec_method::early_exit, {{0, 5, 1}}}, run{spec_method::early_exit, {{0, 2, 1}, {2, 5, 2}}},
                       run{spec_method::medusa, {{0, 5, 2}}}, run{spec_method::eagle, {{0, 2, 1}, {2, 5, 1}}},
                       run{spec_method::medusa, {{0, 2, 1}, {2, 5, 2}}, {3, 2, 1}},
                       run{spec_method::eagle, {{0, 5, 1}}, {1, 1, 1, 1}, 12},
                       run{spec_method::draft, {{0, 2, 1}, {2, 5, 1}}, {2, 2, 1}},
                       run{spec_method::ngram, {{0, 5, 2}}, {2, 1, 1}}}) {
    CAPTURE(spec_method_name(r.method));
    CAPTURE(r.layout.size());
    const std::vector<int32_t> tree = r.tree;  // (a variable: doctest captures it)
    CAPTURE(tree);
    scheduler_setup setup = test::scheduler_for(l, "r0", r.layout.size());
    setup.spec.method = r.method;
    setup.spec.k = 4;
    setup.spec.exit_layer = 4;
    setup.spec.tree = r.tree;
    setup.spec.tree_auto = r.tree_auto;
    setup.spec.max_step_tokens = 64;
    if (r.method == spec_method::medusa) setup.heads = medusa;
    if (r.method == spec_method::eagle) setup.heads = eagle;
    // A draft model's and early exit's drafts come from the replica's draft actor.
    draft_setup drafter;
    if (r.method == spec_method::draft || r.method == spec_method::early_exit) {
      drafter.m = r.method != spec_method::draft ? &l.m : r.tree.empty() ? &draft.m : &*trained;
      drafter.spec = setup.spec;
    }
    auto rep = spawn_replica(sys, l.m, test::with_kv(r.layout, setup.config.kv, setup.config.max_step_tokens), "r0", drafter);
    setup.agent = rep.agent;
    setup.stages = rep.stages;
    setup.draft = rep.draft;
    auto sched = spawn_scheduler(sys, setup);
    caf::scoped_actor self{sys};
    std::map<uint64_t, size_t> index;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const wire_message msg(wire_kind::none, wire::encode_generate_request_text(texts[i], reqs[i]));
      self->request(sched, std::chrono::seconds(10), generate_atom_v, msg, caf::actor{self})
          .receive([&](uint64_t id) { index[id] = i; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    }
    test::ledger lg;
    test::collect(self, lg, reqs.size());  // checks numbering and the final chunks
    for (const auto& [id, i] : index) {
      const std::string& text = texts[i];  // (a variable: clang 14 captures no binding)
      CAPTURE(text);
      CHECK(lg.ends[id] == 1);
      if (reqs[i].sampling.temperature == 0.0f) CHECK(lg.tokens[id] == alone[i].tokens);
      if (i == 4) CHECK(lg.results[id].reason == finish_reason::stop);
    }
    // What speculation did: drafts proposed and verified, and some accepted.
    const scheduler_figures m = test::metrics_of(self, sched);
    const speculation_figures& spec = m.spec;
    CHECK(m.spec_method == spec_method_name(r.method));
    CHECK(m.tiers.loaded_tokens + m.tiers.failed_loads + m.tiers.saved_blocks + m.tiers.directory == 0);  // (no tiers here)
    REQUIRE(spec.by_accepted.size() == max_draft_tokens + 1);
    REQUIRE(spec.offered_at.size() == max_draft_tokens);
    REQUIRE(spec.kept_at.size() == max_draft_tokens);
    CHECK(spec.verifies > 10);
    CHECK(spec.proposed >= spec.verifies);  // at least one a verify
    CHECK(spec.accepted > 0);
    CHECK(spec.accepted <= spec.proposed);
    uint64_t verifies = 0, accepted = 0;
    for (size_t n = 0; n <= max_draft_tokens; ++n) {
      verifies += spec.by_accepted[n];
      accepted += n * spec.by_accepted[n];
    }
    CHECK(verifies == spec.verifies);
    CHECK(accepted == spec.accepted);
    // By depth: every verify reaches depth 1; the kept drafts, one per depth kept, are the
    // accepted ones.
    CHECK(spec.offered_at[0] == spec.verifies);
    uint64_t kept = 0;
    for (size_t d = 0; d < max_draft_tokens; ++d) {
      CHECK(spec.kept_at[d] <= spec.offered_at[d]);
      kept += spec.kept_at[d];
    }
    CHECK(kept == spec.accepted);
    // (The model as its own draft: every chain's drafts taken.)
    if (r.method == spec_method::draft && r.tree.empty()) CHECK(spec.accepted == spec.proposed);
    uint32_t used = 99;
    self->request(sched, std::chrono::seconds(10), stats_atom_v)
        .receive([&](uint32_t u, uint32_t, uint32_t, uint32_t) { used = u; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    CHECK(used == 0);  // rejected drafts' blocks all back
    self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
    self->send_exit(sched, caf::exit_reason::user_shutdown);
  }
}

}  // namespace troupe

namespace troupe {

TEST_CASE("a draft actor that dies costs drafts, not output: the replica stays ready and finds it again") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const char* texts[] = {"Once upon a time", "The cat", "Lily and Tom went to the", "One day"};
  std::vector<request_params> reqs;
  std::vector<std::string> prompts;
  for (int round = 0; round < 2; ++round)
    for (const char* t : texts) {
      request_params p;
      p.prompt = l.tok.encode(t, true);
      p.sampling.temperature = 0.0f;
      p.max_tokens = 48;
      reqs.push_back(p);
      prompts.push_back(t);
    }
  const auto alone = test::alone_tokens(l, reqs);

  system_config cfg;
  caf::actor_system sys{cfg};
  scheduler_setup setup = test::scheduler_for(l, "r0", 1);
  setup.spec.method = spec_method::early_exit;
  setup.spec.k = 4;
  setup.spec.exit_layer = 4;
  draft_setup drafter;
  drafter.m = &l.m;
  drafter.spec = setup.spec;
  auto rep = spawn_replica(sys, l.m, test::with_kv({{0, 5, 1}}, setup.config.kv, setup.config.max_step_tokens), "r0", drafter);
  setup.agent = rep.agent;
  setup.stages = rep.stages;
  setup.draft = rep.draft;
  auto sched = spawn_scheduler(sys, setup);
  caf::scoped_actor self{sys};
  auto verifies = [&] {
    return test::metrics_of(self, sched).spec.verifies;
  };
  auto send = [&](size_t from, size_t to, std::map<uint64_t, size_t>& index) {
    for (size_t i = from; i < to; ++i) {
      const wire_message msg(wire_kind::none, wire::encode_generate_request_text(prompts[i], reqs[i]));
      self->request(sched, std::chrono::seconds(10), generate_atom_v, msg, caf::actor{self})
          .receive([&](uint64_t id) { index[id] = i; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    }
  };
  auto check = [&](const test::ledger& lg, const std::map<uint64_t, size_t>& index) {
    for (const auto& [id, i] : index) {
      const std::string& prompt = prompts[i];  // (a variable: clang 14 captures no binding)
      CAPTURE(prompt);
      CHECK(lg.tokens.at(id) == alone[i].tokens);
    }
  };
  // The draft actor is killed while the first round decodes.
  std::map<uint64_t, size_t> first;
  send(0, 4, first);
  bool killed = false;
  self->request(rep.agent, std::chrono::seconds(5), kill_atom_v, std::string("r0/draft"))
      .receive([&](bool k) { killed = k; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(killed);
  test::ledger lg;
  test::collect(self, lg, 4);
  check(lg, first);
  bool ready = false;
  self->request(sched, std::chrono::seconds(10), health_atom_v)
      .receive([&](bool r, uint32_t, uint32_t, uint32_t, uint32_t, const std::string&) { ready = r; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(ready);
  // Its replacement is found within a few ticks, and the second round has drafts again.
  const uint64_t before = verifies();
  std::map<uint64_t, size_t> second;
  CHECK(test::eventually([&] {
    std::map<uint64_t, size_t> one;
    send(4, 5, one);
    test::ledger l1;
    test::collect(self, l1, 1);
    check(l1, one);
    return verifies() > before;
  }));
  send(4, 8, second);
  test::ledger l2;
  test::collect(self, l2, 4);
  check(l2, second);
  self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
  self->send_exit(sched, caf::exit_reason::user_shutdown);
}

}  // namespace troupe

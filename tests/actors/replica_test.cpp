// Step plans through stage and shard actors in one process, for every parallel shape:
// the same greedy tokens as the engine loop alone.
#include "actors/replica.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/wire/activations_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "engine/generate/generator.hpp"
#include "engine/sched/scheduler.hpp"
#include "tests/actors/actor_test_support.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

// Drives a scheduler whose steps run on the replica's actors; returns each request's tokens.
std::vector<std::vector<int32_t>> run_on_actors(caf::actor_system& sys, const test::loaded& l,
                                                const std::vector<stage_layout>& layout,
                                                const std::vector<request_params>& reqs) {
  scheduler_config cfg;
  cfg.kv.num_blocks = 256;
  cfg.kv.block_size = 16;
  cfg.max_step_tokens = 64;
  cfg.context = l.m.config.max_seq_len;
  cfg.vocab = l.m.config.vocab_size;
  scheduler sched(cfg, l.tok);
  for (size_t i = 0; i < reqs.size(); ++i) REQUIRE(sched.add(request_id{i}, reqs[i]).has_value());
  auto rep = spawn_replica(sys, l.m, test::with_kv(layout, cfg.kv, cfg.max_step_tokens));
  wire::step_encoder enc;
  std::vector<request_id> released;
  std::vector<std::vector<int32_t>> out(reqs.size());
  caf::scoped_actor self{sys};
  std::vector<caf::actor> stages;
  for (const auto& a : rep.stages)
    self->request(rep.agent, std::chrono::seconds(5), lookup_atom_v, a.name)
        .receive([&](const caf::actor& s) { stages.push_back(s); }, [&](caf::error& e) { FAIL(sys.render(e)); });
  REQUIRE(stages.size() == layout.size());
  for (int step = 0; sched.has_unfinished(); ++step) {
    REQUIRE(step < 2000);
    const step_plan plan = sched.schedule();
    const wire_message msg(wire_kind::step_plan, enc.encode(plan, released));
    released.clear();
    std::vector<sample_result> samples;
    // The scheduler's part: carry the step from stage to stage.
    wire_message act;
    for (size_t s = 0; s + 1 < stages.size(); ++s)
      self->request(stages[s], std::chrono::seconds(30), step_atom_v, msg, act)
          .receive([&](const wire_message& out) { act = out; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    self->request(stages.back(), std::chrono::seconds(30), step_atom_v, msg, act)
        .receive(
            [&](const wire_message& logits) {
              REQUIRE(logits.bytes);
              auto lg = wire::decode_activations(*logits.bytes, l.m.config.vocab_size, 4096);
              REQUIRE_MESSAGE(lg.has_value(), (lg ? "" : lg.err().message));
              REQUIRE(lg->num_tokens == plan.num_samples());
              int32_t row = 0;
              for (const auto& c : plan.chunks) {
                if (!c.sample) continue;
                samples.push_back(sched.find(c.id)->smp.sample(lg->data.data() + static_cast<size_t>(row++) * l.m.config.vocab_size,
                                                             l.m.config.vocab_size));
              }
            },
            [&](caf::error& e) { FAIL(sys.render(e)); });
    for (const auto& o : sched.update_from_output(plan, samples)) {
      auto& t = out[o.id.value];
      t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) released.push_back(o.id);
    }
  }
  self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
  return out;
}

}  // namespace

TEST_CASE("PP and TP layouts of actors give the engine's greedy tokens") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  std::vector<request_params> reqs;
  for (const char* p : {"Once upon a time", "Lily and Tom went to the", "The cat", "One day"}) {
    request_params r;
    r.prompt = l.tok.encode(p, true);
    r.sampling.temperature = 0.0f;
    r.max_tokens = 40;
    reqs.push_back(r);
  }
  generator gen(l.m, l.tok, generator_options{});
  auto alone = gen.generate(reqs);
  REQUIRE(alone.has_value());

  system_config cfg;
  caf::actor_system sys{cfg};
  const std::vector<std::pair<const char*, std::vector<stage_layout>>> layouts = {
      {"one stage", {{0, 5, 1}}},
      {"PP=2", {{0, 3, 1}, {3, 5, 1}}},
      {"TP=2", {{0, 5, 2}}},
      {"PP=2 x TP=2", {{0, 3, 2}, {3, 5, 2}}},
  };
  for (const auto& [name, layout] : layouts) {
    const std::string layout_name = name;  // (a variable: clang 14 captures no binding)
    CAPTURE(layout_name);
    const auto got = run_on_actors(sys, l, layout, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) CHECK(got[i] == (*alone)[i].tokens);
  }
}

}  // namespace troupe

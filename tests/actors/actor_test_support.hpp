// actor_test_support: what the actor tests share. A scheduler set up over in-process
// stages; the engine's own tokens as the reference; and a ledger of what a sink actor
// receives from a scheduler or the router, checked as it arrives: chunks numbered from 0
// without gaps, the final chunk inside the result, the result's chunk count, and each
// request ending once.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/type_ids.hpp"
#include "actors/replica.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/wire/client_codec.hpp"
#include "engine/generate/generator.hpp"
#include "tests/support/test_support.hpp"

namespace troupe::test {

// A scheduler for replica `replica` whose `stages` stages and kv manager are named on the
// local agent: 128 blocks of 16 tokens, 128 tokens a step, one step in flight per stage.
inline scheduler_setup scheduler_for(const loaded& l, const std::string& replica, size_t stages) {
  scheduler_setup s;
  s.m = &l.m;
  s.tok = &l.tok;
  s.replica = replica;
  s.config.kv.num_blocks = 128;
  s.config.kv.block_size = 16;
  s.config.max_step_tokens = 128;
  s.config.context = l.m.config.max_seq_len;
  s.config.vocab = l.m.config.vocab_size;
  s.max_in_flight = static_cast<int32_t>(stages);
  s.config.micro_batches = s.max_in_flight;
  for (size_t i = 0; i < stages; ++i) s.stages.push_back({stage_name(replica, i), "", 0});
  s.kv_manager = kv_manager_name(replica);
  return s;
}

// Its kv manager's setup, to match.
inline kv_manager_setup kv_manager_for(const loaded& l) {
  kv_manager_setup k;
  k.kv.num_blocks = 128;
  k.kv.block_size = 16;
  k.context = l.m.config.max_seq_len;
  return k;
}

// Stage layouts whose shards keep `kv` and take steps of max_step_tokens.
inline std::vector<stage_layout> with_kv(std::vector<stage_layout> layouts, const kv_config& kv, int32_t max_step_tokens) {
  for (auto& l : layouts) {
    l.kv = kv;
    l.max_step_tokens = max_step_tokens;
  }
  return layouts;
}

// 128 blocks of 16 tokens: the caches of scheduler_for's replicas.
inline kv_config small_kv() {
  kv_config kv;
  kv.num_blocks = 128;
  kv.block_size = 16;
  return kv;
}

// Each request's tokens from the engine alone, the reference for every run through actors.
inline std::vector<generation_result> alone_tokens(const loaded& l, const std::vector<request_params>& reqs) {
  generator gen(l.m, l.tok, generator_options{});
  auto alone = gen.generate(reqs);
  REQUIRE(alone.has_value());
  return std::move(alone).value();
}

// A request with its prompt as text, sent to scheduler `sched` with `self` as its sink;
// the id the scheduler gave it.
inline uint64_t submit(caf::scoped_actor& self, const caf::actor& sched, const std::string& text, const request_params& p) {
  uint64_t id = 0;
  const wire_message msg(wire_kind::none, wire::encode_generate_request_text(text, p));
  self->request(sched, std::chrono::seconds(10), generate_atom_v, msg, caf::actor{self})
      .receive([&](uint64_t i) { id = i; }, [&](caf::error& e) { FAIL(self->system().render(e)); });
  return id;
}

// What a scheduler's metrics_atom answers (actors/scheduler_figures.hpp).
inline scheduler_figures metrics_of(caf::scoped_actor& self, const caf::actor& sched) {
  scheduler_figures m;
  self->request(sched, std::chrono::seconds(10), metrics_atom_v)
      .receive([&](const scheduler_figures& f) { m = f; }, [&](caf::error& e) { FAIL(self->system().render(e)); });
  return m;
}

// The KV blocks a scheduler's requests hold now.
inline uint32_t kv_used(caf::scoped_actor& self, const caf::actor& sched) {
  uint32_t used = 0;
  self->request(sched, std::chrono::seconds(10), stats_atom_v)
      .receive([&](uint32_t u, uint32_t, uint32_t, uint32_t) { used = u; }, [&](caf::error& e) { FAIL(self->system().render(e)); });
  return used;
}

// A replica of in-process stages (layouts over setup's pool and step size) and its
// scheduler; stop() ends both.
struct running_replica {
  local_replica rep;
  caf::actor sched;
  void stop(caf::scoped_actor& self) {
    self->send_exit(rep.agent, caf::exit_reason::user_shutdown);
    self->send_exit(sched, caf::exit_reason::user_shutdown);
  }
};
inline running_replica start_replica(caf::actor_system& sys, const model& m, scheduler_setup setup,
                                     const std::vector<stage_layout>& layouts, const draft_setup& drafter = {}) {
  running_replica r;
  r.rep = spawn_replica(sys, m, with_kv(layouts, setup.config.kv, setup.config.max_step_tokens), setup.replica, drafter);
  setup.agent = r.rep.agent;
  setup.stages = r.rep.stages;
  setup.draft = r.rep.draft;
  r.sched = spawn_scheduler(sys, setup);
  return r;
}

struct ledger {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, uint32_t> next_seq;
  std::map<uint64_t, int> ends;
  std::map<uint64_t, wire::result_view> results;
  int chunks = 0;
};

// Receives until `count` requests have ended; calls `at_chunk(n)` after the n-th chunk.
inline void collect(caf::scoped_actor& self, ledger& lg, size_t count, const std::function<void(int)>& at_chunk = {}) {
  while (lg.ends.size() < count) {
    bool got = false;
    self->receive(
        [&](chunk_atom, const wire_message& m) {
          auto c = wire::decode_token_chunk(*m.bytes);
          REQUIRE(c.has_value());
          CHECK(c->seq == lg.next_seq[c->request]++);
          lg.tokens[c->request].insert(lg.tokens[c->request].end(), c->tokens.begin(), c->tokens.end());
          ++lg.chunks;
          if (at_chunk) at_chunk(lg.chunks);
          got = true;
        },
        [&](done_atom, const wire_message& m) {
          auto r = wire::decode_generate_result(*m.bytes);
          REQUIRE(r.has_value());
          if (r->last) {
            CHECK(r->last->seq == lg.next_seq[r->request]++);
            lg.tokens[r->request].insert(lg.tokens[r->request].end(), r->last->tokens.begin(), r->last->tokens.end());
          }
          CHECK(r->chunks == lg.next_seq[r->request]);
          ++lg.ends[r->request];
          lg.results[r->request] = *r;
          got = true;
        },
        caf::after(std::chrono::seconds(60)) >> [] {});
    REQUIRE(got);
  }
}

}  // namespace troupe::test

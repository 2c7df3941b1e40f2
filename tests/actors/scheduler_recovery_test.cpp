// The scheduler actor's recovery on CAF's deterministic test coordinator: a stand-in node
// agent and stand-in stages, every message delivered when the test says, and time moved
// by the test. No sleeps and no wall clock: the pauses between canary steps, the health
// news a watcher hears, and the recovery deadline are checked to the millisecond.
#include <map>
#include <memory>
#include <set>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <doctest/doctest.h>

#include "actors/caf/errors.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/kv_manager_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/wire/activations_codec.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "tests/actors/actor_test_support.hpp"

namespace troupe {

namespace {

using namespace std::chrono_literals;

struct deterministic_config : caf::actor_system_config {
  deterministic_config() {
    add_message_types<caf::id_block::troupe>();
    set("scheduler.policy", caf::atom("testing"));
  }
};

// An actor system whose messages run only in run(), and whose clock moves only in advance().
struct deterministic_system {
  deterministic_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& coordinator = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());

  void run() { coordinator.run(); }
  void advance(std::chrono::milliseconds d) {
    coordinator.advance_time(d);
    run();
  }
};

// The node agent's lookups, from a table the test changes.
using directory = std::shared_ptr<std::map<std::string, caf::actor>>;
caf::behavior agent_behavior(caf::event_based_actor*, directory names) {
  return {[names](lookup_atom, const std::string& name) -> caf::result<caf::actor> {
    auto it = names->find(name);
    if (it == names->end()) return make_error(error_code::not_found, "no such actor: " + name);
    return it->second;
  }};
}

// A stage that fails every step, counting them.
caf::behavior broken_stage(caf::event_based_actor*, std::shared_ptr<int> steps) {
  return {[steps](step_atom, const wire_message&, const wire_message&) -> caf::result<wire_message> {
    ++*steps;
    return make_error(error_code::broken, "this stage is broken");
  }};
}

// A one-stage pipeline that answers a step of one token with finite logits, counting
// the steps it answers.
caf::behavior counting_stage(caf::event_based_actor*, int32_t vocab, std::shared_ptr<int> steps) {
  return {[vocab, steps](step_atom, const wire_message&, const wire_message&) -> wire_message {
    ++*steps;
    const std::vector<float> logits(vocab, 0.5f);
    return wire_message(wire_kind::activations, wire::encode_activations(0, 1, vocab, logits.data()));
  }};
}

caf::behavior working_stage(caf::event_based_actor* self, int32_t vocab) {
  return counting_stage(self, vocab, std::make_shared<int>(0));
}

// A one-stage pipeline that refuses every plan carrying request `poison` and answers the
// others with finite logits, one row a plan (a one-token step: the canary's, or a request
// of one prompt token).
caf::behavior poisoned_stage(caf::event_based_actor*, const test::loaded* l, uint64_t poison) {
  wire::step_limits lim;
  lim.vocab = l->m.config.vocab_size;
  lim.context = l->m.config.max_seq_len;
  lim.num_blocks = 1u << 20;
  auto decoder = std::make_shared<wire::step_decoder>(lim);
  return {[decoder, poison, vocab = lim.vocab](step_atom, const wire_message& plan,
                                               const wire_message&) -> caf::result<wire_message> {
    auto step = decoder->decode(*plan.bytes);
    if (!step) return make_error(error_code::invalid, step.err().message);
    for (request_id id : step->ids)
      if (id.value == poison) return make_error(error_code::invalid, "this plan is refused");
    const std::vector<float> logits(vocab, 0.5f);
    return wire_message(wire_kind::activations, wire::encode_activations(0, 1, vocab, logits.data()));
  }};
}

// A scheduler of one stage ("r0/stage0") that keeps its blocks itself.
scheduler_setup one_stage(const test::loaded& l, const caf::actor& agent, std::chrono::milliseconds recovery_timeout) {
  scheduler_setup s = test::scheduler_for(l, "r0", 1);
  s.kv_manager.clear();
  s.agent = agent;
  s.recovery_timeout = recovery_timeout;
  return s;
}

}  // namespace

TEST_CASE("scheduler actor: a stage that fails every step is retried at once, then after 50 ms doubling to 2 s") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  deterministic_system d;
  auto steps = std::make_shared<int>(0);
  auto names = std::make_shared<std::map<std::string, caf::actor>>();
  (*names)["r0/stage0"] = d.sys.spawn(broken_stage, steps);
  auto sched = spawn_scheduler(d.sys, one_stage(l, d.sys.spawn(agent_behavior, names), 30s));
  d.run();
  CHECK(*steps == 2);  // the first canary, and the first retry at once
  // Each later retry after a pause of 50, 100, 200, 400, 800, 1600, 2000, 2000 ms.
  for (auto pause : {50ms, 100ms, 200ms, 400ms, 800ms, 1600ms, 2000ms, 2000ms}) {
    CAPTURE(pause.count());
    const int before = *steps;
    d.advance(pause - 1ms);
    CHECK(*steps == before);
    d.advance(1ms);
    CHECK(*steps == before + 1);
  }
  // Not ready, and health says why.
  caf::scoped_actor self{d.sys, true};
  self->send(sched, health_atom_v);
  d.run();
  bool ready = true;
  std::string detail;
  self->receive([&](bool r, uint32_t, uint32_t, uint32_t, uint32_t, const std::string& why) { ready = r, detail = why; },
                caf::after(0s) >> [] { FAIL("no health answer"); });
  CHECK_FALSE(ready);
  CHECK(detail.find("this stage is broken") != std::string::npos);
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  d.run();
}

TEST_CASE("scheduler actor: a watcher hears once when the replica stops being ready, and once when it is ready again") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  deterministic_system d;
  auto names = std::make_shared<std::map<std::string, caf::actor>>();
  const caf::actor first = d.sys.spawn(working_stage, l.m.config.vocab_size);
  (*names)["r0/stage0"] = first;
  auto sched = spawn_scheduler(d.sys, one_stage(l, d.sys.spawn(agent_behavior, names), 30s));
  d.run();
  caf::scoped_actor self{d.sys, true};
  self->send(sched, health_atom_v);  // asking makes this actor a watcher
  d.run();
  bool ready = false;
  self->receive([&](bool r, uint32_t, uint32_t, uint32_t, uint32_t, const std::string&) { ready = r; },
                caf::after(0s) >> [] { FAIL("no health answer"); });
  REQUIRE(ready);
  // The stage dies; the agent has a new one by the time the scheduler looks.
  (*names)["r0/stage0"] = d.sys.spawn(working_stage, l.m.config.vocab_size);
  self->send_exit(first, caf::exit_reason::kill);
  d.run();
  std::vector<bool> told;
  for (bool more = true; more;)
    self->receive([&](health_atom, bool r) { told.push_back(r); }, caf::after(0s) >> [&] { more = false; });
  CHECK(told == std::vector<bool>{false, true});
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  d.run();
}

TEST_CASE("scheduler actor: a request waiting past the recovery timeout ends as unavailable, with the reason") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  deterministic_system d;
  auto names = std::make_shared<std::map<std::string, caf::actor>>();
  (*names)["r0/stage0"] = d.sys.spawn(broken_stage, std::make_shared<int>(0));
  auto sched = spawn_scheduler(d.sys, one_stage(l, d.sys.spawn(agent_behavior, names), 2s));
  caf::scoped_actor self{d.sys, true};
  request_params p;
  p.prompt = l.tok.encode("Once upon a time", true);
  p.max_tokens = 8;
  self->send(sched, generate_atom_v, uint64_t{5}, wire_message(wire_kind::none, wire::encode_generate_request_tokens(p)),
             caf::actor{self});
  d.run();
  // The scheduler checks every 250 ms; 1,750 ms after it started the request still waits.
  d.advance(1750ms);
  bool ended = false;
  self->receive([&](done_atom, const wire_message&) { ended = true; }, caf::after(0s) >> [] {});
  CHECK_FALSE(ended);
  d.advance(250ms);
  std::optional<wire::result_view> result;
  self->receive([&](done_atom, const wire_message& m) { result = wire::decode_generate_result(*m.bytes).value(); },
                caf::after(0s) >> [] {});
  REQUIRE(result.has_value());
  CHECK(result->request == 5);
  CHECK(result->error_type == error_code::unavailable);
  CHECK(result->error == "replica r0 did not recover within 2 s (stage 0: this stage is broken)");
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  d.run();
}

TEST_CASE("scheduler actor: a resubmission whose whole output was delivered ends at once, with no step and no chunk") {
  // Its client saw the final chunk but lost the end (a gateway that died in between).
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  deterministic_system d;
  auto names = std::make_shared<std::map<std::string, caf::actor>>();
  auto steps = std::make_shared<int>(0);
  (*names)["r0/stage0"] = d.sys.spawn(counting_stage, l.m.config.vocab_size, steps);
  auto sched = spawn_scheduler(d.sys, one_stage(l, d.sys.spawn(agent_behavior, names), 30s));
  caf::scoped_actor self{d.sys, true};
  d.run();
  const int before = *steps;  // the canary's
  request_params p;
  p.prompt = l.tok.encode("Once upon a time", true);
  p.max_tokens = 3;
  const std::vector<int32_t> delivered = {l.tok.encode(" the", false)[0], 5, 6};
  wire::route_rewrite w;
  w.delivered = delivered;
  auto frame = wire::with_route(wire::encode_generate_request_tokens(p), w);
  REQUIRE(frame.has_value());
  self->send(sched, generate_atom_v, uint64_t{7}, wire_message(wire_kind::none, *frame), caf::actor{self});
  d.run();
  int chunks = 0;
  std::optional<wire::result_view> r;
  for (bool more = true; more;)
    self->receive([&](chunk_atom, const wire_message&) { ++chunks; },
                  [&](done_atom, const wire_message& m) { r = wire::decode_generate_result(*m.bytes).value(); },
                  caf::after(0s) >> [&] { more = false; });
  REQUIRE(r.has_value());
  CHECK(r->request == 7);
  CHECK(r->error.empty());
  CHECK(r->reason == finish_reason::length);
  CHECK(r->output_tokens == 3);
  CHECK_FALSE(r->last.has_value());
  CHECK(chunks == 0);
  CHECK(*steps == before);  // nothing was computed for it
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  d.run();
}

TEST_CASE("scheduler actor: a request whose every step is refused ends with the reason, and the replica serves on") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  deterministic_system d;
  auto names = std::make_shared<std::map<std::string, caf::actor>>();
  (*names)["r0/stage0"] = d.sys.spawn(poisoned_stage, &l, uint64_t{5});
  auto sched = spawn_scheduler(d.sys, one_stage(l, d.sys.spawn(agent_behavior, names), 30s));
  caf::scoped_actor self{d.sys, true};
  auto send = [&](uint64_t id, const std::vector<int32_t>& prompt) {
    request_params p;
    p.prompt = prompt;
    p.max_tokens = 1;
    self->send(sched, generate_atom_v, id, wire_message(wire_kind::none, wire::encode_generate_request_tokens(p)),
               caf::actor{self});
  };
  auto result = [&]() {
    std::optional<wire::result_view> r;
    self->receive([&](done_atom, const wire_message& m) { r = wire::decode_generate_result(*m.bytes).value(); },
                  caf::after(0s) >> [] {});
    return r;
  };
  send(5, l.tok.encode("Once upon a time", true));
  // Each loss comes while the replica is ready, so each is looked into at once: without a
  // cap the replica would spin through the same plan for ever (here: until the bound on
  // messages, and the request has no answer). Its fourth step ends it.
  d.coordinator.run(10000);
  auto r = result();
  CHECK(r.has_value());
  if (r) {
    CHECK(r->request == 5);
    CHECK(r->error_type == error_code::internal);
    CHECK(r->error == "its last 4 steps failed on replica r0 (the latest: stage 0: this plan is refused); "
                      "it is ended rather than computed into the same failure again");
  }
  // The replica is ready again, and serves the next request.
  send(6, {l.tok.bos_id()});
  d.run();
  r = result();
  CHECK(r.has_value());
  if (r) {
    CHECK(r->request == 6);
    CHECK(r->error.empty());
    CHECK(r->output_tokens == 1);
  }
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  d.run();
}

}  // namespace troupe

namespace troupe {

namespace {

// A one-stage pipeline that checks every plan against the ones before: a sequence that
// starts past position 0 (a prefix hit) must find each slot before its start written by
// an earlier plan, or by this one. It answers each plan with finite logits, a row a
// logit row, and counts the slots found unwritten.
struct slot_ledger {
  std::set<std::pair<uint32_t, int32_t>> written;  // (block, slot)
  int unwritten = 0;
  int plans = 0;
};
caf::behavior ledger_stage(caf::event_based_actor*, const test::loaded* l, int32_t block_size,
                           std::shared_ptr<slot_ledger> ledger) {
  wire::step_limits lim;
  lim.vocab = l->m.config.vocab_size;
  lim.context = l->m.config.max_seq_len;
  lim.num_blocks = 1u << 20;
  lim.block_size = block_size;
  auto decoder = std::make_shared<wire::step_decoder>(lim);
  return {[decoder, ledger, block_size, vocab = lim.vocab](step_atom, const wire_message& plan,
                                                           const wire_message&) -> caf::result<wire_message> {
    auto step = decoder->decode(*plan.bytes);
    if (!step) return make_error(error_code::invalid, step.err().message);
    ++ledger->plans;
    for (const step_sequence& s : step->batch.sequences)
      for (int32_t p = s.start_pos; p < s.start_pos + s.num_tokens; ++p)
        ledger->written.insert({s.block_table[static_cast<size_t>(p / block_size)].value, p % block_size});
    for (const step_sequence& s : step->batch.sequences)
      for (int32_t p = 0; p < s.start_pos; ++p)
        ledger->unwritten += !ledger->written.count({s.block_table[static_cast<size_t>(p / block_size)].value, p % block_size});
    const int32_t rows = step->batch.num_logits();
    const std::vector<float> logits(static_cast<size_t>(vocab) * static_cast<size_t>(rows), 0.5f);
    return wire_message(wire_kind::activations, wire::encode_activations(step->step_id, rows, vocab, logits.data()));
  }};
}

// A client that counts what reaches it. (CAF 0.17 spawns a function without arguments
// through a null argument tuple, which the undefined-behaviour sanitizer reports.)
caf::behavior counting_sink(caf::event_based_actor*, std::shared_ptr<int> heard) {
  return {[heard](chunk_atom, const wire_message&) { ++*heard; }, [heard](done_atom, const wire_message&) { ++*heard; }};
}

}  // namespace

TEST_CASE("scheduler actor: a request whose client leaves while its step's claims are out ends after that step, and "
          "a request sharing its prefix reads only computed blocks") {
  // The blocks a claim is granted are in the kv manager's prefix cache from the claim on.
  // A request that ended between its claim and its step (its client gone) left them there
  // uncomputed, and the next request with the same prompt read them as a prefix hit.
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  deterministic_system d;
  auto names = std::make_shared<std::map<std::string, caf::actor>>();
  auto ledger = std::make_shared<slot_ledger>();
  (*names)["r0/stage0"] = d.sys.spawn(ledger_stage, &l, 16, ledger);
  const caf::actor kv = spawn_kv_manager(d.sys, test::kv_manager_for(l));
  (*names)[kv_manager_name("r0")] = kv;
  scheduler_setup s = test::scheduler_for(l, "r0", 1);
  s.agent = d.sys.spawn(agent_behavior, names);
  s.recovery_timeout = 30s;
  auto sched = spawn_scheduler(d.sys, s);
  caf::scoped_actor self{d.sys, true};
  d.run();
  REQUIRE(ledger->plans >= 1);  // the canary's
  request_params p;
  p.prompt = l.tok.encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                          "with her friends. One day, she saw a big red ball", true);
  REQUIRE(p.prompt.size() >= 33);  // two whole blocks before its last token: a prefix to share
  p.max_tokens = 4;
  const wire_message frame(wire_kind::none, wire::encode_generate_request_tokens(p));
  auto heard = std::make_shared<int>(0);
  const caf::actor left = d.sys.spawn(counting_sink, heard);
  auto all_but_kv = [&](caf::resumable* job) { return job != dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(kv)); };
  // The request arrives, and the scheduler sends its claim (the kv manager not yet run).
  self->send(sched, generate_atom_v, uint64_t{11}, frame, left);
  d.coordinator.run_jobs_filtered(all_but_kv);
  // Its client goes, and another request with the same prompt arrives, while the claim is out.
  caf::anon_send_exit(left, caf::exit_reason::kill);
  self->send(sched, generate_atom_v, uint64_t{12}, frame, caf::actor{self});
  d.coordinator.run_jobs_filtered(all_but_kv);
  d.run();
  std::optional<wire::result_view> r;
  for (bool more = true; more;)
    self->receive([&](chunk_atom, const wire_message&) {},
                  [&](done_atom, const wire_message& m) { r = wire::decode_generate_result(*m.bytes).value(); },
                  caf::after(0s) >> [&] { more = false; });
  REQUIRE(r.has_value());
  CHECK(r->request == 12);
  CHECK(r->error.empty());
  CHECK(r->output_tokens == 4);
  CHECK(ledger->unwritten == 0);
  CHECK(*heard == 0);  // it left before its step answered
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  d.run();
}

}  // namespace troupe

// The scheduler driven by hand: plans are inspected, samples are made up.
#include "engine/sched/scheduler.hpp"

#include <algorithm>
#include <functional>
#include <random>

#include <doctest/doctest.h>

#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

scheduler_config small(int32_t budget, uint32_t blocks = 64, int32_t max_running = 8) {
  scheduler_config c;
  c.max_step_tokens = budget;
  c.kv.num_blocks = blocks;
  c.kv.block_size = 4;
  c.max_running = max_running;
  c.context = 512;
  c.vocab = 512;
  return c;
}

request_params prompt_of(int32_t n, int32_t first = 300, int32_t max_tokens = 100) {
  request_params p;
  for (int32_t i = 0; i < n; ++i) p.prompt.push_back(first + i % 100);
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

// Feeds token `t` to every sampled chunk of the plan.
std::vector<step_output> run(scheduler& s, const step_plan& plan, int32_t t = 400) {
  std::vector<sample_result> samples(plan.num_samples());
  for (auto& x : samples) x.token = t;
  return s.update_from_output(plan, samples);
}

}  // namespace

TEST_CASE("chunked prefill: a long prompt is computed over several steps within the budget") {
  scheduler s(small(8), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(20)).has_value());
  for (int32_t expect_first : {0, 8}) {
    const step_plan p = s.schedule();
    REQUIRE(p.chunks.size() == 1);
    CHECK(p.chunks[0].first == expect_first);
    CHECK(p.chunks[0].count == 8);
    CHECK_FALSE(p.chunks[0].sample);
    CHECK(run(s, p).empty());
  }
  const step_plan p = s.schedule();
  CHECK(p.chunks[0].first == 16);
  CHECK(p.chunks[0].count == 4);
  CHECK(p.chunks[0].sample);
  const auto out = run(s, p, 401);
  REQUIRE(out.size() == 1);
  CHECK(out[0].new_tokens == std::vector<int32_t>{401});
  CHECK(s.find(request_id{1})->num_computed_tokens == 20);
  CHECK(s.find(request_id{1})->num_tokens() == 21);
  // Next step decodes the sampled token.
  const step_plan d = s.schedule();
  CHECK(d.chunks[0].first == 20);
  CHECK(d.chunks[0].count == 1);
}

TEST_CASE("decode tokens and a prefill chunk share one step's budget") {
  scheduler s(small(8), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(3)).has_value());
  run(s, s.schedule());  // prefilled, first token sampled
  REQUIRE(s.add(request_id{2}, prompt_of(20, 100)).has_value());
  const step_plan p = s.schedule();
  REQUIRE(p.chunks.size() == 2);
  CHECK(p.chunks[0].id == request_id{1});
  CHECK(p.chunks[0].count == 1);
  CHECK(p.chunks[1].id == request_id{2});
  CHECK(p.chunks[1].count == 7);
  CHECK(p.num_tokens == 8);
}

TEST_CASE("the running cap holds requests back until one finishes") {
  scheduler s(small(64, 64, 2), test::tok512());
  for (uint64_t id = 1; id <= 3; ++id) REQUIRE(s.add(request_id{id}, prompt_of(4, 300, 1)).has_value());
  const step_plan p = s.schedule();
  CHECK(p.chunks.size() == 2);
  CHECK(s.num_waiting() == 1);
  const auto out = run(s, p);
  CHECK(out.size() == 2);
  CHECK(out[0].finished);  // max_tokens 1
  CHECK(out[0].reason == finish_reason::length);
  const step_plan q = s.schedule();
  REQUIRE(q.chunks.size() == 1);
  CHECK(q.chunks[0].id == request_id{3});
}

TEST_CASE("the priority policy admits lower priority values first, and FCFS admits by arrival") {
  for (schedule_policy policy : {schedule_policy::fcfs, schedule_policy::priority}) {
    auto cfg = small(64, 64, 1);
    cfg.policy = policy;
    scheduler s(cfg, test::tok512());
    auto a = prompt_of(4);
    a.priority = 5;
    auto b = prompt_of(4);
    b.priority = 1;
    REQUIRE(s.add(request_id{1}, a).has_value());
    REQUIRE(s.add(request_id{2}, b).has_value());
    const step_plan p = s.schedule();
    REQUIRE(p.chunks.size() == 1);
    CHECK(p.chunks[0].id == request_id{policy == schedule_policy::fcfs ? 1u : 2u});
  }
}

TEST_CASE("out of blocks, the latest running request is preempted and later recomputes") {
  // 4 blocks of 4 tokens; two requests of 6 prompt tokens each hold 2 blocks.
  auto cfg = small(64, 4);
  cfg.kv.prefix_caching = false;
  scheduler s(cfg, test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(6, 300, 20)).has_value());
  REQUIRE(s.add(request_id{2}, prompt_of(6, 100, 20)).has_value());
  run(s, s.schedule());  // both prefilled: 7 tokens each, 2 blocks each
  run(s, s.schedule());  // 7 computed, 8 tokens
  run(s, s.schedule());  // 8 computed, 9 tokens
  // Request 1 needs a third block for its 9th token: request 2 is preempted.
  const step_plan p = s.schedule();
  REQUIRE(p.preempted == std::vector<request_id>{request_id{2}});
  REQUIRE(p.chunks.size() == 1);
  CHECK(p.chunks[0].id == request_id{1});
  const request* r2 = s.find(request_id{2});
  CHECK(r2->num_computed_tokens == 0);
  CHECK(r2->num_tokens() == 9);  // its tokens are kept
  CHECK(r2->state == request_state::waiting);
  CHECK(s.usage().used == 3);
  run(s, p);
  // When request 1 finishes, request 2 comes back and recomputes all 9 tokens.
  s.abort(request_id{1});
  const step_plan q = s.schedule();
  REQUIRE(q.chunks.size() == 1);
  CHECK(q.chunks[0].id == request_id{2});
  CHECK(q.chunks[0].first == 0);
  CHECK(q.chunks[0].count == 9);
  CHECK(q.chunks[0].sample);
}

TEST_CASE("abort releases every block and returns a final output once") {
  scheduler s(small(64), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(10)).has_value());
  run(s, s.schedule());
  CHECK(s.usage().used == 3);
  const auto out = s.abort(request_id{1});
  REQUIRE(out.has_value());
  CHECK(out->finished);
  CHECK(out->reason == finish_reason::aborted);
  CHECK(s.usage().used == 0);
  CHECK_FALSE(s.abort(request_id{1}).has_value());
  CHECK_FALSE(s.has_unfinished());
}

TEST_CASE("stop conditions: EOS, stop tokens, stop strings and max tokens") {
  scheduler s(small(64), test::tok512());
  auto p = prompt_of(3);
  REQUIRE(s.add(request_id{1}, p).has_value());
  auto out = run(s, s.schedule(), test::tok512().eos_id());
  REQUIRE(out.size() == 1);
  CHECK(out[0].finished);
  CHECK(out[0].reason == finish_reason::stop);
  CHECK(out[0].new_tokens.empty());

  auto q = prompt_of(3);
  q.stop_tokens = {333};
  REQUIRE(s.add(request_id{2}, q).has_value());
  out = run(s, s.schedule(), 333);
  CHECK(out[0].reason == finish_reason::stop);

  // "Lily" then " said": the stop string "ly s" cuts the text inside both tokens.
  auto r = prompt_of(3);
  r.stop_strings = {"ly s"};
  REQUIRE(s.add(request_id{3}, r).has_value());
  std::string text;
  for (int32_t t : test::tok512().encode("Lily said hello", false)) {
    out = run(s, s.schedule(), t);
    REQUIRE(out.size() == 1);
    text += out[0].text;
    if (out[0].finished) break;
  }
  CHECK(out[0].finished);
  CHECK(text.find("ly s") == std::string::npos);
  CHECK(text.find("Li") != std::string::npos);

  auto m = prompt_of(3, 300, 2);
  REQUIRE(s.add(request_id{4}, m).has_value());
  run(s, s.schedule());
  out = run(s, s.schedule());
  CHECK(out[0].reason == finish_reason::length);
  CHECK(out[0].num_output_tokens == 2);
  CHECK(s.usage().used == 0);
}

TEST_CASE("bad requests are refused with the reason, and leave nothing queued") {
  scheduler s(small(64, 4), test::tok512());
  CHECK_FALSE(s.add(request_id{1}, request_params{}).has_value());
  auto bad = prompt_of(3);
  bad.prompt[1] = 512;
  auto e = s.add(request_id{1}, bad);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.err().message.find("outside the vocabulary") != std::string::npos);
  auto huge = prompt_of(100);  // needs 26 blocks, the pool has 4
  e = s.add(request_id{1}, huge);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.err().message.find("KV blocks") != std::string::npos);
  auto zero = prompt_of(3);
  zero.max_tokens = 0;
  CHECK_FALSE(s.add(request_id{1}, zero).has_value());
  REQUIRE(s.add(request_id{1}, prompt_of(3)).has_value());
  CHECK_FALSE(s.add(request_id{1}, prompt_of(3)).has_value());  // duplicate id
  CHECK(s.num_waiting() == 1);
}

}  // namespace troupe

namespace troupe {

TEST_CASE("two plans in flight: the second leaves out the first's requests, and results apply in order") {
  scheduler s(small(64), test::tok512());
  for (uint64_t id = 1; id <= 3; ++id) REQUIRE(s.add(request_id{id}, prompt_of(4, 300, 5)).has_value());
  const step_plan a = s.schedule();
  REQUIRE(a.chunks.size() == 3);
  const step_plan b = s.schedule();  // everything is in flight
  CHECK(b.chunks.empty());
  REQUIRE(s.add(request_id{4}, prompt_of(4, 100, 5)).has_value());
  const step_plan c = s.schedule();
  REQUIRE(c.chunks.size() == 1);
  CHECK(c.chunks[0].id == request_id{4});
  std::vector<sample_result> sa(3), sc(1);
  for (auto& x : sa) x.token = 400;
  sc[0].token = 401;
  CHECK(s.update_from_output(a, sa).size() == 3);
  // Requests 1-3 are back; 4 is still in flight.
  const step_plan d = s.schedule();
  REQUIRE(d.chunks.size() == 3);
  for (const auto& ch : d.chunks) CHECK(ch.id != request_id{4});
  CHECK(s.update_from_output(c, sc).size() == 1);
  CHECK(s.find(request_id{4})->num_computed_tokens == 4);
}

TEST_CASE("a request whose steps are lost with the replica every time is doomed, one that progresses is not") {
  scheduler s(small(64), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(8, 300, 5)).has_value());
  auto lose_a_step = [&s] {
    REQUIRE(s.schedule().chunks.size() == 1);
    CHECK(s.reset_kv() == 1);
  };
  for (int32_t i = 1; i < scheduler::max_lost_steps; ++i) lose_a_step();
  CHECK(s.doomed().empty());
  // A step of it comes back: the count starts again.
  CHECK(run(s, s.schedule()).size() == 1);
  for (int32_t i = 1; i < scheduler::max_lost_steps; ++i) lose_a_step();
  CHECK(s.doomed().empty());
  lose_a_step();
  CHECK(s.doomed() == std::vector<request_id>{request_id{1}});
  REQUIRE(s.abort(request_id{1}));
  CHECK(s.doomed().empty());
  // Losses while a request waits, no step of it in flight, are not its steps'.
  scheduler one(small(64, 64, 1), test::tok512());
  REQUIRE(one.add(request_id{1}, prompt_of(8, 300, 5)).has_value());
  REQUIRE(one.add(request_id{2}, prompt_of(8, 100, 5)).has_value());
  for (int32_t i = 0; i < scheduler::max_lost_steps; ++i) {
    const step_plan p = one.schedule();
    REQUIRE(p.chunks.size() == 1);
    CHECK(p.chunks[0].id == request_id{1});
    (void)one.reset_kv();
  }
  CHECK(one.doomed() == std::vector<request_id>{request_id{1}});
}

}  // namespace troupe

namespace troupe {

TEST_CASE("a step lost with the replica takes its drafts with it") {
  scheduler s(small(64), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(6)).has_value());
  CHECK(run(s, s.schedule(), 401).size() == 1);
  request* r = s.find(request_id{1});
  REQUIRE(r != nullptr);
  r->drafts.wanted = 3;
  const step_plan lost = s.schedule();
  REQUIRE(lost.chunks.size() == 1);
  CHECK(lost.chunks[0].num_draft == 3);
  r->drafts.tokens = {402, 403, 404};  // as its proposer filled them
  r->drafts.parents = {-1, 0, 1};
  r->drafts.q.assign(3 * 512, 0.0f);
  CHECK(s.reset_kv() == 1);
  CHECK(r->drafts.tokens.empty());
  CHECK(r->drafts.parents.empty());
  CHECK(r->drafts.q.empty());
  // Computed again from its tokens: a chunk without drafts, whose result applies.
  const step_plan again = s.schedule();
  REQUIRE(again.chunks.size() == 1);
  CHECK(again.chunks[0].num_draft == 0);
  CHECK(run(s, again, 405).size() == 1);
  CHECK(r->num_tokens() == 8);
}

TEST_CASE("KV eviction on a sliding-window model: dead slots go first, each token's window found by position") {
  constexpr int32_t window = 12;
  scheduler_config cfg = small(8);
  cfg.sliding_window = window;
  cfg.eviction = {kv_policy::h2o, 16, -1, 4, 16};
  scheduler s(cfg, test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(30, 300, 60)).has_value());
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mass(0.0f, 1.0f);
  std::vector<int32_t> cache;  // each slot's position, as the plans move them
  int32_t windows = 0, gaps = 0;
  for (int steps = 0; s.has_unfinished() && steps < 200; ++steps) {
    const step_plan plan = s.schedule();
    REQUIRE(plan.chunks.size() == 1);
    const scheduled_chunk& c = plan.chunks[0];
    for (const planned_compaction& m : plan.compactions) {
      const int32_t start = c.first - window + 1;  // the step's first token's window
      const auto live = std::count_if(cache.begin(), cache.end(), [&](int32_t p) { return p >= start; });
      std::vector<int32_t> kept;
      for (int32_t k : m.kept) kept.push_back(cache.at(static_cast<size_t>(k)));
      const auto kept_dead = std::count_if(kept.begin(), kept.end(), [&](int32_t p) { return p < start; });
      CHECK((kept_dead == 0 || kept.size() - kept_dead == static_cast<size_t>(live)));  // the dead go first
      cache = kept;
    }
    REQUIRE(c.first_slot() == static_cast<int32_t>(cache.size()));
    for (int32_t t = 0; t < c.count; ++t) cache.push_back(c.first + t);
    gaps += cache.back() - cache.front() + 1 != static_cast<int32_t>(cache.size());
    for (int32_t t = 0; t < c.count; ++t) {
      // The first slot of a position within token t's window, by a scan.
      int32_t want = 0;
      while (cache[static_cast<size_t>(want)] < c.first + t - window + 1) ++want;
      const int32_t got = c.window_first.empty() ? std::max(0, c.first_slot() + t - window + 1)
                                                 : c.window_first[static_cast<size_t>(t)];
      CHECK(got == want);
      windows += !c.window_first.empty();
    }
    std::vector<float> sums(static_cast<size_t>(plan.attention_sums()));
    for (float& x : sums) x = mass(gen);
    s.observe_attention(plan, sums, 1);
    (void)run(s, plan, 400 + steps % 50);
  }
  CHECK_FALSE(s.has_unfinished());
  CHECK(windows > 0);
  CHECK(gaps > 0);  // (the policy dropped tokens inside the window: slots and positions apart)
}

TEST_CASE("micro-batches: each plan takes its share of the requests") {
  auto cfg = small(64);
  cfg.micro_batches = 2;
  scheduler s(cfg, test::tok512());
  for (uint64_t id = 1; id <= 4; ++id) REQUIRE(s.add(request_id{id}, prompt_of(4, 300, 5)).has_value());
  const step_plan a = s.schedule();
  const step_plan b = s.schedule();
  CHECK(a.chunks.size() == 2);
  CHECK(b.chunks.size() == 2);
  CHECK(s.schedule().chunks.empty());
}

}  // namespace troupe

namespace troupe {

namespace {

// Plans a step of a remote_kv scheduler against block manager `kv`, as a kv manager
// actor would answer; `between` runs while the claims are out.
step_plan plan_remote(scheduler& s, kv_block_manager& kv, const std::function<void()>& between = {},
                      int* exchanges = nullptr) {
  step_draft d = s.begin_step();
  while (auto q = s.next_claims(d)) {
    if (exchanges) ++*exchanges;
    auto g = kv.grant(*q);
    REQUIRE(g.has_value());
    if (between) between();
    s.apply(d, std::move(g).value());
  }
  return s.end_step(d);
}

bool same_plan(const step_plan& a, const step_plan& b) {
  if (a.chunks.size() != b.chunks.size() || a.preempted != b.preempted || a.num_tokens != b.num_tokens) return false;
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    const auto &x = a.chunks[i], &y = b.chunks[i];
    if (x.id != y.id || x.first != y.first || x.count != y.count || x.sample != y.sample ||
        !std::equal(x.block_table.begin(), x.block_table.end(), y.block_table.begin(), y.block_table.end()))
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a block manager elsewhere: the claims exchange plans exactly the steps schedule() plans") {
  // Random prompts sharing prefixes, arrivals, aborts and a pool small enough to preempt.
  auto cfg = small(24, 24, 6);
  scheduler local(cfg, test::tok512());
  cfg.remote_kv = true;
  scheduler remote(cfg, test::tok512());
  kv_block_manager kv(cfg.kv.num_blocks, cfg.kv.block_size, cfg.kv.prefix_caching);
  std::mt19937_64 gen(7);
  auto below = [&](uint64_t n) { return gen() % n; };
  uint64_t next = 1;
  size_t preemptions = 0, steps = 0;
  for (int step = 0; step < 400 && (step < 60 || local.has_unfinished()); ++step) {
    if (step < 60 && below(3) == 0) {
      const auto p = prompt_of(1 + static_cast<int32_t>(below(30)), 300 + static_cast<int32_t>(below(2)) * 50,
                               1 + static_cast<int32_t>(below(20)));
      REQUIRE(local.add(request_id{next}, p).has_value());
      REQUIRE(remote.add(request_id{next}, p).has_value());
      ++next;
    }
    if (below(17) == 0) {
      const request_id victim{1 + below(next)};
      CHECK(local.abort(victim).has_value() == remote.abort(victim).has_value());
    }
    const step_plan a = local.schedule();
    const step_plan b = plan_remote(remote, kv);
    REQUIRE(same_plan(a, b));
    preemptions += a.preempted.size();
    steps += !a.chunks.empty();
    const int32_t t = 300 + static_cast<int32_t>(below(100));
    const auto oa = run(local, a, t), ob = run(remote, b, t);
    REQUIRE(oa.size() == ob.size());
    for (size_t i = 0; i < oa.size(); ++i) CHECK(oa[i].new_tokens == ob[i].new_tokens);
  }
  CHECK_FALSE(remote.has_unfinished());
  CHECK(preemptions > 0);
  CHECK(steps > 50);
  // Every block comes back once the last releases reach the block manager.
  kv_step_request rest;
  rest.releases = remote.take_releases();
  auto g = kv.grant(rest);
  REQUIRE(g.has_value());
  CHECK(g->usage.used == 0);
  CHECK(local.usage().used == 0);
}

TEST_CASE("a request aborted while its claims are out: its grant is dropped and its blocks come back") {
  auto cfg = small(64);
  cfg.remote_kv = true;
  scheduler s(cfg, test::tok512());
  kv_block_manager kv(cfg.kv.num_blocks, cfg.kv.block_size, cfg.kv.prefix_caching);
  REQUIRE(s.add(request_id{1}, prompt_of(9)).has_value());
  REQUIRE(s.add(request_id{2}, prompt_of(5, 100)).has_value());
  const step_plan p = plan_remote(s, kv, [&] { CHECK(s.abort(request_id{1}).has_value()); });
  REQUIRE(p.chunks.size() == 1);
  CHECK(p.chunks[0].id == request_id{2});
  CHECK(kv.usage().used == 5);  // 3 blocks granted to 1 before it was aborted, 2 for 2
  kv_step_request q;
  q.releases = s.take_releases();
  CHECK(q.releases == std::vector<request_id>{request_id{1}});
  REQUIRE(kv.grant(q).has_value());
  CHECK(kv.usage().used == 2);
}

}  // namespace troupe

namespace troupe {

TEST_CASE("decode steps inside the blocks a request holds need no exchange with the block manager") {
  auto cfg = small(64);  // 4-token blocks
  cfg.remote_kv = true;
  scheduler s(cfg, test::tok512());
  kv_block_manager kv(cfg.kv.num_blocks, cfg.kv.block_size, cfg.kv.prefix_caching);
  REQUIRE(s.add(request_id{1}, prompt_of(5, 300, 11)).has_value());
  int exchanges = 0, steps = 0;
  while (s.has_unfinished()) {
    const step_plan p = plan_remote(s, kv, {}, &exchanges);
    REQUIRE(p.chunks.size() == 1);
    ++steps;
    run(s, p);
  }
  // The prefill, then the decode steps at positions 7 and 11 (they fill a block) and 8
  // and 12 (they need a new one); positions 5, 6, 9, 10, 13 and 14 stay inside.
  CHECK(steps == 11);
  CHECK(exchanges == 5);
}

}  // namespace troupe

namespace troupe {

TEST_CASE("draft slots: claimed after the known token, applied as accepted, cut at a stop token") {
  scheduler s(small(64), test::tok512());
  request_params p = prompt_of(6);
  p.stop_tokens = {77};
  REQUIRE(s.add(request_id{1}, p).has_value());
  step_plan plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  CHECK(run(s, plan, 401).size() == 1);  // prefill: 7 known, 6 computed
  request* r = s.find(request_id{1});
  REQUIRE(r != nullptr);

  // Four draft slots: the step computes the known token and four positions after it.
  r->drafts.wanted = 4;
  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  scheduled_chunk& c = plan.chunks[0];
  CHECK(c.first == 6);
  CHECK(c.count == 5);
  CHECK(c.num_draft == 4);
  CHECK(c.tokens.size() == 1);
  CHECK(c.sample);
  CHECK(r->blocks.size() == 3);  // positions 0..10
  // Two drafts accepted, then the correction: three tokens, eight computed.
  std::vector<sample_result> samples(3);
  samples[0].token = 402;
  samples[1].token = 403;
  samples[2].token = 404;
  const std::vector<int32_t> emitted = {3};
  auto outs = s.update_from_output(plan, samples, emitted);
  REQUIRE(outs.size() == 1);
  CHECK(outs[0].new_tokens == std::vector<int32_t>{402, 403, 404});
  CHECK(r->num_tokens() == 10);
  CHECK(r->num_computed_tokens == 9);

  // No drafts this step: the known token alone, in the blocks held.
  r->drafts.wanted = 0;
  plan = s.schedule();
  CHECK(plan.chunks[0].count == 1);
  CHECK(r->blocks.size() == 3);
  CHECK(run(s, plan, 405).size() == 1);  // 11 known, 10 computed

  // A stop token inside an accepted run ends the request there: the drafts after it are
  // dropped.
  r->drafts.wanted = 3;
  plan = s.schedule();
  REQUIRE(plan.chunks[0].num_draft == 3);
  samples.assign(4, sample_result{});
  samples[0].token = 406;
  samples[1].token = 77;
  samples[2].token = 408;
  samples[3].token = 409;
  const std::vector<int32_t> all = {4};
  outs = s.update_from_output(plan, samples, all);
  REQUIRE(outs.size() == 1);
  CHECK(outs[0].new_tokens == std::vector<int32_t>{406});
  CHECK(outs[0].finished);
  CHECK(outs[0].reason == finish_reason::stop);
  CHECK(s.usage().used == 0);
}

TEST_CASE("draft slots never take the step past its budget, nor a prefill chunk") {
  scheduler s(small(4), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(3)).has_value());
  step_plan plan = s.schedule();
  CHECK(run(s, plan).size() == 1);
  request* r = s.find(request_id{1});
  r->drafts.wanted = 8;
  plan = s.schedule();
  CHECK(plan.chunks[0].count == 4);  // the known token and three drafts: the budget
  CHECK(plan.chunks[0].num_draft == 3);
  std::vector<sample_result> one(1);
  (void)s.update_from_output(plan, one, std::vector<int32_t>{1});
  // A waiting request's prompt is never given drafts.
  REQUIRE(s.add(request_id{2}, prompt_of(3)).has_value());
  s.find(request_id{2})->drafts.wanted = 4;
  r->drafts.wanted = 0;
  plan = s.schedule();
  const auto admitted = std::find_if(plan.chunks.begin(), plan.chunks.end(),
                                     [](const scheduled_chunk& c) { return c.id == request_id{2}; });
  REQUIRE(admitted != plan.chunks.end());
  CHECK(admitted->count == 3);
  CHECK(admitted->num_draft == 0);
}

}  // namespace troupe

// The scheduler's side of prefill/decode disaggregation: a prefill-only request (kv_to)
// names its prompt's whole blocks for its decode replica and ends after its first token,
// handed off; a handed-over request (kv_from) loads those blocks instead of computing
// them, or computes them when they have not landed. The shards' side is in
// engine/forward/shard_push_test.cpp, the whole path in tools/disagg_serve_test.sh.
#include <algorithm>

#include <doctest/doctest.h>

#include "engine/sched/scheduler.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

scheduler_config config(size_t tier_blocks) {
  scheduler_config c;
  c.max_step_tokens = 8;  // a 13-token prompt takes two steps
  c.kv.num_blocks = 32;
  c.kv.block_size = 4;
  c.max_running = 8;
  c.context = 256;
  c.vocab = 512;
  c.tier_blocks = tier_blocks;
  return c;
}

request_params prompt_of(int32_t n, int32_t first) {
  request_params p;
  for (int32_t i = 0; i < n; ++i) p.prompt.push_back(first + i);
  p.sampling.temperature = 0.0f;
  p.max_tokens = 8;
  return p;
}

// The 13-token prompt as a prefill replica hands it over: its first token (7) delivered,
// the KV of its three whole blocks sent.
request_params handed_over() {
  request_params q = prompt_of(13, 10);
  q.delivered = {7};
  q.kv_from = 12;
  return q;
}

std::vector<step_output> run(scheduler& s, const step_plan& plan, int32_t token = 7, std::vector<request_id> failed = {}) {
  s.settle_tier_loads(plan, failed);
  std::vector<sample_result> samples(plan.num_samples());
  for (auto& x : samples) x.token = token;
  return s.update_from_output(plan, samples);
}

}  // namespace

TEST_CASE("a prefill-only request sends its prompt's whole blocks as they fill, and hands off after one token") {
  scheduler s(config(0), test::tok512());  // a prefill replica needs no tiers
  request_params p = prompt_of(13, 10);
  p.kv_to = "d0";
  REQUIRE(s.add(request_id{1}, p));

  const step_plan p1 = s.schedule();
  REQUIRE(p1.chunks.size() == 1);
  CHECK(p1.chunks[0].count == 8);
  REQUIRE(p1.kv_pushes.size() == 2);  // the blocks of tokens 0-7
  for (size_t b = 0; b < 2; ++b) {
    CHECK(p1.kv_pushes[b].block == p1.chunks[0].block_table[b]);
    CHECK(p1.kv_pushes[b].to == "d0");
  }
  CHECK(p1.tier_saves.empty());
  CHECK(run(s, p1).empty());

  const step_plan p2 = s.schedule();
  REQUIRE(p2.kv_pushes.size() == 1);  // tokens 8-11; token 12 is no whole block
  CHECK(p2.kv_pushes[0].block == p2.chunks[0].block_table[2]);
  const auto out = run(s, p2);
  REQUIRE(out.size() == 1);
  CHECK(out[0].new_tokens == std::vector<int32_t>{7});
  CHECK(out[0].finished);
  CHECK(out[0].handed_off);
  CHECK(out[0].kv_sent == 12);
  CHECK_FALSE(s.has_unfinished());

  // The keys are the content addresses a decode replica computes for the same prompt.
  scheduler d(config(100), test::tok512());
  request_params q = handed_over();
  REQUIRE(d.add(request_id{2}, q));
  const step_plan dp = d.schedule();
  REQUIRE(dp.tier_loads.size() == 3);
  CHECK(dp.tier_loads[0].key == p1.kv_pushes[0].key);
  CHECK(dp.tier_loads[1].key == p1.kv_pushes[1].key);
  CHECK(dp.tier_loads[2].key == p2.kv_pushes[0].key);
  REQUIRE(dp.chunks.size() == 1);
  // The last prompt token; the delivered one goes alone next, a decode step (with its
  // drafts, where it speculates), as it would have on the prefill replica.
  CHECK(dp.chunks[0].first == 12);
  CHECK(dp.chunks[0].count == 1);
  CHECK_FALSE(dp.chunks[0].sample);
  CHECK(run(d, dp, 9).empty());
  const step_plan dn = d.schedule();
  REQUIRE(dn.chunks.size() == 1);
  CHECK(dn.chunks[0].first == 13);
  CHECK(dn.chunks[0].count == 1);
  const auto dout = run(d, dn, 9);
  REQUIRE(dout.size() == 1);
  CHECK(dout[0].new_tokens == std::vector<int32_t>{9});
  CHECK_FALSE(dout[0].handed_off);
  CHECK(dout[0].num_output_tokens == 2);  // the delivered token counts as output
  CHECK(d.tiers_now().loaded_tokens == 12);
}

TEST_CASE("a first token that ends the request is an ordinary end, not a handoff") {
  scheduler s(config(0), test::tok512());
  request_params p = prompt_of(5, 10);
  p.kv_to = "d0";
  p.max_tokens = 1;
  REQUIRE(s.add(request_id{1}, p));
  const auto out = run(s, s.schedule());
  REQUIRE(out.size() == 1);
  CHECK(out[0].finished);
  CHECK_FALSE(out[0].handed_off);
  CHECK(out[0].reason == finish_reason::length);

  request_params e = prompt_of(5, 10);
  e.kv_to = "d0";
  REQUIRE(s.add(request_id{2}, e));
  const auto eos = run(s, s.schedule(), test::tok512().eos_id());
  REQUIRE(eos.size() == 1);
  CHECK_FALSE(eos[0].handed_off);
  CHECK(eos[0].reason == finish_reason::stop);
}

TEST_CASE("blocks that have not landed fail their loads: the decode replica computes the prompt") {
  scheduler d(config(100), test::tok512());
  request_params q = handed_over();
  REQUIRE(d.add(request_id{1}, q));
  const step_plan p = d.schedule();
  REQUIRE(p.tier_loads.size() == 3);
  CHECK(run(d, p, 9, {request_id{1}}).empty());
  CHECK(d.tiers_now().failed_loads == 1);
  const step_plan again = d.schedule();
  CHECK(again.tier_loads.empty());
  REQUIRE(again.chunks.size() == 1);
  CHECK(again.chunks[0].first == 0);
}

TEST_CASE("a decode replica without tiers computes a handed-over prompt, and bad fields are refused") {
  scheduler d(config(0), test::tok512());
  request_params q = handed_over();
  REQUIRE(d.add(request_id{1}, q));
  const step_plan p = d.schedule();
  CHECK(p.tier_loads.empty());
  CHECK(p.chunks[0].first == 0);

  request_params bad = prompt_of(4, 10);
  bad.kv_from = 5;
  auto r = d.add(request_id{2}, bad);
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("kv_from") != std::string::npos);
  request_params long_name = prompt_of(4, 10);
  long_name.kv_to = std::string(65, 'x');
  CHECK_FALSE(d.add(request_id{3}, long_name));
}

}  // namespace troupe

namespace troupe {

TEST_CASE("a prompt block the prefix cache shares is sent once to each decode replica in a step") {
  scheduler s(config(0), test::tok512());
  request_params first = prompt_of(13, 10);
  first.kv_to = "d0";
  REQUIRE(s.add(request_id{1}, first));
  for (int i = 0; i < 4 && s.has_unfinished(); ++i) run(s, s.schedule());
  REQUIRE_FALSE(s.has_unfinished());
  // Three requests for the cached prompt, admitted in one step.
  for (uint64_t id : {2, 3, 4}) {
    request_params p = prompt_of(13, 10);
    p.kv_to = id == 4 ? "d1" : "d0";
    REQUIRE(s.add(request_id{id}, p));
  }
  const step_plan p = s.schedule();
  REQUIRE(p.chunks.size() == 3);
  std::vector<std::pair<uint32_t, std::string>> sent;
  for (const tier_move& m : p.kv_pushes) sent.emplace_back(m.block.value, m.to);
  std::sort(sent.begin(), sent.end());
  CHECK(std::adjacent_find(sent.begin(), sent.end()) == sent.end());
  CHECK(std::count_if(sent.begin(), sent.end(), [](const auto& x) { return x.second == "d0"; }) == 3);
  CHECK(std::count_if(sent.begin(), sent.end(), [](const auto& x) { return x.second == "d1"; }) == 3);
  // Every one of them is told its prompt's KV went, whoever's push carried the block.
  const auto out = run(s, p);
  REQUIRE(out.size() == 3);
  for (const step_output& o : out) {
    CHECK(o.handed_off);
    CHECK(o.kv_sent == 12);
  }
}

TEST_CASE("an evicting prefill-only request sends the blocks it filled before its first compaction") {
  scheduler s(config(0), test::tok512());
  request_params p = prompt_of(30, 10);
  p.kv_to = "d0";
  p.eviction = kv_eviction_config{.policy = kv_policy::streaming, .budget = 12};
  REQUIRE(s.add(request_id{1}, p));
  std::vector<step_output> outs;
  int32_t pushed = 0;
  for (int i = 0; i < 20 && s.has_unfinished(); ++i) {
    const step_plan plan = s.schedule();
    // A plan that compacts the request sends none of its blocks (they hold slots now).
    if (!plan.compactions.empty()) CHECK(plan.kv_pushes.empty());
    pushed += static_cast<int32_t>(plan.kv_pushes.size());
    for (step_output& o : run(s, plan)) outs.push_back(std::move(o));
  }
  REQUIRE_FALSE(s.has_unfinished());
  REQUIRE(outs.size() == 1);
  CHECK(outs[0].handed_off);
  // Its first chunk (8 tokens, the step's most) filled two blocks; the 22 tokens left do
  // not fit its budget beside them, so every later chunk followed a compaction. The decode
  // replica is told of those 8 tokens only.
  CHECK(pushed == 2);
  CHECK(outs[0].kv_sent == 8);
}

TEST_CASE("an evicting handed-over request loads the sent blocks within its first chunk, as a prefix hit") {
  scheduler s(config(64), test::tok512());
  request_params q = prompt_of(30, 10);
  q.delivered = {7};
  q.kv_from = 12;
  q.eviction = kv_eviction_config{.policy = kv_policy::streaming, .budget = 12};
  REQUIRE(s.add(request_id{1}, q));
  const step_plan p = s.schedule();
  REQUIRE(p.chunks.size() == 1);
  // Its first chunk ends at 8 (the step's most) and leaves its last token to compute: one
  // block loaded, the next four tokens computed.
  CHECK(p.tier_loads.size() == 1);
  CHECK(p.chunks[0].first == 4);
  CHECK(p.chunks[0].count == 4);
}

TEST_CASE("an evicting request computes output it was given one token a step, as when it was generated") {
  scheduler s(config(0), test::tok512());
  // Moved off a failed replica with five tokens delivered (or handed over with one): its
  // prompt in chunks as ever, then each delivered token alone, as the first attempt
  // computed them; so its policy sees what it saw there.
  request_params q = prompt_of(13, 10);
  q.delivered = {7, 7, 7, 7, 7};
  q.eviction = kv_eviction_config{.policy = kv_policy::h2o, .budget = 64};
  REQUIRE(s.add(request_id{1}, q));
  std::vector<int32_t> counts;
  for (int i = 0; i < 7; ++i) {
    const step_plan p = s.schedule();
    REQUIRE(p.chunks.size() == 1);
    counts.push_back(p.chunks[0].count);
    run(s, p);
  }
  CHECK(counts == std::vector<int32_t>{8, 5, 1, 1, 1, 1, 1});
}

}  // namespace troupe

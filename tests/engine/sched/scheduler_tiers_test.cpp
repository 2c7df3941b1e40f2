// The scheduler with KV tiers below its pool: which blocks its plans copy down and load
// back, and what a failed load costs. The shards' side is in engine/kv/kv_tiers_test.cpp
// and engine/serve/llm_engine_tiers_test.cpp.
#include <algorithm>

#include <doctest/doctest.h>

#include "engine/sched/scheduler.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

scheduler_config tiered(uint32_t blocks) {
  scheduler_config c;
  c.max_step_tokens = 64;
  c.kv.num_blocks = blocks;
  c.kv.block_size = 4;
  c.max_running = 8;
  c.context = 256;
  c.vocab = 512;
  c.tier_blocks = 1000;
  return c;
}

request_params prompt_of(int32_t n, int32_t first, uint64_t ns = 0) {
  request_params p;
  for (int32_t i = 0; i < n; ++i) p.prompt.push_back(first + i);
  p.sampling.temperature = 0.0f;
  p.max_tokens = 1;
  p.cache_namespace = ns;
  return p;
}

std::vector<step_output> run(scheduler& s, const step_plan& plan, std::vector<request_id> failed = {}) {
  s.settle_tier_loads(plan, failed);
  std::vector<sample_result> samples(plan.num_samples());
  for (auto& x : samples) x.token = 7;
  return s.update_from_output(plan, samples);
}

// Runs requests to the end, one plan at a time.
void drain(scheduler& s) {
  for (int i = 0; i < 100 && s.has_unfinished(); ++i) run(s, s.schedule());
  REQUIRE_FALSE(s.has_unfinished());
}

std::vector<uint32_t> blocks_of(const std::vector<tier_move>& moves, request_id id) {
  std::vector<uint32_t> out;
  for (const tier_move& m : moves)
    if (m.id == id) out.push_back(m.block.value);
  return out;
}

// Pushes every cached block out of a pool of `blocks` with prompts of other tokens.
void churn(scheduler& s, uint32_t blocks, uint64_t first_id) {
  for (uint64_t k = 0; k < 3; ++k)
    REQUIRE(s.add(request_id{first_id + k}, prompt_of(static_cast<int32_t>(blocks) * 4 - 8, 200 + 50 * static_cast<int32_t>(k))));
  drain(s);
}

// Request 1 computes a 13-token prompt (three whole blocks go to the tiers), then other
// prompts push it out of a pool of `blocks`.
void computed_then_lost(scheduler& s, uint32_t blocks) {
  REQUIRE(s.add(request_id{1}, prompt_of(13, 10)));
  drain(s);
  churn(s, blocks, 10);
}

}  // namespace

TEST_CASE("blocks a prompt fills are copied down once, and loaded back when the pool lost them") {
  scheduler s(tiered(8), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(13, 10)));
  const step_plan p1 = s.schedule();
  REQUIRE(p1.chunks.size() == 1);
  CHECK(p1.tier_loads.empty());
  // Three full blocks of prompt: each copied down after the step that fills it.
  CHECK(blocks_of(p1.tier_saves, request_id{1}) ==
        std::vector<uint32_t>{p1.chunks[0].block_table[0].value, p1.chunks[0].block_table[1].value,
                              p1.chunks[0].block_table[2].value});
  run(s, p1);
  CHECK(s.tiers_now().saved_blocks == 3);

  churn(s, 8, 10);
  // The same prompt again: the pool has none of it, the tiers have three blocks.
  REQUIRE(s.add(request_id{2}, prompt_of(13, 10)));
  const step_plan p2 = s.schedule();
  REQUIRE(p2.chunks.size() == 1);
  CHECK(p2.chunks[0].first == 12);
  CHECK(p2.chunks[0].count == 1);
  REQUIRE(p2.tier_loads.size() == 3);
  for (size_t b = 0; b < 3; ++b) {
    CHECK(p2.tier_loads[b].block == p2.chunks[0].block_table[b]);
    CHECK(p2.tier_loads[b].key == p1.tier_saves[b].key);
  }
  CHECK(p2.tier_saves.empty());  // nothing new to copy down
  const auto out = run(s, p2);
  REQUIRE(out.size() == 1);
  CHECK(out[0].num_cached_prompt_tokens == 12);
  CHECK(s.tiers_now().loaded_tokens == 12);
}

TEST_CASE("a failed load drops the step's output and computes the request again") {
  scheduler s(tiered(8), test::tok512());
  computed_then_lost(s, 8);
  REQUIRE(s.add(request_id{2}, prompt_of(13, 10)));
  const step_plan p = s.schedule();
  REQUIRE(p.tier_loads.size() == 3);
  CHECK(run(s, p, {request_id{2}}).empty());  // nothing from garbage
  const request* r = s.find(request_id{2});
  REQUIRE(r);
  CHECK(r->state == request_state::waiting);
  CHECK(s.tiers_now().failed_loads == 1);
  CHECK(s.tiers_now().loaded_tokens == 0);  // none of them landed
  // The directory forgot those blocks: the request computes its whole prompt, copying its
  // blocks down again.
  const step_plan again = s.schedule();
  REQUIRE(again.chunks.size() == 1);
  CHECK(again.chunks[0].first == 0);
  CHECK(again.chunks[0].count == 13);
  CHECK(again.tier_loads.empty());
  CHECK(again.tier_saves.size() == 3);
  const auto out = run(s, again);
  REQUIRE(out.size() == 1);
  CHECK(out[0].finished);
  CHECK(out[0].num_cached_prompt_tokens == 0);
  CHECK(out[0].new_tokens == std::vector<int32_t>{7});
}

TEST_CASE("loaded blocks join the prefix cache only once their loads have landed") {
  scheduler s(tiered(16), test::tok512());
  computed_then_lost(s, 16);
  request_params longer = prompt_of(13, 10);
  longer.max_tokens = 8;
  REQUIRE(s.add(request_id{2}, longer));
  const step_plan p = s.schedule();
  REQUIRE(p.tier_loads.size() == 3);
  // Admitted in the step after the loads went out, before they came back: no pool hit
  // on blocks that may yet turn out garbage (it loads its own).
  REQUIRE(s.add(request_id{3}, prompt_of(13, 10)));
  const step_plan q = s.schedule();
  CHECK(blocks_of(q.tier_loads, request_id{3}).size() == 3);
  run(s, p);
  run(s, q);
  // Request 2's next claim says its loads landed; from then on its blocks are cached.
  run(s, s.schedule());
  REQUIRE(s.add(request_id{4}, prompt_of(13, 10)));
  const step_plan h = s.schedule();
  const auto it = std::find_if(h.chunks.begin(), h.chunks.end(), [](const scheduled_chunk& c) { return c.id == request_id{4}; });
  REQUIRE(it != h.chunks.end());
  CHECK(it->first == 12);
  CHECK(blocks_of(h.tier_loads, request_id{4}).empty());  // a pool hit
}

TEST_CASE("one namespace's blocks in the tiers are never another's") {
  scheduler s(tiered(8), test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(13, 10, 111)));
  drain(s);
  churn(s, 8, 10);
  REQUIRE(s.add(request_id{2}, prompt_of(13, 10, 222)));
  const step_plan p = s.schedule();
  CHECK(p.tier_loads.empty());
  CHECK(p.chunks[0].first == 0);
  run(s, p);
  REQUIRE(s.add(request_id{3}, prompt_of(13, 10, 111)));
  churn(s, 8, 20);
  REQUIRE(s.add(request_id{4}, prompt_of(13, 10, 111)));
  CHECK(s.schedule().tier_loads.size() == 3);
}

TEST_CASE("a request that must wait has its blocks prefetched once, while other plans run") {
  scheduler_config c = tiered(8);
  c.tier_prefetch = true;
  c.max_running = 1;
  scheduler s(c, test::tok512());
  computed_then_lost(s, 8);
  request_params longer = prompt_of(9, 300);
  longer.max_tokens = 4;
  REQUIRE(s.add(request_id{2}, longer));
  REQUIRE(s.add(request_id{3}, prompt_of(13, 10)));  // behind request 2: max_running is 1
  const step_plan p = s.schedule();
  REQUIRE(p.chunks.size() == 1);
  CHECK(p.chunks[0].id == request_id{2});
  // Request 3's three blocks, for the shards to read up while request 2 runs.
  REQUIRE(p.tier_prefetch.size() == 3);
  CHECK(p.tier_prefetch[0] == tier_key::root(0).chain(std::span<const int32_t>(s.find(request_id{3})->tokens).first(4)));
  run(s, p);
  CHECK(s.schedule().tier_prefetch.empty());  // once
}

TEST_CASE("an evicting request's blocks go down until its first compaction, and come back within its first chunk") {
  scheduler s(tiered(16), test::tok512());
  request_params p = prompt_of(40, 10);
  p.eviction = kv_eviction_config{.policy = kv_policy::streaming, .budget = 16};
  REQUIRE(s.add(request_id{1}, p));
  // Its first chunk ends at its budget: four whole blocks of positions, copied down.
  const step_plan first = s.schedule();
  REQUIRE(first.chunks.size() == 1);
  CHECK(first.chunks[0].count == 16);
  CHECK(blocks_of(first.tier_saves, request_id{1}).size() == 4);
  run(s, first);
  // From its first compaction on its blocks hold slots, not the positions a key names:
  // nothing more goes down.
  bool compacted = false;
  for (int i = 0; i < 100 && s.has_unfinished(); ++i) {
    const step_plan plan = s.schedule();
    compacted = compacted || !plan.compactions.empty();
    CHECK(plan.tier_saves.empty());
    run(s, plan);
  }
  CHECK(compacted);
  CHECK(s.tiers_now().saved_blocks == 4);

  churn(s, 16, 10);
  // The same prompt, evicting alike: its first chunk again ends at 16, and of it the tiers
  // give what a prefix hit would (all but its last hit_margin tokens, in whole blocks).
  REQUIRE(s.add(request_id{2}, p));
  const step_plan again = s.schedule();
  REQUIRE(again.chunks.size() == 1);
  CHECK(again.tier_loads.size() == 3);
  CHECK(again.chunks[0].first == 12);
  CHECK(again.chunks[0].count == 4);
  run(s, again);
  CHECK(s.tiers_now().loaded_tokens == 12);

  // H2O reads the attention of its chunk's last 32 tokens: with a budget of 16, the whole
  // chunk is computed, and nothing is loaded.
  churn(s, 16, 20);
  p.eviction = kv_eviction_config{.policy = kv_policy::h2o, .budget = 16};
  REQUIRE(s.add(request_id{3}, p));
  const step_plan h2o = s.schedule();
  REQUIRE(h2o.chunks.size() == 1);
  CHECK(h2o.tier_loads.empty());
  CHECK(h2o.chunks[0].first == 0);
  CHECK(h2o.chunks[0].count == 16);
}

TEST_CASE("without tiers, plans carry no copies") {
  scheduler_config c = tiered(8);
  c.tier_blocks = 0;
  scheduler s(c, test::tok512());
  REQUIRE(s.add(request_id{1}, prompt_of(13, 10)));
  const step_plan p = s.schedule();
  CHECK(p.tier_saves.empty());
  CHECK(p.tier_loads.empty());
  CHECK(p.tier_prefetch.empty());
}

}  // namespace troupe

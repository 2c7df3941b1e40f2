#include "engine/kv/kv_block_manager.hpp"

#include <numeric>

#include <doctest/doctest.h>

#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

// Block size 4 keeps the numbers small.
constexpr int32_t bs = 4;

std::vector<int32_t> seq(int32_t first, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<uint32_t> table(const kv_block_manager& m, uint64_t id) {
  return test::block_values(m.block_table(request_id{id}));
}

std::vector<uint32_t> ids(const std::vector<block_id>& v) { return test::block_values(v); }

}  // namespace

TEST_CASE("a full prefix hit reuses the same blocks and shares them by reference count") {
  kv_block_manager m(8, bs, true);
  const auto prompt = seq(100, 10);  // two full blocks and two tokens
  CHECK(m.match_prefix(prompt, 0).empty());
  REQUIRE(m.allocate(request_id{1}, prompt, 10, {}, 0));
  CHECK(table(m, 1) == std::vector<uint32_t>{0, 1, 2});
  CHECK(m.usage().cached == 2);  // the partial third block is not cached

  // Same prompt: both full blocks hit (the last token is always computed).
  const auto hits = m.match_prefix(prompt, 0);
  CHECK(ids(hits) == std::vector<uint32_t>{0, 1});
  REQUIRE(m.allocate(request_id{2}, prompt, 10, hits, 0));
  CHECK(table(m, 2) == std::vector<uint32_t>{0, 1, 3});
  CHECK(m.pool().ref_count(block_id{0}) == 2);
  CHECK(m.pool().ref_count(block_id{1}) == 2);
  CHECK(m.pool().ref_count(block_id{2}) == 1);
  CHECK(m.pool().ref_count(block_id{3}) == 1);
  CHECK(m.usage().hit_tokens == 8);

  // A prompt of exactly two blocks hits only the first: its last token must be computed.
  CHECK(ids(m.match_prefix(seq(100, 8), 0)) == std::vector<uint32_t>{0});
}

TEST_CASE("a partial hit stops at the first block that differs") {
  kv_block_manager m(8, bs, true);
  REQUIRE(m.allocate(request_id{1}, seq(0, 12), 12, {}, 0));  // blocks 0 1 2, all full
  auto other = seq(0, 12);
  other[5] = 999;  // second block differs
  CHECK(ids(m.match_prefix(other, 0)) == std::vector<uint32_t>{0});
  auto third = seq(0, 13);
  CHECK(ids(m.match_prefix(third, 0)) == std::vector<uint32_t>{0, 1, 2});
  // The same tokens at another start do not match (hashes chain on the parent).
  auto shifted = seq(4, 8);
  CHECK(m.match_prefix(shifted, 0).empty());
}

TEST_CASE("released blocks stay cached, and eviction takes the least recently freed, tails first") {
  kv_block_manager m(6, bs, true);
  REQUIRE(m.allocate(request_id{1}, seq(0, 8), 8, {}, 0));   // blocks 0 1
  REQUIRE(m.allocate(request_id{2}, seq(50, 8), 8, {}, 0));  // blocks 2 3
  m.free(request_id{1});  // free list: 4 5 1 0 (last block first)
  m.free(request_id{2});  // free list: 4 5 1 0 3 2
  CHECK(ids(m.pool().free_order()) == std::vector<uint32_t>{4, 5, 1, 0, 3, 2});
  CHECK(m.usage().cached == 4);
  CHECK(m.usage().used == 0);

  // Both prefixes still hit.
  CHECK(ids(m.match_prefix(seq(0, 9), 0)) == std::vector<uint32_t>{0, 1});
  // Pressure: a new request of 16 tokens takes 4 blocks: 4, 5, then evicts 1 and 0.
  REQUIRE(m.allocate(request_id{3}, seq(200, 16), 16, {}, 0));
  CHECK(table(m, 3) == std::vector<uint32_t>{4, 5, 1, 0});
  CHECK(m.match_prefix(seq(0, 9), 0).empty());                              // evicted
  CHECK(ids(m.match_prefix(seq(50, 9), 0)) == std::vector<uint32_t>{2, 3});  // survived
  CHECK(ids(m.pool().free_order()) == std::vector<uint32_t>{3, 2});
  // A hit on free blocks takes them back; nothing else is free, so a request needing
  // one more block than that fails and changes nothing.
  const auto hits = m.match_prefix(seq(50, 9), 0);
  CHECK_FALSE(m.allocate(request_id{4}, seq(50, 9), 9, hits, 0));
  CHECK(m.pool().num_free() == 2);
  CHECK(m.block_table(request_id{4}).empty());
  REQUIRE(m.allocate(request_id{4}, seq(50, 8), 8, std::vector<block_id>(hits.begin(), hits.begin() + 2), 0));
  CHECK(table(m, 4) == std::vector<uint32_t>{2, 3});
  CHECK(m.pool().num_free() == 0);
}

TEST_CASE("namespaces isolate tenants: the same tokens never match across them") {
  kv_block_manager m(8, bs, true);
  REQUIRE(m.allocate(request_id{1}, seq(0, 9), 9, {}, 7));
  CHECK(ids(m.match_prefix(seq(0, 9), 7)) == std::vector<uint32_t>{0, 1});
  CHECK(m.match_prefix(seq(0, 9), 8).empty());
  CHECK(m.match_prefix(seq(0, 9), 0).empty());
  // Tenant 8 computes its own copy in new blocks.
  REQUIRE(m.allocate(request_id{2}, seq(0, 9), 9, {}, 8));
  CHECK(table(m, 2) == std::vector<uint32_t>{3, 4, 5});
  CHECK(ids(m.match_prefix(seq(0, 9), 8)) == std::vector<uint32_t>{3, 4});
}

TEST_CASE("blocks are cached as they fill, and caching can be turned off") {
  kv_block_manager m(8, bs, true);
  const auto prompt = seq(0, 12);
  REQUIRE(m.allocate(request_id{1}, prompt, 3, {}, 0));  // a partial first block
  CHECK(m.usage().cached == 0);
  REQUIRE(m.allocate(request_id{1}, prompt, 9, {}, 0));  // now two full blocks
  CHECK(m.usage().cached == 2);
  CHECK(table(m, 1) == std::vector<uint32_t>{0, 1, 2});
  kv_block_manager off(8, bs, false);
  REQUIRE(off.allocate(request_id{1}, prompt, 12, {}, 0));
  CHECK(off.usage().cached == 0);
  CHECK(off.match_prefix(prompt, 0).empty());
}

TEST_CASE("grant: claims are granted in order within the budget, and the first that does not fit stops it") {
  kv_block_manager m(6, bs, true);
  const auto a = seq(0, 10), b = seq(50, 9), c = seq(80, 12);
  kv_step_request q;
  q.budget = 16;
  q.claims = {{request_id{1}, true, 0, 0, 0, a}, {request_id{2}, true, 0, 0, 0, b}, {request_id{3}, true, 0, 0, 0, c}};
  auto g = m.grant(q);
  REQUIRE(g.has_value());
  // 10 tokens for 1 (3 blocks), the 6 left of the budget for 2 (2 blocks); 3 is not reached.
  REQUIRE(g->grants.size() == 2);
  CHECK_FALSE(g->short_of_blocks);
  CHECK(g->grants[0].first == 0);
  CHECK(g->grants[0].count == 10);
  CHECK(ids(g->grants[0].added) == std::vector<uint32_t>{0, 1, 2});
  CHECK(g->grants[1].count == 6);
  CHECK(ids(g->grants[1].added) == std::vector<uint32_t>{3, 4});
  CHECK(g->usage.used == 5);

  // Request 2 goes on (3 tokens, its third block), then 3 wants 3 blocks of the 1 left.
  q.budget = 64;
  q.claims = {{request_id{2}, false, 6, 2, 0, b}, {request_id{3}, true, 0, 0, 0, c}};
  g = m.grant(q);
  REQUIRE(g.has_value());
  REQUIRE(g->grants.size() == 1);
  CHECK(g->grants[0].first == 6);
  CHECK(g->grants[0].count == 3);
  CHECK(ids(g->grants[0].added) == std::vector<uint32_t>{5});  // appended to 3, 4
  CHECK(g->short_of_blocks);
  CHECK_FALSE(m.holds(request_id{3}));

  // Releases go first: with 1 released, 3 fits, and an admission of a's tokens hits
  // the two full blocks 1 cached.
  q.releases = {request_id{1}};
  q.claims = {{request_id{3}, true, 0, 0, 0, c}};
  g = m.grant(q);
  REQUIRE(g.has_value());
  REQUIRE(g->grants.size() == 1);
  CHECK(ids(g->grants[0].added) == std::vector<uint32_t>{2, 1, 0});  // least recently freed first
  q.releases = {request_id{3}};
  q.claims = {{request_id{4}, true, 0, 0, 0, a}};
  g = m.grant(q);
  REQUIRE(g.has_value());
  REQUIRE(g->grants.size() == 1);
  CHECK(g->grants[0].first == 0);  // 3 evicted a's cached blocks when it took them
  CHECK(g->usage.hit_tokens == 0);
}

TEST_CASE("grant: a prefix hit counts as computed and claims that contradict the holdings are errors") {
  kv_block_manager m(8, bs, true);
  const auto a = seq(0, 10);
  kv_step_request q;
  q.budget = 64;
  q.claims = {{request_id{1}, true, 0, 0, 0, a}};
  REQUIRE(m.grant(q).has_value());
  q.claims = {{request_id{2}, true, 0, 0, 0, a}};
  auto g = m.grant(q);
  REQUIRE(g.has_value());
  CHECK(g->grants[0].first == 8);
  CHECK(g->grants[0].count == 2);
  CHECK(ids(g->grants[0].added) == std::vector<uint32_t>{0, 1, 3});
  CHECK(g->usage.hit_tokens == 8);

  q.claims = {{request_id{1}, true, 0, 0, 0, a}};  // admitted twice
  CHECK_FALSE(m.grant(q).has_value());
  q.claims = {{request_id{9}, false, 4, 1, 0, a}};  // running, holding nothing
  CHECK_FALSE(m.grant(q).has_value());
  q.claims = {{request_id{1}, false, 10, 3, 0, a}};  // nothing left to compute
  CHECK_FALSE(m.grant(q).has_value());
  q.claims = {{request_id{1}, false, 8, 2, 0, a}};  // it holds 3 blocks, not 2
  CHECK_FALSE(m.grant(q).has_value());
  q.claims = {{request_id{1}, false, 8, 3, 0, a}};  // as it stands: granted
  CHECK(m.grant(q).has_value());
}

}  // namespace troupe

namespace troupe {

TEST_CASE("draft positions get blocks that are never cached, and rejected drafts give whole blocks back") {
  kv_block_manager m(8, bs, true);
  std::vector<int32_t> tokens = seq(100, 6);
  kv_step_request q;
  q.budget = 64;
  q.claims.push_back(kv_claim{request_id{1}, true, 0, 0, 0, tokens});
  auto g = m.grant(q);
  REQUIRE(g.has_value());
  REQUIRE(g->grants.size() == 1);
  CHECK(g->grants[0].count == 6);
  CHECK(table(m, 1) == std::vector<uint32_t>{0, 1});
  tokens.push_back(106);  // the sampled token: 7 known, 6 computed

  // A decode step with 5 drafts: positions 6..11, blocks to 12 positions (3 blocks). The
  // second block holds known tokens 4..6 and draft positions: it must not be cached.
  q.claims = {kv_claim{request_id{1}, false, 6, 2, 0, tokens, 5}};
  g = m.grant(q);
  REQUIRE(g.has_value());
  CHECK(g->grants[0].first == 6);
  CHECK(g->grants[0].count == 6);
  CHECK(g->grants[0].dropped == 0);
  CHECK(ids(g->grants[0].added) == std::vector<uint32_t>{2});
  CHECK(m.usage().cached == 1);  // the first block only: 100..103
  CHECK(m.match_prefix(seq(100, 12), 0).size() == 1);

  // One draft accepted: tokens 0..7 known, 8 computed (the correction is token 8). The
  // next step has no drafts: 9 positions need 3 blocks; with 1 draft, still 3.
  tokens.push_back(107);
  tokens.push_back(108);
  q.claims = {kv_claim{request_id{1}, false, 8, 3, 0, tokens, 0}};
  g = m.grant(q);
  REQUIRE(g.has_value());
  CHECK(g->grants[0].count == 1);
  CHECK(g->grants[0].dropped == 0);
  CHECK(m.usage().cached == 2);  // 104..107 are known now, and cached

  // Another request drafts 8 after 3 known tokens (3 blocks), then every draft is
  // rejected: 4 known, 3 computed, nothing drafted next: 4 positions, 1 block.
  kv_step_request r;
  r.budget = 64;
  std::vector<int32_t> other = seq(500, 2);
  r.claims.push_back(kv_claim{request_id{2}, true, 0, 0, 0, other});
  REQUIRE(m.grant(r).has_value());
  other.push_back(502);
  r.claims = {kv_claim{request_id{2}, false, 2, 1, 0, other, 8}};  // 11 positions: 3 blocks
  g = m.grant(r);
  REQUIRE(g.has_value());
  CHECK(m.block_table(request_id{2}).size() == 3);
  const uint32_t free_before = m.num_free_blocks();
  other.push_back(503);
  r.claims = {kv_claim{request_id{2}, false, 3, 3, 0, other, 0}};
  g = m.grant(r);
  REQUIRE(g.has_value());
  CHECK(g->grants[0].dropped == 2);
  CHECK(g->grants[0].added.empty());
  CHECK(m.block_table(request_id{2}).size() == 1);
  CHECK(m.num_free_blocks() == free_before + 2);
  // A negative draft count is refused.
  r.claims = {kv_claim{request_id{2}, false, 3, 1, 0, other, -1}};
  CHECK(!m.grant(r).has_value());
}

}  // namespace troupe

namespace troupe {

TEST_CASE("an evicting request takes prefix hits below its budget, and copies the shared blocks its compaction writes") {
  kv_block_manager m(12, bs, true);
  const auto prompt = seq(100, 14);  // three full blocks and two tokens
  kv_step_request q;
  q.budget = 64;
  q.claims = {{request_id{1}, true, 0, 0, 0, prompt}};
  REQUIRE(m.grant(q).has_value());
  CHECK(table(m, 1) == std::vector<uint32_t>{0, 1, 2, 3});

  // Request 2 evicts within 12 slots: hits leave it room (two blocks of three).
  kv_claim admit{request_id{2}, true, 0, 0, 0, prompt};
  admit.kv_budget = 12;
  q.claims = {admit};
  auto g = m.grant(q);
  REQUIRE(g.has_value());
  CHECK(g->grants[0].first == 8);
  CHECK(g->grants[0].count == 4);  // slots 8..11: the budget
  CHECK(table(m, 2) == std::vector<uint32_t>{0, 1, 4});

  // Its compaction keeps slots {0, 1, 6, 9, 10, 11}, rewriting from slot 2 on: block 0 (and
  // block 1, the step's token goes to slot 6) are shared with request 1, so it gets its own
  // copies; block 2 is its own already. Its blocks from the first copy on come back.
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(7);
  kv_claim run{request_id{2}, false, 12, 3, 0, tokens};
  run.kv_budget = 12;
  run.evicted = 6;  // 12 computed, 6 slots kept
  run.rewrite_from = 2;
  q.claims = {run};
  g = m.grant(q);
  REQUIRE_MESSAGE(g.has_value(), (g ? "" : g.err().message));
  REQUIRE(g->grants.size() == 1);
  CHECK(g->grants[0].first == 12);
  CHECK(g->grants[0].count == 3);  // (the last of three prompt tokens samples)
  CHECK(g->grants[0].dropped == 3);
  const auto own = table(m, 2);
  REQUIRE(own.size() == 3);
  CHECK(own[0] != 0);
  CHECK(own[1] != 1);
  CHECK(own[2] == 4);
  CHECK(ids(g->grants[0].added) == own);
  // Request 1's blocks are as they were, and still the cached prefix.
  CHECK(table(m, 1) == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(m.pool().ref_count(block_id{0}) == 1);
  CHECK(ids(m.match_prefix(prompt, 0)) == std::vector<uint32_t>{0, 1, 2});

  // A cached prefix only the evicting request holds is copied too, and stays cached: its
  // old block is held until the next grant (the compaction reads it first), then free.
  kv_block_manager alone(12, bs, true);
  q.claims = {{request_id{1}, true, 0, 0, 0, prompt}};
  REQUIRE(alone.grant(q).has_value());
  q.releases = {request_id{1}};
  q.claims = {admit};
  REQUIRE(alone.grant(q).has_value());
  q.releases.clear();
  CHECK(table(alone, 2) == std::vector<uint32_t>{0, 1, 4});
  const uint32_t free_before = alone.num_free_blocks();
  q.claims = {run};
  g = alone.grant(q);
  REQUIRE(g.has_value());
  REQUIRE(g->grants.size() == 1);
  CHECK(table(alone, 2)[0] != 0);
  CHECK(table(alone, 2)[1] != 1);
  CHECK(alone.num_free_blocks() == free_before - 2);  // the copies; 0 and 1 held still
  CHECK(alone.pool().ref_count(block_id{0}) == 1);
  q.claims.clear();
  REQUIRE(alone.grant(q).has_value());  // the next step's
  CHECK(alone.pool().ref_count(block_id{0}) == 0);
  CHECK(ids(alone.match_prefix(prompt, 0)) == std::vector<uint32_t>{0, 1, 2});

  // Copies need free blocks: with none left, the claim waits (nothing changes).
  kv_block_manager tight(5, bs, true);
  q.claims = {{request_id{1}, true, 0, 0, 0, prompt}};
  REQUIRE(tight.grant(q).has_value());
  q.claims = {admit};
  REQUIRE(tight.grant(q).has_value());
  CHECK(tight.num_free_blocks() == 0);
  q.claims = {run};
  g = tight.grant(q);
  REQUIRE(g.has_value());
  CHECK(g->grants.empty());
  CHECK(g->short_of_blocks);
  CHECK(table(tight, 2) == std::vector<uint32_t>{0, 1, 4});

  // A compaction past what the request holds is refused.
  run.rewrite_from = 7;
  q.claims = {run};
  CHECK_FALSE(m.grant(q).has_value());
}

TEST_CASE("an evicting admission's hit stops short of its first chunk's end by its margin, and its chunks end at "
          "the chunk limit, hit or not") {
  const auto prompt = seq(100, 30);  // seven full blocks and two tokens
  kv_block_manager m(64, bs, true);
  kv_step_request q;
  q.budget = 64;
  q.claims = {{request_id{1}, true, 0, 0, 0, prompt}};
  REQUIRE(m.grant(q).has_value());
  REQUIRE(m.match_prefix(prompt, 0).size() == 7);

  struct sample {
    int32_t budget, chunk_limit, margin, first, count;
  };
  // The first chunk ends at the budget or the chunk limit (the prompt is longer); the hit
  // covers whole blocks up to that end less the margin, and the grant runs to the end.
  const sample samples[] = {
      {20, 0, 6, 12, 8},   // ends at 20; hit <= 14: three blocks
      {20, 0, 1, 16, 4},   // a margin of one: four blocks, the 20th token computed
      {20, 0, 0, 16, 4},   // no margin is a margin of one
      {20, 10, 6, 4, 6},   // ends at 10; hit <= 4: one block
      {20, 10, 12, 0, 10}, // a margin past the chunk: no hit
      {40, 64, 6, 24, 6},  // ends at the prompt (30); hit <= 24: six blocks
  };
  uint64_t id = 10;
  for (const sample& s : samples) {
    CAPTURE(s.budget);
    CAPTURE(s.chunk_limit);
    CAPTURE(s.margin);
    kv_claim c{request_id{++id}, true, 0, 0, 0, prompt};
    c.kv_budget = s.budget;
    c.chunk_limit = s.chunk_limit;
    c.hit_margin = s.margin;
    q.claims = {c};
    const auto g = m.grant(q);
    REQUIRE(g.has_value());
    REQUIRE(g->grants.size() == 1);
    CHECK(g->grants[0].first == s.first);
    CHECK(g->grants[0].count == s.count);
  }

  // Without a hit the chunks are the same: the first ends at 10, the next is 10 more.
  kv_block_manager cold(64, bs, true);
  kv_claim c{request_id{2}, true, 0, 0, 0, prompt};
  c.kv_budget = 20;
  c.chunk_limit = 10;
  c.hit_margin = 6;
  q.claims = {c};
  auto g = cold.grant(q);
  REQUIRE(g.has_value());
  CHECK(g->grants[0].first == 0);
  CHECK(g->grants[0].count == 10);
  c.admit = false;
  c.computed = 10;
  c.held = 3;
  q.claims = {c};
  g = cold.grant(q);
  REQUIRE(g.has_value());
  REQUIRE(g->grants.size() == 1);
  CHECK(g->grants[0].first == 10);
  CHECK(g->grants[0].count == 10);  // to the budget, and the chunk limit
}

}  // namespace troupe

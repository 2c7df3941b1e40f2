// Token trees chosen from measured acceptance (engine/speculative/tree_shape.hpp): deep and narrow
// where first candidates are kept, wide where later ones are, always within the budget;
// kept paths moved to follow their roots (engine/speculative/tree_keeper.hpp).
#include <vector>

#include <doctest/doctest.h>

#include "engine/speculative/tree_keeper.hpp"
#include "engine/speculative/tree_shape.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

int32_t nodes_of(const std::vector<int32_t>& shape) {
  int32_t nodes = 0, level = 1;
  for (int32_t w : shape) nodes += (level *= w);
  return nodes;
}

}  // namespace

TEST_CASE("a tree's kept path gives each depth's rank among its siblings") {
  // Three under the root (0, 1, 2), two under node 1 (3, 4), one under node 4 (5).
  const std::vector<int32_t> parents = {-1, -1, -1, 1, 1, 4};
  CHECK(path_ranks(parents, std::vector<int32_t>{1, 4, 5}) == std::vector<int32_t>{1, 1, 0});
  CHECK(path_ranks(parents, std::vector<int32_t>{}).empty());
}

TEST_CASE("a tree chooser goes deep where first candidates are kept, wide where later ones are") {
  // Unmeasured: the prior's tree, within the budget.
  const tree_chooser fresh(15, 8);
  CHECK(nodes_of(fresh.choose()) <= 15);
  CHECK(nodes_of(tree_chooser(3, 8).choose()) <= 3);

  // Every first candidate kept, at every depth: a chain as deep as allowed.
  tree_chooser sure(15, 8);
  const std::vector<int32_t> widths = {2, 2, 2, 2, 2, 2, 2, 2}, firsts = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 200; ++i) sure.record(widths, firsts);
  CHECK(sure.kept(1, 0) > 0.95);
  CHECK(sure.kept(1, 1) < 0.05);
  CHECK(sure.choose() == std::vector<int32_t>(8, 1));

  // The first candidate of depth 1 kept a third of the time, the second and third a third
  // each; deeper, first candidates kept: depth 1 widens to three.
  tree_chooser split(15, 4);
  for (int i = 0; i < 300; ++i) {
    const std::vector<int32_t> ranks = {i % 3, 0, 0, 0};
    split.record(std::vector<int32_t>{4, 1, 1, 1}, ranks);
  }
  const std::vector<int32_t> wide = split.choose();
  CAPTURE(wide.size());
  CHECK(wide.front() == 3);
  CHECK(nodes_of(wide) <= 15);

  // Nothing is ever kept past depth 1, of four candidates offered there: no depth beyond
  // it pays.
  tree_chooser shallow(15, 4);
  for (int i = 0; i < 300; ++i) shallow.record(std::vector<int32_t>{1, 4}, std::vector<int32_t>{0});
  CHECK(shallow.kept(2, 0) < 0.05);
  CHECK(shallow.choose().size() <= 2);
}

}  // namespace troupe

namespace troupe {

TEST_CASE("a tree keeper moves each verified tree's kept path to follow its root, and re-chooses its shape") {
  scheduler_config cfg;
  cfg.max_step_tokens = 64;
  cfg.kv.num_blocks = 16;
  cfg.kv.block_size = 4;
  cfg.context = 256;
  cfg.vocab = 512;
  scheduler s(cfg, test::tok512());
  request_params p;
  p.prompt = {1, 5, 9, 20, 31};
  p.max_tokens = 40;
  p.ignore_eos = true;
  REQUIRE(s.add(request_id{3}, p).has_value());
  const step_plan prefill = s.schedule();
  std::vector<sample_result> first{{33, 0.0f, {}}};
  s.update_from_output(prefill, first);

  speculative_config sc;
  sc.method = spec_method::ngram;
  sc.tree = {2, 2};
  sc.tree_auto = 6;
  sc.max_step_tokens = 64;
  tree_keeper keeper(sc, 4);
  tree_keeper misses(sc, 4);  // told of the same trees, each keeping nothing
  int moves = 0;
  for (int round = 0; round < 8; ++round) {
    CAPTURE(round);
    const speculative_config& live = keeper.next_step();
    plan_drafts(s.running(), live, cfg.context);
    step_plan plan = s.schedule();
    REQUIRE(plan.chunks.size() == 1);
    // Two candidates a position: nodes 0 and 1 under the root, 2 and 3 under node 0.
    std::vector<draft_slot> slots(1);
    slots[0] = {s.find(request_id{3}), static_cast<int32_t>(live.tree.size()), {100, 101}, {}, {}, live.tree,
                {{100, 200}, {101, 201}}};
    take_drafts(plan, slots);
    const scheduled_chunk& c = plan.chunks[0];
    REQUIRE(c.draft_parents.size() == 6);
    // Kept: the second candidate at depth 1 (node 1), then its first child (node 4).
    const std::vector<std::vector<int32_t>> paths{{1, 4}};
    std::vector<int32_t> kept;
    keeper.keep(plan, s, paths, [&](const scheduled_chunk& moved, std::span<const int32_t> k) {
      CHECK(moved.id == request_id{3});
      kept.assign(k.begin(), k.end());
      ++moves;
    });
    std::vector<int32_t> want;
    for (int32_t slot = 0; slot <= c.first_slot(); ++slot) want.push_back(slot);
    want.push_back(c.first_slot() + 2);
    want.push_back(c.first_slot() + 5);
    CHECK(kept == want);
    const std::vector<std::vector<int32_t>> nothing{{}};
    misses.keep(plan, s, nothing, [&](const scheduled_chunk&, std::span<const int32_t>) { FAIL("nothing kept moves"); });
    // A path where a chain would have it (the first candidate, alone) moves nothing.
    const std::vector<std::vector<int32_t>> firsts{{0}};
    int32_t calls = 0;
    tree_keeper(sc, 4).keep(plan, s, firsts, [&](const scheduled_chunk&, std::span<const int32_t>) { ++calls; });
    CHECK(calls == 0);
    std::vector<sample_result> got{{c.draft[1], 0.0f, {}}, {c.draft[4], 0.0f, {}}, {7, 0.0f, {}}};
    s.update_from_output(plan, got, std::vector<int32_t>{3});
  }
  CHECK(moves == 8);
  // Eight trees in, the shape is chosen again, within the budget, from what was kept: every
  // tree keeping the second candidate and its first child, or every one keeping nothing,
  // choose apart.
  const std::vector<int32_t> shape = keeper.next_step().tree, missed = misses.next_step().tree;
  CHECK(shape != sc.tree);
  CHECK(shape != missed);
  REQUIRE_FALSE(shape.empty());
  CHECK(shape[0] >= 2);
  CHECK(nodes_of(shape) <= 6);
  CHECK(nodes_of(missed) <= 6);
}

}  // namespace troupe

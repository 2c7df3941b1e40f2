// Token trees chosen from measured acceptance (engine/spec/tree_shape.hpp): deep and narrow
// where first candidates are kept, wide where later ones are, always within the budget.
#include <vector>

#include <doctest/doctest.h>

#include "engine/spec/tree_shape.hpp"

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

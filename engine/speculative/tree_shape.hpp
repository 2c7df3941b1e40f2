// tree_shape: a token tree's shape chosen from the acceptance measured so far
// (speculative_config::tree_auto).
//
// Every verified tree tells, for each depth it reached, how many candidates it offered
// there and which of them (by rank: the proposer's order) was kept, if one was. From those
// counts, a[d][j] estimates the chance that candidate j of depth d is kept once depth
// d - 1 is. A shape W = (w_1, .., w_D) then keeps, in expectation,
//   E(W) = sum_d prod_{e <= d} A_e(w_e),   A_e(w) = a[e][0] + .. + a[e][w - 1],
// drafts per verify, for N(W) = w_1 + w_1 w_2 + .. nodes. The chooser picks the W with the
// largest E(W) - node_cost N(W) within the node budget (a node must add a fiftieth of a
// kept draft to be worth computing), widths 1..max_width, depth up to max_depth. Until a
// depth has been measured, its estimates come from a prior that halves with every rank;
// measured, a tree grows deep where first candidates are kept, wide where later ones are,
// and stops where nothing is kept.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace troupe {

class tree_chooser {
 public:
  static constexpr int32_t max_width = 4;
  static constexpr double node_cost = 0.02;

  tree_chooser(int32_t budget, int32_t max_depth);

  // One verified tree: widths[d] candidates offered at depth d + 1, and ranks[d] the rank
  // of the one kept there (ranks.size() depths kept; the depth after the last kept one,
  // if the tree had it, rejected all it offered).
  void record(std::span<const int32_t> widths, std::span<const int32_t> ranks);
  // The shape that keeps the most drafts per verify within the budget.
  std::vector<int32_t> choose() const;
  // The estimate that candidate `rank` of depth `depth` (from 1) is kept, depth `depth - 1`
  // having been.
  double kept(int32_t depth, int32_t rank) const;

 private:
  int32_t budget_, max_depth_;
  std::vector<double> offered_, hits_;  // [depth - 1][rank]
};

// The ranks of a verified tree's kept path: the kept node of each depth's place among its
// siblings (parents: each node's, -1 under the root; path: the kept nodes, root down).
std::vector<int32_t> path_ranks(std::span<const int32_t> parents, std::span<const int32_t> path);

}  // namespace troupe

#include "engine/speculative/tree_shape.hpp"

#include <algorithm>

namespace troupe {

namespace {

// The prior: four verifies' worth, candidate j kept with chance 0.5 / 2^j.
constexpr double prior_weight = 4.0;
double prior(int32_t rank) { return 0.5 / static_cast<double>(1 << rank); }

}  // namespace

tree_chooser::tree_chooser(int32_t budget, int32_t max_depth)
    : budget_(std::max(budget, 1)), max_depth_(std::max(max_depth, 1)),
      offered_(static_cast<size_t>(max_depth_) * max_width, 0.0), hits_(offered_.size(), 0.0) {}

void tree_chooser::record(std::span<const int32_t> widths, std::span<const int32_t> ranks) {
  for (size_t d = 0; d < widths.size() && d < static_cast<size_t>(max_depth_); ++d) {
    if (d > ranks.size()) break;  // not reached
    const int32_t w = std::min(widths[d], max_width);
    for (int32_t j = 0; j < w; ++j) offered_[d * max_width + static_cast<size_t>(j)] += 1.0;
    if (d < ranks.size() && ranks[d] < max_width) hits_[d * max_width + static_cast<size_t>(ranks[d])] += 1.0;
  }
}

double tree_chooser::kept(int32_t depth, int32_t rank) const {
  const size_t at = static_cast<size_t>(depth - 1) * max_width + static_cast<size_t>(rank);
  return (hits_[at] + prior_weight * prior(rank)) / (offered_[at] + prior_weight);
}

std::vector<int32_t> tree_chooser::choose() const {
  std::vector<int32_t> best = {1}, w;
  double best_value = -1e300;
  int32_t best_nodes = 0;
  // Depth first over the widths, pruned by the budget.
  auto walk = [&](auto&& self, double reach, double expected, int32_t nodes, int32_t level_nodes) -> void {
    const double value = expected - node_cost * nodes;
    if (!w.empty() && (value > best_value + 1e-12 || (value > best_value - 1e-12 && nodes < best_nodes))) {
      best = w;
      best_value = value;
      best_nodes = nodes;
    }
    const auto depth = static_cast<int32_t>(w.size()) + 1;
    if (depth > max_depth_) return;
    double a = 0.0;
    for (int32_t width = 1; width <= max_width; ++width) {
      a = std::min(1.0, a + kept(depth, width - 1));
      const int32_t more = level_nodes * width;
      if (nodes + more > budget_) break;
      w.push_back(width);
      self(self, reach * a, expected + reach * a, nodes + more, more);
      w.pop_back();
    }
  };
  walk(walk, 1.0, 0.0, 0, 1);
  return best;
}

std::vector<int32_t> path_ranks(std::span<const int32_t> parents, std::span<const int32_t> path) {
  std::vector<int32_t> ranks;
  for (int32_t node : path) {
    int32_t rank = 0;
    for (int32_t i = 0; i < node; ++i)
      if (parents[i] == parents[node]) ++rank;
    ranks.push_back(rank);
  }
  return ranks;
}

}  // namespace troupe

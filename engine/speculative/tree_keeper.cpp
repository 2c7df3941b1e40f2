#include "engine/speculative/tree_keeper.hpp"

#include <algorithm>

namespace troupe {

tree_keeper::tree_keeper(const speculative_config& c, int32_t max_depth) : live_(c) {
  if (c.tree_auto > 0) chooser_.emplace(c.tree_auto, std::min(8, max_depth));
}

const speculative_config& tree_keeper::next_step() {
  if (chooser_ && recorded_ >= 8) {
    live_.tree = chooser_->choose();
    recorded_ = 0;
  }
  return live_;
}

void tree_keeper::keep(const step_plan& plan, scheduler& sched, std::span<const std::vector<int32_t>> paths,
                       const mover& move) {
  size_t sampled = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    const size_t at = sampled++;
    const request* r = sched.find(c.id);
    if (!r || r->drafts.parents.empty() || c.num_draft == 0) continue;  // no tree verified
    static const std::vector<int32_t> none;
    const std::vector<int32_t>& path = at < paths.size() ? paths[at] : none;
    if (chooser_) {
      // What the tree offered at each depth it reached, and the rank of what it kept.
      widths_.clear();
      for (size_t d = 0; d <= path.size(); ++d) {
        const int32_t above = d == 0 ? -1 : path[d - 1];
        const auto n = std::count(r->drafts.parents.begin(), r->drafts.parents.end(), above);
        if (n == 0) break;
        widths_.push_back(static_cast<int32_t>(n));
      }
      chooser_->record(widths_, path_ranks(r->drafts.parents, path));
      ++recorded_;
    }
    bool moves = false;
    for (size_t j = 0; j < path.size(); ++j) moves |= path[j] != static_cast<int32_t>(j);
    if (!moves) continue;
    kept_.resize(static_cast<size_t>(c.first_slot()) + 1);
    for (int32_t s = 0; s <= c.first_slot(); ++s) kept_[static_cast<size_t>(s)] = s;
    for (int32_t node : path) kept_.push_back(c.first_slot() + 1 + node);
    move(c, kept_);
  }
}

}  // namespace troupe

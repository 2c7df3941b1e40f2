// tree_keeper: a replica's token trees from one step to the next (engine/serve/step_path.hpp).
//
// It holds the shape each step drafts: the configured tree, or with tree_auto the one
// chosen from what verification kept (tree_shape.hpp), re-chosen every 8 trees. After a
// step, each verified tree's accepted path becomes the KV slots its request keeps: its
// sequence up to the root, then the path's nodes, moved down to follow the root as a chain
// of the same drafts would have left them (step_path.hpp: at once where the shard is in
// the same process, else with the request's next step, a planned compaction over the
// table the shards held for the tree).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "engine/sched/scheduler.hpp"
#include "engine/speculative/speculative.hpp"
#include "engine/speculative/tree_shape.hpp"

namespace troupe {

class tree_keeper {
 public:
  // max_depth: how deep a chosen tree may grow (a Medusa head file's depth).
  tree_keeper(const speculative_config& c, int32_t max_depth);

  // The configuration the next step drafts with: c, its tree as now chosen.
  const speculative_config& next_step();
  const speculative_config& live() const { return live_; }

  // The slots a verified tree's request keeps, for move(chunk, kept): called for each
  // sampled chunk of `plan` whose request verified a tree (request::drafts.parents) and
  // whose accepted path is not where a chain would have it. paths: per sampled chunk, the
  // accepted nodes (step_tokens::paths; shorter, or empty, where none were).
  using mover = std::function<void(const scheduled_chunk&, std::span<const int32_t> kept)>;
  void keep(const step_plan& plan, scheduler& sched, std::span<const std::vector<int32_t>> paths,
            const mover& move);

 private:
  speculative_config live_;
  std::optional<tree_chooser> chooser_;  // with tree_auto
  uint64_t recorded_ = 0;                // trees the chooser has seen since it last chose
  std::vector<int32_t> kept_, widths_;
};

}  // namespace troupe

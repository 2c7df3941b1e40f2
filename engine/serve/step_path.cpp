#include "engine/serve/step_path.hpp"

#include <algorithm>

#include "engine/speculative/eagle_proposer.hpp"
#include "engine/speculative/medusa_proposer.hpp"
#include "engine/speculative/ngram_proposer.hpp"

namespace troupe {

std::unique_ptr<proposer> step_path::beside_scheduler(const speculative_config& spec, const model& target,
                                                          const speculative_heads* heads, thread_pool* pool) {
  switch (spec.method) {
    case spec_method::ngram: return std::make_unique<ngram_proposer>(spec.ngram_min, spec.ngram_max);
    case spec_method::medusa:
      TROUPE_ASSERT(heads != nullptr && pool != nullptr, "Medusa heads are loaded with the replica, and a pool runs them");
      return std::make_unique<medusa_proposer>(target, *heads, *pool);
    case spec_method::eagle:
      TROUPE_ASSERT(heads != nullptr && pool != nullptr, "an EAGLE head is loaded with the replica, and a pool runs it");
      return std::make_unique<eagle_proposer>(target, *heads, *pool);
    default: return nullptr;
  }
}

int32_t step_path::max_tree_depth(const speculative_config& spec, const speculative_heads* heads) {
  return heads && spec.method == spec_method::medusa ? heads->depth() : max_draft_tokens;
}

step_path::step_path(scheduler& sched, const model_config& m, drafts d, mover now)
    : sched_(sched), m_(m), drafts_(std::move(d)), move_now_(std::move(now)) {
  if (drafts_.spec.enabled()) trees_.emplace(drafts_.spec, drafts_.max_tree_depth);
}

void step_path::plan_drafts(bool available) {
  if (!drafts_.spec.enabled()) return;
  troupe::plan_drafts(sched_.running(), available ? trees_->next_step() : speculative_config{}, sched_.config().context);
}

std::optional<draft_order> step_path::draft(step_plan& plan, bool available) {
  for (request_id id : plan.preempted) forget(id);
  if (!drafts_.spec.enabled()) return std::nullopt;
  const std::span<const int32_t> tree = trees_->live().tree;
  // KV eviction: a draft's own cache makes the step's compactions too (here at once;
  // elsewhere with the request's next order).
  for (const planned_compaction& c : plan.compactions) {
    if (drafts_.here) drafts_.here->compacted(c.id, {c.block_table, c.kept, c.rotate, c.new_table});
    if (drafts_.elsewhere) orders_.compacted(c);
  }
  if (drafts_.here && drafts_.here->shares_target_kv() && move_now_) {
    // It drafts over the cache the step's compactions rewrite: they are made first.
    for (const planned_compaction& c : plan.compactions) move_now_(c);
    plan.compactions.clear();
  }
  if (drafts_.here) fill_drafts(plan, sched_, *drafts_.here, slots_, tree);
  if (!drafts_.elsewhere) return std::nullopt;
  std::optional<draft_order> order;
  if (available) order = orders_.make(plan, sched_, tree);
  if (!order) draft_orders::give_up(plan);
  return order;
}

status step_path::take_drafts(step_plan& plan, draft_answer a) {
  return orders_.take(plan, sched_, std::move(a), m_.vocab_size);
}

void step_path::give_up(step_plan& plan, uint64_t session) {
  draft_orders::give_up(plan);
  orders_.restart(session);
}

std::vector<int32_t> step_path::ready(step_plan& plan) {
  std::vector<int32_t> wanted;
  if (!tree_moves_.empty())
    for (const auto& c : plan.chunks)
      if (auto it = tree_moves_.find(c.id); it != tree_moves_.end()) {
        plan.compactions.push_back(std::move(it->second));
        tree_moves_.erase(it);
      }
  if (!drafts_.here || !drafts_.here->wants_features()) return wanted;
  for (const auto& c : plan.chunks) wanted.push_back(feature_rows(c, *drafts_.here));
  return wanted;
}

void step_path::settle_loads(const step_plan& plan, std::span<const request_id> failed) {
  sched_.settle_tier_loads(plan, failed);
  for (request_id id : failed) forget(id);
}

step_tokens step_path::tokens_chosen(const step_plan& plan, std::span<const int32_t> chosen) {
  return replay_chosen(plan, sched_, chosen, drafts_.spec);
}

step_tokens step_path::tokens_from_logits(const step_plan& plan, float* logits, int32_t vocab) {
  return sample_rows(plan, sched_, logits, vocab, drafts_.spec);
}

std::span<const float> step_path::spread_features(const step_plan& plan, std::span<const int32_t> wanted,
                                                      std::span<const float> features) {
  if (wanted.empty()) return {};
  const auto dim = static_cast<size_t>(m_.dim);
  features_.resize(static_cast<size_t>(plan.num_tokens) * dim);
  size_t row = 0, from = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const auto count = static_cast<size_t>(plan.chunks[i].count), n = static_cast<size_t>(wanted[i]);
    std::copy_n(features.begin() + static_cast<ptrdiff_t>(from * dim), n * dim,
                features_.begin() + static_cast<ptrdiff_t>((row + count - n) * dim));
    from += n;
    row += count;
  }
  return features_;
}

std::vector<step_output> step_path::finish(const step_plan& plan, step_tokens& got, std::span<const float> attention,
                                               std::span<const float> features) {
  tally_ += got.spec;
  // Each verified tree's accepted path moves down in its KV to follow the root, with its
  // request's next step (over the table the shards held for the tree), or at once.
  if (trees_)
    trees_->keep(plan, sched_, got.paths, [this](const scheduled_chunk& c, std::span<const int32_t> kept) {
      planned_compaction m;
      m.id = c.id;
      m.block_table.assign(c.block_table.begin(), c.block_table.end());
      m.kept.assign(kept.begin(), kept.end());
      if (move_now_)
        move_now_(m);
      else
        tree_moves_[c.id] = std::move(m);
    });
  if (drafts_.here && drafts_.here->wants_features() && !features.empty())
    observe_features(plan, sched_, got.emitted, got.paths, features.data(), m_.dim, *drafts_.here);
  std::vector<step_output> outs = sched_.update_from_output(plan, got.samples, got.emitted);
  sched_.observe_attention(plan, attention, m_.num_heads * m_.num_layers);
  for (const step_output& o : outs)
    if (o.finished) forget(o.id);
  return outs;
}

void step_path::forget(request_id id) {
  tree_moves_.erase(id);  // (its KV is gone)
  if (drafts_.here) drafts_.here->forget(id);
  if (drafts_.elsewhere) orders_.forget(id);
}

void step_path::restart_drafts(uint64_t session) {
  if (drafts_.here) drafts_.here->forget_all();
  if (drafts_.elsewhere) orders_.restart(session);
}

void step_path::reset(uint64_t session) {
  tree_moves_.clear();
  restart_drafts(session);
}

}  // namespace troupe

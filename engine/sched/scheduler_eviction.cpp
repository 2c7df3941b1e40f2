// scheduler: KV eviction, each request's cache kept within its budget (scheduler.hpp).
#include "engine/sched/scheduler.hpp"

#include <algorithm>

#include "engine/forward/step_batch.hpp"

namespace troupe {
namespace {

// The eviction state follows the request's slots: the ones computed since, appended.
void sync_slots(request& r) {
  const int32_t slots = r.num_computed_tokens - r.evicted;
  if (r.kept.size() < slots) r.kept.append(slots - r.kept.size(), r.num_computed_tokens - (slots - r.kept.size()));
}

}  // namespace

// Before a running request claims its step: when its cache and the step's new positions
// would pass the budget, its policy drops tokens (slots_to_keep says how many stay).
void scheduler::make_room(step_draft& d, request& r, int32_t wanted) {
  const kv_eviction_config& e = r.eviction;
  if (!e.enabled()) return;
  sync_slots(r);
  const int32_t slots = r.kept.size();
  const int32_t keep = slots_to_keep(e, slots, wanted, cfg_.kv.block_size);
  if (keep >= slots) return;
  planned_compaction c;
  c.id = r.id;
  c.block_table = r.blocks;
  c.kept = r.kept.choose(e, keep);
  c.rotate = e.rope_in_cache();
  d.compacted.push_back({r.id, r.kept, r.evicted});
  r.kept.retain(c.kept);
  r.evicted += slots - keep;
  evicted_tokens_ += slots - keep;
  d.plan.compactions.push_back(std::move(c));
}

// The positions an evicting request's next step computes (its drafts aside): its prompt's
// next chunk, which ends at its budget (after its policy's compaction) or at the most a step
// computes, whatever else runs, so that its chunks, and what its policy sees of them, are
// the same in any batch. Zero for a request without eviction.
int32_t scheduler::eviction_chunk(const request& r, bool admit) const {
  const kv_eviction_config& e = r.eviction;
  if (!e.enabled()) return 0;
  const int32_t limit = eviction_step_limit(r, admit);
  if (admit) return std::min({r.num_tokens(), e.budget, limit});
  const int32_t slots = r.num_computed_tokens - r.evicted, wanted = r.num_tokens() - r.num_computed_tokens;
  const int32_t keep = slots_to_keep(e, slots, wanted, cfg_.kv.block_size);
  return std::min({wanted, e.budget - keep, limit});
}

// The most an evicting request's step computes (kv_claim::chunk_limit): the step's most,
// within its prompt; past it, output it has (delivered by an earlier attempt, or the first
// token a prefill replica handed over) one token a step, as each was computed when it was
// generated. So a request handed over, or moved off a failed replica, evicts what it would
// have where it started.
int32_t scheduler::eviction_step_limit(const request& r, bool admit) const {
  const int32_t first = admit ? 0 : r.num_computed_tokens;
  if (first < r.num_prompt_tokens) return std::min(cfg_.max_step_tokens, r.num_prompt_tokens - first);
  return r.num_tokens() - first > 1 ? 1 : cfg_.max_step_tokens;
}

scheduler::eviction_usage scheduler::eviction_now() const {
  eviction_usage u;
  for (const request* r : running_) {
    if (!r->eviction.enabled()) continue;
    ++u.requests;
    u.budget_tokens += static_cast<uint64_t>(r->eviction.budget);
    u.held_tokens += static_cast<uint64_t>(r->num_computed_tokens - r->evicted);
  }
  return u;
}

void scheduler::observe_attention(const step_plan& plan, std::span<const float> sums, int32_t heads) {
  TROUPE_ASSERT(static_cast<int64_t>(sums.size()) == plan.attention_sums(), sums.size(), plan.attention_sums());
  for (const scheduled_chunk& c : plan.chunks) {
    if (!c.attention) continue;
    std::span<const float> mass = sums.first(static_cast<size_t>(c.attention_sums()));
    sums = sums.subspan(mass.size());
    request* r = find(c.id);
    if (!r || !r->eviction.wants_attention() || r->state != request_state::running) continue;
    if (c.attention_by_token()) {
      // Each token the request keeps (its known one, the accepted drafts), one at a time,
      // as steps without drafts would have shown them; rejected drafts' are dropped.
      TROUPE_ASSERT(r->kept.size() == c.first_slot(), r->kept.size(), c.first_slot());
      const int32_t kept = std::min(c.count, r->num_computed_tokens - r->evicted - c.first_slot());
      for (int32_t j = 0; j < kept; ++j) {
        const auto seen = static_cast<size_t>(c.first_slot() + j + 1);
        r->kept.append(1, c.first + j);
        r->kept.observe(mass.first(seen), heads);
        mass = mass.subspan(seen);
      }
      continue;
    }
    sync_slots(*r);
    // (The step saw every slot the request keeps now: those it had, and the step's own.)
    const size_t n = static_cast<size_t>(r->kept.size());
    TROUPE_ASSERT(mass.size() >= n, mass.size(), n);
    r->kept.observe(mass.first(n), attention_mass_rows(c.count) * heads);
  }
}

}  // namespace troupe

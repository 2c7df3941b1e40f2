#include "engine/sched/eviction_part.hpp"

#include <algorithm>
#include <numeric>

#include "engine/forward/step_batch.hpp"
#include "engine/sched/scheduler.hpp"

namespace troupe {
namespace {

// The eviction state follows the request's slots: the ones computed since, appended.
void sync_slots(request& r) {
  kv_eviction_state& kept = r.eviction.kept;
  const int32_t slots = r.num_computed_tokens - r.eviction.evicted;
  if (kept.size() < slots) kept.append(slots - kept.size(), r.num_computed_tokens - (slots - kept.size()));
}

}  // namespace

const kv_eviction_config& eviction_part::config_of(const request_params& p) const {
  return p.eviction ? *p.eviction : cfg_.eviction;
}

status eviction_part::check(const request_params& p) const {
  if (p.eviction) {
    if (auto e = validate(*p.eviction)) return error{*e};
    if (p.eviction->enabled() && !cfg_.no_eviction.empty()) return error{cfg_.no_eviction};
  }
  const kv_eviction_config& e = config_of(p);
  if (e.enabled() && e.budget > cfg_.context)
    return error{"a KV budget of " + std::to_string(e.budget) + " tokens is past the model's context of " +
                 std::to_string(cfg_.context)};
  return ok();
}

// Its chunks keep it within its budget: its cache holds that many slots at most.
std::optional<int64_t> eviction_part::cache_bound(const request_params& p) const {
  const kv_eviction_config& e = config_of(p);
  if (!e.enabled()) return std::nullopt;
  return e.budget;
}

// The positions an evicting request's next step computes (its drafts aside): its prompt's
// next chunk, which ends at its budget (after its policy's compaction) or at the most a step
// computes, whatever else runs, so that its chunks, and what its policy sees of them, are
// the same in any batch. Zero for a request without eviction.
int32_t eviction_part::whole_chunk(const request& r, bool admit) const {
  const kv_eviction_config& e = r.eviction.config;
  if (!e.enabled()) return 0;
  const int32_t limit = step_limit(r, admit);
  if (admit) return std::min({r.num_tokens(), e.budget, limit});
  const int32_t slots = r.num_computed_tokens - r.eviction.evicted;
  const int32_t keep = slots_to_keep(e, slots, room_wanted(r), cfg_.kv.block_size);
  return std::min({r.num_tokens() - r.num_computed_tokens, e.budget - keep, limit});
}

// The positions a running request makes room for: the rest of its prompt, or one (a
// decode step's known token), as when it first computed them. A request computing again
// the tokens it has (after a preemption or a lost stage, or moved to another replica)
// asks for no more, so that it compacts where it did then.
int32_t eviction_part::room_wanted(const request& r) {
  const int32_t first = r.num_computed_tokens;
  return first < r.num_prompt_tokens ? r.num_prompt_tokens - first : 1;
}

// The most an evicting request's step computes (kv_claim::chunk_limit): the step's most,
// within its prompt; past it, output it has (delivered by an earlier attempt, or the first
// token a prefill replica handed over) one token a step, as each was computed when it was
// generated. So a request handed over, or moved off a failed replica, evicts what it would
// have where it started.
int32_t eviction_part::step_limit(const request& r, bool admit) const {
  const int32_t first = admit ? 0 : r.num_computed_tokens;
  if (first < r.num_prompt_tokens) return std::min(cfg_.max_step_tokens, r.num_prompt_tokens - first);
  return r.num_tokens() - first > 1 ? 1 : cfg_.max_step_tokens;
}

// Room is made for the step's known tokens alone: its drafts take what its budget has
// left (the grant stops there), so that it compacts where it would without drafts.
void eviction_part::claim(step_draft& d, request& r, kv_claim& c) {
  const eviction_state& e = r.eviction;
  if (!e.enabled()) return;
  if (!c.admit) {
    make_room(d, r, room_wanted(r));
    c.evicted = e.evicted;
  }
  c.kv_budget = e.config.budget;
  c.chunk_limit = step_limit(r, c.admit);
  c.hit_margin = e.wants_attention() ? attention_mass_queries : 1;
  // Its compaction this step, if any: the blocks it writes become its own.
  for (const planned_compaction& pc : d.plan.compactions)
    if (pc.id == r.id) c.rewrite_from = pc.rewrite_from();
}

// When a running request's cache and the step's new positions would pass the budget, its
// policy drops tokens (slots_to_keep says how many stay). On a sliding-window model the
// slots the step's tokens no longer see go first; the policy chooses among the others.
void eviction_part::make_room(step_draft& d, request& r, int32_t wanted) {
  eviction_state& e = r.eviction;
  sync_slots(r);
  const int32_t slots = e.kept.size();
  const int32_t keep = slots_to_keep(e.config, slots, wanted, cfg_.kv.block_size);
  if (keep >= slots) return;
  planned_compaction c;
  c.id = r.id;
  c.block_table = r.blocks;
  const int32_t dead = out_of_window(r);
  if (slots - dead > keep) {
    c.kept = e.kept.choose(e.config, keep, dead);
  } else {  // (the latest of the dead too, so that as many stay: outside every window, unseen)
    c.kept.resize(static_cast<size_t>(keep));
    std::iota(c.kept.begin(), c.kept.end(), slots - keep);
  }
  c.rotate = e.rope_in_cache();
  taken_.push_back({&r, e.kept, e.evicted});
  e.kept.retain(c.kept);
  e.evicted += slots - keep;
  evicted_tokens_ += slots - keep;
  d.plan.compactions.push_back(std::move(c));
}

// On a sliding-window model, the slots before the window of the step's first token: by
// position, or where positions are slots (streaming) by slot.
int32_t eviction_part::out_of_window(const request& r) const {
  const int32_t w = cfg_.sliding_window;
  if (w <= 0) return 0;
  const std::span<const int32_t> positions = r.eviction.kept.positions();
  if (r.eviction.rope_in_cache()) return std::max(0, static_cast<int32_t>(positions.size()) - w + 1);
  const int32_t start = r.num_computed_tokens - w + 1;
  return static_cast<int32_t>(std::lower_bound(positions.begin(), positions.end(), start) - positions.begin());
}

void eviction_part::planned(step_draft&, request& r, scheduled_chunk& c, int32_t) {
  c.evicted = r.eviction.evicted;
  c.rope_in_cache = r.eviction.rope_in_cache();
  c.attention = r.eviction.wants_attention();
  window_of(r, c);
}

// On a sliding-window model whose cache dropped tokens, with the tokens' own positions:
// each token's window, the first slot whose position is within it. The kept slots hold
// ascending positions; the slots after them (computed since the last compaction, then the
// chunk's) hold one position after another, slot first_slot + k position first + k. Where
// positions are slots (streaming), and before any compaction, slot and position windows
// are one: the shards find it.
void eviction_part::window_of(request& r, scheduled_chunk& c) {
  std::vector<int32_t>& first = r.eviction.window_first;
  first.clear();
  const int32_t w = cfg_.sliding_window;
  if (w <= 0 || r.eviction.evicted == 0 || r.eviction.rope_in_cache()) return;
  const std::span<const int32_t> kept = r.eviction.kept.positions();
  for (int32_t t = 0; t < c.count; ++t) {
    const int32_t start = c.first + t - w + 1;
    const auto it = std::lower_bound(kept.begin(), kept.end(), start);
    auto slot = static_cast<int32_t>(it - kept.begin());
    if (it == kept.end()) slot = std::max(slot, c.first_slot() + start - c.first);
    first.push_back(slot);
  }
  c.window_first = first;
}

void eviction_part::dropped(step_draft& d, request& r) {
  std::erase_if(d.plan.compactions, [&](const planned_compaction& c) { return c.id == r.id; });
  std::erase_if(taken_, [&](const kept_before& b) { return b.r == &r; });
}

// A compaction goes with its request's grant: one without (the request waits for blocks,
// or the budget ran out first) is taken back, so no block it shares is written in place.
void eviction_part::end_step(step_draft& d, const std::deque<request*>&) {
  for (const kept_before& b : taken_) {
    request& r = *b.r;
    const auto it = std::find_if(d.plan.compactions.begin(), d.plan.compactions.end(),
                                 [&](const planned_compaction& c) { return c.id == r.id; });
    if (it == d.plan.compactions.end()) continue;
    const bool granted = std::any_of(d.plan.chunks.begin(), d.plan.chunks.end(),
                                     [&](const scheduled_chunk& c) { return c.id == r.id; });
    if (granted) {
      if (r.blocks != it->block_table) it->new_table = r.blocks;
      continue;
    }
    evicted_tokens_ -= static_cast<uint64_t>(r.eviction.evicted - b.evicted);
    r.eviction.kept = b.kept;
    r.eviction.evicted = b.evicted;
    d.plan.compactions.erase(it);
  }
  taken_.clear();
}

eviction_part::usage eviction_part::now(std::span<request* const> running) const {
  usage u;
  for (const request* r : running) {
    if (!r->eviction.enabled()) continue;
    ++u.requests;
    u.budget_tokens += static_cast<uint64_t>(r->eviction.config.budget);
    u.held_tokens += static_cast<uint64_t>(r->num_computed_tokens - r->eviction.evicted);
  }
  return u;
}

void eviction_part::observe(const scheduled_chunk& c, request& r, std::span<const float> mass, int32_t heads) {
  kv_eviction_state& kept = r.eviction.kept;
  if (c.attention_by_token()) {
    // Each token the request keeps (its known one, the accepted drafts), one at a time,
    // as steps without drafts would have shown them; rejected drafts' are dropped.
    TROUPE_ASSERT(kept.size() == c.first_slot(), kept.size(), c.first_slot());
    const int32_t n = std::min(c.count, r.num_computed_tokens - r.eviction.evicted - c.first_slot());
    for (int32_t j = 0; j < n; ++j) {
      const auto seen = static_cast<size_t>(c.first_slot() + j + 1);
      kept.append(1, c.first + j);
      kept.observe(mass.first(seen), heads);
      mass = mass.subspan(seen);
    }
    return;
  }
  sync_slots(r);
  // (The step saw every slot the request keeps now: those it had, and the step's own.)
  const size_t n = static_cast<size_t>(kept.size());
  TROUPE_ASSERT(mass.size() >= n, mass.size(), n);
  kept.observe(mass.first(n), attention_mass_rows(c.count) * heads);
}

}  // namespace troupe

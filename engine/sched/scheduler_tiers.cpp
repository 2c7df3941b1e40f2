// scheduler: KV tiers and disaggregation's pushes, what a plan loads, saves and sends
// besides its steps (scheduler.hpp).
#include "engine/sched/scheduler.hpp"

#include <algorithm>

namespace troupe {

const tier_key& scheduler::key_of(request& r, int32_t block) {
  const int32_t bs = cfg_.kv.block_size;
  while (static_cast<int32_t>(r.tier_keys.size()) <= block) {
    const size_t b = r.tier_keys.size();
    const tier_key parent = b == 0 ? tier_key::root(r.params.cache_namespace) : r.tier_keys.back();
    r.tier_keys.push_back(parent.chain(std::span<const int32_t>(r.tokens).subspan(b * bs, bs)));
  }
  return r.tier_keys[block];
}

// The tokens of r's prompt the tiers hold, in whole blocks from the start (never the last
// token: its logits are wanted).
int32_t scheduler::tier_prefix(request& r) {
  if (!tiers_) return 0;
  const int32_t bs = cfg_.kv.block_size;
  const int32_t max_blocks = (r.num_tokens() - 1) / bs;
  int32_t n = 0;
  while (n < max_blocks && tiers_->contains(key_of(r, n))) ++n;
  if (n < max_blocks && probe_ && !r.tier_probed) {
    r.tier_probed = true;
    key_of(r, max_blocks - 1);
    const size_t found = probe_(std::span<const tier_key>(r.tier_keys).subspan(n, max_blocks - n));
    for (size_t i = 0; i < found && n < max_blocks; ++i) tiers_->add(r.tier_keys[n++]);
  }
  return n * bs;
}

// The blocks r's known tokens fill up to `end` are copied down after the step, unless the
// tiers hold them already. Under KV eviction, only while its cache is untouched: from its
// first compaction on (this plan's included, which runs before the step) its blocks hold
// slots, not the positions a block's content address names.
void scheduler::plan_tier_saves(step_draft& d, request& r, int32_t end) {
  if (!tiers_ || r.evicted > 0) return;
  const int32_t bs = cfg_.kv.block_size;
  const int32_t full = std::min(end / bs, static_cast<int32_t>(r.blocks.size()));
  for (int32_t b = r.tier_saved; b < full; ++b) {
    const tier_key& k = key_of(r, b);
    if (tiers_->contains(k)) continue;
    d.plan.tier_saves.push_back({r.id, r.blocks[b], k});
    tiers_->add(k);
    ++tier_usage_.saved_blocks;
  }
  r.tier_saved = std::max(r.tier_saved, full);
}

// Disaggregation (kv_to): the prompt's whole blocks go to the decode replica as the step
// fills them, those the prefix cache had with the first chunk. Sent after the step, before
// its answer, so a handed-off request's KV has landed when the router hears of it. Under
// KV eviction, the blocks filled before its first compaction (plan_tier_saves): the decode
// replica computes the rest of the prompt under its own eviction, as this one did.
void scheduler::plan_pushes(step_draft& d, request& r, int32_t end) {
  if (r.params.kv_to.empty() || r.evicted > 0) return;
  const int32_t full = std::min(end, r.num_prompt_tokens) / cfg_.kv.block_size;
  for (int32_t b = r.kv_pushed; b < full; ++b) {
    // A block the prefix cache shares with another request of this plan goes once to each
    // replica.
    const bool planned = std::any_of(d.plan.kv_pushes.begin(), d.plan.kv_pushes.end(), [&](const tier_move& m) {
      return m.block == r.blocks[b] && m.to == r.params.kv_to;
    });
    if (!planned) d.plan.kv_pushes.push_back({r.id, r.blocks[b], key_of(r, b), r.params.kv_to});
  }
  r.kv_pushed = std::max(r.kv_pushed, full);
}

// Requests still waiting after this plan: the blocks of their prompts the tiers hold are
// read up into the first tier while the plan runs, so that their loads, when admitted,
// are copies from memory (a few requests a plan, each once).
void scheduler::plan_tier_prefetch(step_plan& plan) {
  if (!tiers_ || !cfg_.tier_prefetch) return;
  const int32_t bs = cfg_.kv.block_size;
  int asked = 0;
  for (request* r : waiting_) {
    if (asked == 4) break;
    if (r->tier_prefetched) continue;
    r->tier_prefetched = true;
    ++asked;
    const int32_t n = tier_prefix(*r) / bs;
    for (int32_t b = 0; b < n; ++b) plan.tier_prefetch.push_back(r->tier_keys[static_cast<size_t>(b)]);
  }
}

void scheduler::settle_tier_loads(const step_plan& plan, std::span<const request_id> failed) {
  for (const tier_move& m : plan.tier_loads) {
    request* r = find(m.id);
    if (!r || !r->loads_in_flight) continue;
    r->loads_in_flight = false;
    if (std::find(failed.begin(), failed.end(), m.id) == failed.end()) {
      r->loads_landed = true;
      continue;
    }
    // Some block was gone or corrupt: forget what this request loaded and saved, and
    // compute it all again (nothing of its step is kept).
    ++tier_usage_.failed_loads;
    for (const tier_move& l : plan.tier_loads) {
      if (l.id != m.id) continue;
      tiers_->forget(l.key);
      --tier_usage_.loaded_blocks;  // (computed after all)
      tier_usage_.loaded_tokens -= static_cast<uint64_t>(cfg_.kv.block_size);
    }
    for (const tier_move& sv : plan.tier_saves)
      if (sv.id == m.id) tiers_->forget(sv.key);
    if (r->state != request_state::running) continue;
    release(*r);
    std::erase(running_, r);
    requeue(*r);
    --r->num_preemptions;  // (not a preemption)
  }
}

tier_usage scheduler::tiers_now() const {
  tier_usage u = tier_usage_;
  u.directory = tiers_ ? tiers_->size() : 0;
  return u;
}

}  // namespace troupe

#include "engine/sched/tier_part.hpp"

#include <algorithm>

#include "engine/sched/scheduler.hpp"

namespace troupe {

tier_part::tier_part(const scheduler_config& cfg) : cfg_(cfg) {
  if (cfg.tier_blocks > 0 && cfg.kv.prefix_caching) directory_.emplace(cfg.tier_blocks);
}

const tier_key& tier_part::key_of(request& r, int32_t block, int32_t block_size) {
  std::vector<tier_key>& keys = r.tiers.keys;
  while (static_cast<int32_t>(keys.size()) <= block) {
    const size_t b = keys.size();
    const tier_key parent = b == 0 ? tier_key::root(r.params.cache_namespace) : keys.back();
    keys.push_back(parent.chain(std::span<const int32_t>(r.tokens).subspan(b * block_size, block_size)));
  }
  return keys[block];
}

// Prefill/decode roles: the prompt blocks a prefill replica sent are in this replica's
// first tier (or on their way): the directory learns them, so admission loads them. A
// block that has not landed fails its load, and the request computes it.
void tier_part::added(request& r) {
  if (!directory_) return;
  for (int32_t b = 0; b < r.params.kv_from / cfg_.kv.block_size; ++b) directory_->add(key_of(r, b, cfg_.kv.block_size));
}

// The tokens of r's prompt the tiers hold, in whole blocks from the start (never the last
// token: its logits are wanted).
int32_t tier_part::prefix(request& r) {
  if (!directory_) return 0;
  const int32_t bs = cfg_.kv.block_size;
  const int32_t max_blocks = (r.num_tokens() - 1) / bs;
  int32_t n = 0;
  while (n < max_blocks && directory_->contains(key_of(r, n, bs))) ++n;
  if (n < max_blocks && probe_ && !r.tiers.probed) {
    r.tiers.probed = true;
    key_of(r, max_blocks - 1, bs);
    const size_t found = probe_(std::span<const tier_key>(r.tiers.keys).subspan(n, max_blocks - n));
    for (size_t i = 0; i < found && n < max_blocks; ++i) directory_->add(r.tiers.keys[n++]);
  }
  return n * bs;
}

void tier_part::claim(step_draft&, request& r, kv_claim& c) {
  if (c.admit)
    c.tier_tokens = prefix(r);
  else
    c.loads_landed = r.tiers.loads_landed;
}

// An admission's blocks the pool lacked are loaded first, the step's tokens after them.
void tier_part::granted(step_draft& d, request& r, const kv_grant& g, bool admit) {
  if (!admit) {
    r.tiers.loads_landed = false;  // (the block manager has heard)
    return;
  }
  const int32_t bs = cfg_.kv.block_size;
  r.tiers.saved = g.first / bs;
  if (g.loads == 0 || !directory_) return;
  TROUPE_ASSERT(g.loads <= g.first / bs && g.first / bs <= static_cast<int32_t>(r.blocks.size()), g.loads);
  for (int32_t b = g.first / bs - g.loads; b < g.first / bs; ++b)
    d.plan.tier_loads.push_back({r.id, r.blocks[b], key_of(r, b, bs)});
  r.tiers.loads_in_flight = true;
  usage_.loaded_blocks += g.loads;
  usage_.loaded_tokens += static_cast<uint64_t>(g.loads) * bs;
}

// The blocks r's known tokens fill up to `end` are copied down after the step, unless the
// tiers hold them already.
void tier_part::planned(step_draft& d, request& r, scheduled_chunk&, int32_t end) {
  if (!directory_ || !r.blocks_by_content()) return;
  const int32_t bs = cfg_.kv.block_size;
  const int32_t full = std::min(end / bs, static_cast<int32_t>(r.blocks.size()));
  for (int32_t b = r.tiers.saved; b < full; ++b) {
    const tier_key& k = key_of(r, b, bs);
    if (directory_->contains(k)) continue;
    d.plan.tier_saves.push_back({r.id, r.blocks[b], k});
    directory_->add(k);
    ++usage_.saved_blocks;
  }
  r.tiers.saved = std::max(r.tiers.saved, full);
}

// Requests still waiting after this plan: the blocks of their prompts the tiers hold are
// read up into the first tier while the plan runs, so that their loads, when admitted,
// are copies from memory (a few requests a plan, each once).
void tier_part::end_step(step_draft& d, const std::deque<request*>& waiting) {
  if (!directory_ || !cfg_.tier_prefetch) return;
  const int32_t bs = cfg_.kv.block_size;
  int asked = 0;
  for (request* r : waiting) {
    if (asked == 4) break;
    if (r->tiers.prefetched) continue;
    r->tiers.prefetched = true;
    ++asked;
    const int32_t n = prefix(*r) / bs;
    for (int32_t b = 0; b < n; ++b) d.plan.tier_prefetch.push_back(r->tiers.keys[static_cast<size_t>(b)]);
  }
}

// Some block of request `id` was gone or corrupt: forget what it loaded and saved (it
// computes it all again; nothing of its step is kept).
void tier_part::forget_failed(const step_plan& plan, request_id id) {
  ++usage_.failed_loads;
  for (const tier_move& l : plan.tier_loads) {
    if (l.id != id) continue;
    directory_->forget(l.key);
    --usage_.loaded_blocks;  // (computed after all)
    usage_.loaded_tokens -= static_cast<uint64_t>(cfg_.kv.block_size);
  }
  for (const tier_move& sv : plan.tier_saves)
    if (sv.id == id) directory_->forget(sv.key);
}

tier_usage tier_part::usage() const {
  tier_usage u = usage_;
  u.directory = directory_ ? directory_->size() : 0;
  return u;
}

}  // namespace troupe

// tier_part: the KV tiers in the scheduler (engine/kv/kv_tiers.hpp; the interface:
// scheduler_part.hpp). A directory of the blocks the tiers are taken to hold, by content
// address: an admission's prefix found there is loaded rather than computed (its claim's
// tier_tokens; the loads go first in the plan), the blocks a step fills are copied down
// after it, and the prefixes of requests still waiting are read up meanwhile (prefetch).
// A load that fails sends its request back to compute it all (settle).
//
// Where the tiers meet other features: only blocks filled while a request's blocks are
// named by content are saved (request::blocks_by_content, KV eviction); the blocks a
// prefill replica sent this decode replica are in its first tier (added: kv_from).
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "engine/kv/tier_directory.hpp"
#include "engine/sched/scheduler_part.hpp"

namespace troupe {

struct scheduler_config;

// KV tiers, as the scheduler saw them: blocks it had loaded and saved, and loads that came
// back failed (the block gone or corrupt in every tier: its request was computed again).
struct tier_usage {
  uint64_t loaded_blocks = 0;  // loads that landed
  uint64_t failed_loads = 0;   // requests
  uint64_t saved_blocks = 0;
  uint64_t loaded_tokens = 0;  // prompt tokens served by the tiers (loads that landed)
  size_t directory = 0;        // blocks the directory holds now
};

class tier_part final : public scheduler_part {
 public:
  explicit tier_part(const scheduler_config& cfg);

  // The content address of r's full block `block` (the chain of its tokens' blocks from
  // its namespace's root), computed as far as needed and kept in r.tiers.keys.
  static const tier_key& key_of(request& r, int32_t block, int32_t block_size);

  void added(request& r) override;
  void claim(step_draft& d, request& r, kv_claim& c) override;
  void granted(step_draft& d, request& r, const kv_grant& g, bool admit) override;
  void planned(step_draft& d, request& r, scheduled_chunk& c, int32_t end) override;
  void end_step(step_draft& d, const std::deque<request*>& waiting) override;
  void requeued(request& r) override { r.tiers.loads_in_flight = r.tiers.loads_landed = false; }

  // The requests of `plan` whose loads failed in some shard (scheduler::settle_tier_loads):
  // the directory forgets what they loaded and saved. Returns those running, which go
  // back to waiting; the others' loads have landed.
  template <class Find>  // request* (request_id)
  std::vector<request*> settle(const step_plan& plan, std::span<const request_id> failed, Find&& find);

  using probe_fn = std::function<size_t(std::span<const tier_key>)>;
  void set_probe(probe_fn p) { probe_ = std::move(p); }
  tier_usage usage() const;

 private:
  int32_t prefix(request& r);
  void forget_failed(const step_plan& plan, request_id id);

  const scheduler_config& cfg_;
  std::optional<tier_directory> directory_;  // when there are tiers
  probe_fn probe_;
  tier_usage usage_;
};

template <class Find>
std::vector<request*> tier_part::settle(const step_plan& plan, std::span<const request_id> failed, Find&& find) {
  std::vector<request*> back;
  for (const tier_move& m : plan.tier_loads) {
    request* r = find(m.id);
    if (!r || !r->tiers.loads_in_flight) continue;
    r->tiers.loads_in_flight = false;
    if (std::find(failed.begin(), failed.end(), m.id) == failed.end()) {
      r->tiers.loads_landed = true;
      continue;
    }
    forget_failed(plan, m.id);
    if (r->state == request_state::running) back.push_back(r);
  }
  return back;
}

}  // namespace troupe

// eviction_part: KV eviction in the scheduler, each request's cache kept within its budget
// (engine/kv/kv_eviction.hpp; the interface: scheduler_part.hpp).
//
// Before a running request claims a step, its policy drops what the step's new positions
// would put past the budget: a planned_compaction, made before the step's tokens, taken
// back if the request gets no grant this step. Its chunks are the same in any batch (a
// prompt chunk ends at the budget or at the most a step computes; output it already has
// goes one token a step), so that what its policy sees, and drops, is too. The attention
// its slots receive comes back with the step (observe); what is dropped from the cache is
// counted (evicted_tokens).
#pragma once

#include <span>
#include <vector>

#include "engine/sched/scheduler_part.hpp"

namespace troupe {

struct scheduler_config;

class eviction_part final : public scheduler_part {
 public:
  explicit eviction_part(const scheduler_config& cfg) : cfg_(cfg) {}

  status check(const request_params& p) const override;
  std::optional<int64_t> cache_bound(const request_params& p) const override;
  bool past_context(const request_params& p) const override { return config_of(p).rope_in_cache(); }
  void added(request& r) override { r.eviction.config = config_of(r.params); }

  void begin_step(step_draft&) override { taken_.clear(); }
  int32_t whole_chunk(const request& r, bool admit) const override;
  void claim(step_draft& d, request& r, kv_claim& c) override;
  void planned(step_draft&, request& r, scheduled_chunk& c, int32_t) override;
  void dropped(step_draft& d, request& r) override;
  void end_step(step_draft& d, const std::deque<request*>&) override;
  void requeued(request& r) override {
    r.eviction.evicted = 0;
    r.eviction.kept.clear();
  }

  // The attention the slots of the plan just applied received (scheduler::observe_attention).
  template <class Find>  // request* (request_id)
  void observe(const step_plan& plan, std::span<const float> sums, int32_t heads, Find&& find) {
    for (const scheduled_chunk& c : plan.chunks) {
      if (!c.attention) continue;
      std::span<const float> mass = sums.first(static_cast<size_t>(c.attention_sums()));
      sums = sums.subspan(mass.size());
      if (request* r = find(c.id); r && r->eviction.wants_attention() && r->state == request_state::running)
        observe(c, *r, mass, heads);
    }
  }
  uint64_t evicted_tokens() const { return evicted_tokens_; }
  // The running requests under a budget, their budgets and the tokens their caches hold.
  struct usage {
    uint32_t requests = 0;
    uint64_t budget_tokens = 0;
    uint64_t held_tokens = 0;
  };
  usage now(std::span<request* const> running) const;

 private:
  const kv_eviction_config& config_of(const request_params& p) const;
  int32_t step_limit(const request& r, bool admit) const;
  static int32_t room_wanted(const request& r);
  void make_room(step_draft& d, request& r, int32_t wanted);
  int32_t out_of_window(const request& r) const;
  void window_of(request& r, scheduled_chunk& c);
  void observe(const scheduled_chunk& c, request& r, std::span<const float> mass, int32_t heads);

  const scheduler_config& cfg_;
  uint64_t evicted_tokens_ = 0;
  // What each request that compacts in the step being planned knew of its cache before.
  struct kept_before {
    request* r;  // (a request leaving the plan is dropped() first)
    kv_eviction_state kept;
    int32_t evicted = 0;
  };
  std::vector<kept_before> taken_;
};

}  // namespace troupe

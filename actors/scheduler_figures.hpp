// scheduler_figures: what a scheduler says of its work when the router polls it
// (metrics_atom): its prefix cache, speculative decoding, KV eviction and KV tiers. A
// typed message (CAF inspect), so that neither side reads a figure by its place in a
// list. Counters count from the scheduler's start; the router adds what a replica's
// earlier schedulers counted (add_counters), so that a restart never takes a counter back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace troupe {

// Speculative decoding (engine/serve/step_choices.hpp's spec_tally).
struct speculation_figures {
  uint64_t verifies = 0;  // request steps that verified drafts
  uint64_t proposed = 0;  // drafted tokens verified
  uint64_t accepted = 0;  // of which the model accepted
  std::vector<uint64_t> by_accepted;  // verifies by drafts accepted: [n] for n = 0 .. max_draft_tokens
  // By depth d (index d - 1: a chain's d-th draft, a tree's d-th level, Medusa's head d):
  // verifies whose drafts reached it, and those that kept a draft there.
  std::vector<uint64_t> offered_at, kept_at;

  speculation_figures& operator+=(const speculation_figures& o) {
    verifies += o.verifies;
    proposed += o.proposed;
    accepted += o.accepted;
    add(by_accepted, o.by_accepted);
    add(offered_at, o.offered_at);
    add(kept_at, o.kept_at);
    return *this;
  }

 private:
  static void add(std::vector<uint64_t>& to, const std::vector<uint64_t>& from) {
    if (to.size() < from.size()) to.resize(from.size());
    for (size_t i = 0; i < from.size(); ++i) to[i] += from[i];
  }
};

// KV eviction (engine/kv/kv_eviction.hpp).
struct eviction_figures {
  uint64_t evicted_tokens = 0;  // counter: tokens dropped from requests' caches
  // Now: running requests under a budget, their budgets and the tokens they hold, summed.
  uint64_t requests = 0, budget_tokens = 0, held_tokens = 0;
};

// KV tiers, as the scheduler plans them (engine/kv/kv_tiers.hpp).
struct tier_plan_figures {
  uint64_t loaded_tokens = 0;  // counter: prompt tokens loaded instead of computed
  uint64_t failed_loads = 0;   // counter: requests whose loads failed (computed again)
  uint64_t saved_blocks = 0;   // counter: blocks copied down
  uint64_t directory = 0;      // now: blocks its directory holds
};

struct scheduler_figures {
  uint32_t cached = 0;          // now: KV blocks holding a cached prefix
  uint64_t hit_tokens = 0;      // counter: prompt tokens served by the prefix cache
  uint64_t queried_tokens = 0;  // counter: prompt tokens looked up in it
  std::string spec_method = "none";
  speculation_figures spec;
  eviction_figures eviction;
  tier_plan_figures tiers;
};

// A scheduler's counters added to `base` (the figures of "now" left alone): what a
// replica's scheduler counted before it was replaced.
inline void add_counters(scheduler_figures& base, const scheduler_figures& gone) {
  base.hit_tokens += gone.hit_tokens;
  base.queried_tokens += gone.queried_tokens;
  base.spec += gone.spec;
  base.eviction.evicted_tokens += gone.eviction.evicted_tokens;
  base.tiers.loaded_tokens += gone.tiers.loaded_tokens;
  base.tiers.failed_loads += gone.tiers.failed_loads;
  base.tiers.saved_blocks += gone.tiers.saved_blocks;
}

// The figures to report: a replica's earlier counters (base) with its scheduler's now.
inline scheduler_figures with_counters(const scheduler_figures& base, const scheduler_figures& now) {
  scheduler_figures all = now;
  add_counters(all, base);
  return all;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, speculation_figures& x) {
  return f(caf::meta::type_name("troupe::speculation_figures"), x.verifies, x.proposed, x.accepted, x.by_accepted,
           x.offered_at, x.kept_at);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, eviction_figures& x) {
  return f(caf::meta::type_name("troupe::eviction_figures"), x.evicted_tokens, x.requests, x.budget_tokens, x.held_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_plan_figures& x) {
  return f(caf::meta::type_name("troupe::tier_plan_figures"), x.loaded_tokens, x.failed_loads, x.saved_blocks,
           x.directory);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scheduler_figures& x) {
  return f(caf::meta::type_name("troupe::scheduler_figures"), x.cached, x.hit_tokens, x.queried_tokens, x.spec_method,
           x.spec, x.eviction, x.tiers);
}

}  // namespace troupe

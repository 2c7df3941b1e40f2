// The scheduler's smaller feature parts (the interface: scheduler_part.hpp): speculative
// decoding's drafts, the prefill/decode handoff and SLO classes. KV eviction and the KV
// tiers have files of their own (eviction_part.hpp, tier_part.hpp).
#pragma once

#include "engine/sched/scheduler_part.hpp"
#include "engine/sched/slo.hpp"

namespace troupe {

struct scheduler_config;

// Speculative decoding (engine/speculative/speculative.hpp): a decode step claims room for
// the drafts its proposer will fill (draft_state::wanted, set before each plan); drafts are
// the first thing a request short of blocks gives up; the drafts a step verified are gone
// once it is applied, or dropped with it.
class speculation_part final : public scheduler_part {
 public:
  status check(const request_params& p) const override {
    if (p.speculative < -1 || p.speculative > max_draft_tokens)
      return error{"speculative drafts per step must be in 0.." + std::to_string(max_draft_tokens) +
                   " (or -1: the engine's)"};
    return ok();
  }
  void claim(step_draft&, request& r, kv_claim& c) override {
    if (!c.admit && r.num_tokens() - r.num_computed_tokens == 1) c.speculative = r.drafts.wanted;
  }
  bool shrink(request& r) override {
    if (r.drafts.wanted == 0) return false;
    r.drafts.wanted = 0;
    return true;
  }
  void applied(request& r) override { forget(r); }
  // (Its step in flight, whose drafts these were, is dropped: a lost stage.)
  void requeued(request& r) override { forget(r); }

 private:
  static void forget(request& r) {
    r.drafts.tokens.clear();
    r.drafts.q.clear();
    r.drafts.parents.clear();
  }
};

// Prefill/decode roles (request_params::kv_to): a prefill-only request's prompt blocks go
// to its decode replica as its steps fill them (kv_pushes), and it ends after its first
// token, handed off. Only blocks named by content travel (request::blocks_by_content):
// under KV eviction the decode replica computes the rest of the prompt under its own
// eviction, as this one did.
class handoff_part final : public scheduler_part {
 public:
  explicit handoff_part(const scheduler_config& cfg) : cfg_(cfg) {}
  status check(const request_params& p) const override;
  void planned(step_draft& d, request& r, scheduled_chunk& c, int32_t end) override;
  finish_reason ends_after(request& r, step_output& out) override;
  void requeued(request& r) override { r.handoff.pushed = 0; }

 private:
  const scheduler_config& cfg_;
};

// SLO classes (engine/sched/slo.hpp): a request's class and the deadline of its first
// token, which order the queue (scheduler::key_of).
class slo_part final : public scheduler_part {
 public:
  explicit slo_part(const scheduler_config& cfg) : cfg_(cfg) {}
  // The class a request's parameters name (-1: none), or an error.
  expected<int32_t> class_of(const request_params& p) const;
  status check(const request_params& p) const override;
  void added(request& r) override;

 private:
  const scheduler_config& cfg_;
};

}  // namespace troupe

// scheduler_part: a feature's part of the scheduler, and the points of a request's life
// and of a step's planning at which the scheduler's core calls it.
//
// The core (scheduler.cpp) queues requests, claims KV blocks for them step by step,
// preempts when blocks run short and applies sampled tokens; it knows no feature. Each
// feature that changes what a request claims or what a plan carries is a part: it owns
// its state of each request (a struct of its own in request.hpp) and is called, every
// part in turn and in a fixed order, at these points:
//
//   add        check()       the request's parameters, as far as the feature reads them
//              cache_bound() the most slots its cache holds, where the feature bounds it
//              past_context() whether its positions may pass the model's context
//              added()       the request is made; the part sets its state of it
//   each step  begin_step()
//              whole_chunk() the positions its step computes all at once, if any: the core
//                            claims for it only where the step's budget has them
//              claim()       its claim is written (the core's fields set): the part makes
//                            what room it needs and sets its own fields
//              shrink()      its claim found no blocks: a part may ask for less instead of
//                            a request being preempted (drafts)
//              granted()     it got its blocks (the grant), an admission or not
//              planned()     a chunk of it joins the plan
//              dropped()     it leaves the plan being made (preempted, or it can never fit)
//              end_step()    the plan is whole; the parts add what the step also carries
//   results    applied()     the step's tokens were applied to it
//              ends_after()  a token was appended: whether that ends it (and how)
//   requeue    requeued()    it went back to waiting, its cache gone: state about its
//                            cache goes too
//
// Order: eviction, speculation, tiers, handoff, SLO classes. Eviction claims first, since
// its compaction decides the slots the others see. Where two features meet, the meeting
// is written once: request::blocks_by_content (eviction against the tiers and the
// prefill/decode handoff), tier_part::added (what a prefill replica sent is in the
// decode replica's first tier).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/kv/kv_block_manager.hpp"
#include "engine/sched/step_plan.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

// A step being planned.
struct step_draft {
  step_plan plan;
  int32_t budget = 0;
  size_t share = 0;                            // chunks this plan may take
  bool admitting = true;                       // waiting requests may still be admitted
  bool done = false;
  std::unordered_set<request_id> blocked;      // out of blocks, with only requests in flight
                                               // to give way: they wait for the next step
  std::vector<std::pair<request_id, bool>> sent;  // the last claims: id, admission
};

class scheduler_part {
 public:
  virtual ~scheduler_part() = default;

  // add(): an error refuses the request (nothing queued), in the client's words.
  virtual status check(const request_params&) const { return ok(); }
  // add(): the most slots the request's cache holds (its prompt and a token need that
  // many blocks at once), where the feature bounds it.
  virtual std::optional<int64_t> cache_bound(const request_params&) const { return std::nullopt; }
  // Whether the request's positions may pass the model's context (a request with output
  // delivered up to the context otherwise ends at once).
  virtual bool past_context(const request_params&) const { return false; }
  virtual void added(request&) {}

  virtual void begin_step(step_draft&) {}
  virtual int32_t whole_chunk(const request&, bool /*admit*/) const { return 0; }
  virtual void claim(step_draft&, request&, kv_claim&) {}
  virtual bool shrink(request&) { return false; }
  // (r.blocks is its table with the grant.)
  virtual void granted(step_draft&, request&, const kv_grant&, bool /*admit*/) {}
  // The chunk's known tokens end at `end`.
  virtual void planned(step_draft&, request&, scheduled_chunk&, int32_t /*end*/) {}
  virtual void dropped(step_draft&, request&) {}
  // `waiting`: the requests still waiting, in scheduling order.
  virtual void end_step(step_draft&, const std::deque<request*>& /*waiting*/) {}

  virtual void applied(request&) {}
  virtual finish_reason ends_after(request&, step_output&) { return finish_reason::none; }
  virtual void requeued(request&) {}
};

}  // namespace troupe

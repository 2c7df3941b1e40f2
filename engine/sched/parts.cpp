#include "engine/sched/parts.hpp"

#include <algorithm>
#include <limits>

#include "engine/sched/scheduler.hpp"
#include "engine/sched/tier_part.hpp"

namespace troupe {

status handoff_part::check(const request_params& p) const {
  if (p.kv_to.size() > 64) return error{"a decode replica's name is 64 bytes at most"};
  if (p.kv_from < 0 || p.kv_from > static_cast<int64_t>(p.prompt.size()))
    return error{"kv_from must be within the prompt's " + std::to_string(p.prompt.size()) + " tokens"};
  return ok();
}

// The prompt's whole blocks go as the step fills them, those the prefix cache had with the
// first chunk. Sent after the step, before its answer, so a handed-off request's KV has
// landed when the router hears of it.
void handoff_part::planned(step_draft& d, request& r, scheduled_chunk&, int32_t end) {
  if (r.params.kv_to.empty() || !r.blocks_by_content()) return;
  const int32_t bs = cfg_.kv.block_size;
  const int32_t full = std::min(end, r.num_prompt_tokens) / bs;
  for (int32_t b = r.handoff.pushed; b < full; ++b) {
    // A block the prefix cache shares with another request of this plan goes once to each
    // replica.
    const bool planned = std::any_of(d.plan.kv_pushes.begin(), d.plan.kv_pushes.end(), [&](const tier_move& m) {
      return m.block == r.blocks[b] && m.to == r.params.kv_to;
    });
    if (!planned) d.plan.kv_pushes.push_back({r.id, r.blocks[b], tier_part::key_of(r, b, bs), r.params.kv_to});
  }
  r.handoff.pushed = std::max(r.handoff.pushed, full);
}

// Prefill only: its decode replica goes on from its first token.
finish_reason handoff_part::ends_after(request& r, step_output& out) {
  if (r.params.kv_to.empty()) return finish_reason::none;
  out.handed_off = true;
  out.kv_sent = r.handoff.pushed * cfg_.kv.block_size;
  return finish_reason::length;
}

expected<int32_t> slo_part::class_of(const request_params& p) const {
  if (p.slo_class.empty()) return cfg_.default_class;
  const int32_t k = slo_class_index(cfg_.classes, p.slo_class);
  if (k >= 0) return k;
  if (cfg_.classes.empty()) return error{"class '" + p.slo_class + "': this deployment has no SLO classes"};
  return error{"class '" + p.slo_class + "' does not exist (the classes: " + slo_class_names(cfg_.classes) + ")"};
}

status slo_part::check(const request_params& p) const {
  auto k = class_of(p);
  if (!k) return error{k.err().message};
  return ok();
}

void slo_part::added(request& r) {
  const int32_t k = class_of(r.params).value();
  r.slo.cls = k;
  r.slo.deadline_ms = k >= 0 && cfg_.classes[k].ttft_ms > 0 ? r.params.arrival_ms + cfg_.classes[k].ttft_ms
                                                           : std::numeric_limits<double>::infinity();
}

}  // namespace troupe

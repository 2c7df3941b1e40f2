// step_path: the work of one step around its forward pass, the same for the engine
// loop (llm_engine) and the scheduler actor. A step runs in this order:
//
//   1. plan_drafts   each decoding request's draft slots (speculation), then the caller
//                    has the scheduler plan the step (schedule(), or the actor's claims
//                    to its kv manager);
//   2. draft         preempted requests are forgotten; a proposer here fills the slots,
//                    or the order for a proposer elsewhere comes back for the caller to
//                    send (the actor's draft actor), its answer taken with take_drafts;
//   3. ready         the token trees verified last step move their KV with this one
//                    (compactions before its chunks; the engine loop moves them at once),
//                    and the feature rows heads read;
//   4. (the caller)  the forward pass: a shard in this process, or the pipeline's stages
//                    over messages; the KV tiers' loads and saves where the shards are;
//   5. settle_loads  requests whose tier loads failed go back to compute;
//      tokens_*      the step's tokens, from the ids the shard chose or from the logits
//                    (each request's sampler chooses or verifies its drafts);
//      finish        each verified tree's kept path, the features to the heads, the
//                    speculation figures, the scheduler's update, and the attention each
//                    slot received to the requests' eviction policies.
//
// The two callers differ only in how a step's work reaches the shards; every feature of
// a step (speculation by every proposer, token trees, eviction, tiers) is wired here once.
// Not thread-safe: the caller's thread (the engine's, or the actor's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/sched/scheduler.hpp"
#include "engine/serve/step_choices.hpp"
#include "engine/speculative/draft_exchange.hpp"
#include "engine/speculative/heads.hpp"
#include "engine/speculative/speculative.hpp"
#include "engine/speculative/tree_keeper.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

class step_path {
 public:
  // Where a replica's drafts come from: a proposer here (`here`), or one elsewhere
  // (`elsewhere`: orders and answers, carried by the caller), or none (spec disabled).
  struct drafts {
    speculative_config spec;
    std::unique_ptr<proposer> here;
    bool elsewhere = false;
    int32_t max_tree_depth = max_draft_tokens;  // how deep a chosen tree may grow
  };

  // The KV moves of verified trees go with their requests' next steps unless `now` is
  // given: where the shard is in this process (the engine loop), a move made at once,
  // before anything drafts over a cache the proposer shares with it (early exit); for
  // such a proposer, a plan's eviction compactions are made at once too.
  using mover = std::function<void(const planned_compaction&)>;
  step_path(scheduler& sched, const model_config& m, drafts d, mover now = {});

  // The proposers that run beside a replica's scheduler wherever it runs: n-gram lookup,
  // and trained heads (`heads`, loaded; run on `pool`). Null for the others (a draft model,
  // early exit), which need a shard of their own.
  static std::unique_ptr<proposer> beside_scheduler(const speculative_config& spec, const model& target,
                                                    const speculative_heads* heads, thread_pool* pool);
  // How deep a tree chosen by acceptance may grow: a Medusa head file's depth.
  static int32_t max_tree_depth(const speculative_config& spec, const speculative_heads* heads);

  // 1. Before the scheduler plans: draft slots for the requests that decode next, none
  // when `available` is false (the proposer elsewhere is missing).
  void plan_drafts(bool available);

  // 2. The plan is made. Preempted requests are forgotten; a proposer here fills the
  // plan's draft slots. With drafts elsewhere, the order for them (none when no chunk has
  // slots, or `available` is false: the plan goes without drafts).
  std::optional<draft_order> draft(step_plan& plan, bool available = true);
  // The answer to the order, taken into `plan`; an answer that does not fit is an error,
  // and then give_up(plan) with a new session.
  status take_drafts(step_plan& plan, draft_answer a);
  // The plan goes without drafts elsewhere (the exchange failed): every request's copy
  // there starts afresh with `session`.
  void give_up(step_plan& plan, uint64_t session);

  // 3. Before the plan goes out: trees verified last step join its compactions. Returns,
  // per chunk, how many of its last rows' features the heads read (empty: none).
  std::vector<int32_t> ready(step_plan& plan);

  // 5. The step is back.
  // KV tiers: the requests whose loads failed go back to compute before anything of
  // theirs is sampled.
  void settle_loads(const step_plan& plan, std::span<const request_id> failed);
  // The tokens, one per logit row, that the shard chose (step_choices.hpp).
  step_tokens tokens_chosen(const step_plan& plan, std::span<const int32_t> chosen);
  // The tokens chosen here from logits [row][vocab] (penalties applied in place).
  step_tokens tokens_from_logits(const step_plan& plan, float* logits, int32_t vocab);
  // Records the step: trees' kept paths, features (`features`: [plan.num_tokens][dim] by
  // batch row, or empty), figures, the scheduler's update, eviction's attention sums.
  // What each request got, as scheduler::update_from_output gives it; finished requests
  // are forgotten.
  std::vector<step_output> finish(const step_plan& plan, step_tokens& got, std::span<const float> attention,
                                  std::span<const float> features);
  // `features` as the last stage returns them (`wanted` rows per chunk, as ready() gave
  // them), in their places by batch row.
  std::span<const float> spread_features(const step_plan& plan, std::span<const int32_t> wanted,
                                         std::span<const float> features);

  // The request ended or lost its KV (finished, aborted, preempted, its load failed).
  void forget(request_id id);
  // The proposers' copies of every request start afresh: here, and elsewhere with
  // `session` (the proposer elsewhere restarted, or its block ids are given out anew).
  void restart_drafts(uint64_t session = 0);
  // Every request's KV is gone (a lost shard, a recovery): drafts start afresh
  // (restart_drafts), and no tree moves.
  void reset(uint64_t session = 0);

  bool speculates() const { return drafts_.spec.enabled(); }
  bool drafts_elsewhere() const { return drafts_.elsewhere; }
  proposer* proposer_here() { return drafts_.here.get(); }
  uint64_t session() const { return orders_.session(); }
  const spec_tally& tally() const { return tally_; }

 private:
  scheduler& sched_;
  const model_config& m_;
  drafts drafts_;
  std::optional<tree_keeper> trees_;
  draft_orders orders_;
  std::vector<draft_slot> slots_;
  // Verified trees' accepted paths, moved with their requests' next steps.
  std::unordered_map<request_id, planned_compaction> tree_moves_;
  mover move_now_;
  std::vector<float> features_;  // by batch row (scratch)
  spec_tally tally_;
};

}  // namespace troupe

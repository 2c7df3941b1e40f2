// scheduler: continuous batching as a step function (vLLM v1's contract).
//
//   schedule()            decides what the next step computes: every running request
//                         closes its gap (num_tokens - num_computed_tokens) as far as a
//                         per-step token budget allows (a decode token, or a prefill
//                         chunk), then waiting requests are admitted, their cached prefix
//                         counted as computed; when KV blocks run out, the lowest-priority
//                         running request is preempted (its blocks released; it recomputes
//                         later from its tokens and produces the same tokens).
//   update_from_output()  applies the sampled tokens of that step: appends them, streams
//                         their text, applies stop conditions, releases finished requests'
//                         blocks (caching their prefixes), and returns each request's news.
//
// Several plans may be in flight at once (a pipeline of P stages keeps up to P steps
// busy): a request whose step has not come back is left out of the next plans and is
// never preempted; results must be applied in the order the plans were made.
//
// KV blocks come from a block manager through claims (kv_block_manager::grant): the
// scheduler owns one (schedule() plans a step in one call), or, with remote_kv set, the
// block manager lives elsewhere (a kv manager actor) and a step is planned as an
// exchange:
//
//   step_draft d = s.begin_step();
//   while (auto claims = s.next_claims(d)) s.apply(d, <the block manager's grants>);
//   step_plan plan = s.end_step(d);
//
// Usually one round: the claims of every request that can run, running ones first; more
// only when blocks run short (a request is preempted and its blocks released, then the
// rest is claimed again) or prefix hits left budget over. None when every claim stays
// inside the blocks its request holds without filling one (most decode steps): nothing
// changes at the block manager, so the scheduler grants those itself. Blocks released by
// finished, aborted or preempted requests travel with the next claims (take_releases()
// hands them over when no step follows).
//
// Features (KV eviction, speculation's drafts, the KV tiers, the prefill/decode handoff,
// SLO classes) are parts (scheduler_part.hpp) that the core calls at fixed points of a
// request's life and of a step's planning; the core itself branches on none.
//
// Policies: FCFS (arrival order) or priority (lower first, then arrival). Under SLO classes
// (engine/sched/slo.hpp): the class's priority (lower first), then the deadline of the first
// token, then arrival; with slo_admission, a request whose class's targets the replica
// cannot meet now, by its measured step times, is refused (slo_refusal) before it queues.
// Single-threaded; owned by one engine loop.
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/kv/kv_block_manager.hpp"
#include "engine/kv/kv_config.hpp"
#include "engine/sched/eviction_part.hpp"
#include "engine/sched/parts.hpp"
#include "engine/sched/slo.hpp"
#include "engine/sched/step_plan.hpp"
#include "engine/sched/tier_part.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

enum class schedule_policy : uint8_t { fcfs, priority };

struct scheduler_config {
  int32_t max_step_tokens = 512;  // tokens per step, decode and prefill together
  int32_t max_running = 64;       // requests in a step at most
  schedule_policy policy = schedule_policy::fcfs;
  kv_config kv;                   // the pool: blocks, their size, prefix caching
  int32_t context = 0;            // longest sequence (the model's context)
  int32_t vocab = 0;              // token ids must be below this
  int32_t micro_batches = 1;      // plans share the requests this many ways (pipelines of
                                  // P stages keep P plans in flight)
  bool remote_kv = false;         // the block manager is elsewhere: plan steps with
                                  // begin_step / next_claims / apply / end_step
  kv_eviction_config eviction;    // KV eviction: each request's cache within a budget,
                                  // unless the request names its own
  std::string no_eviction;        // non-empty: why KV eviction cannot run here (requests
                                  // that ask for it are refused with this)
  int32_t sliding_window = 0;     // the model's attention window in positions (0: none):
                                  // under KV eviction, slots out of it go first, and each
                                  // token's window is found among the kept slots
  size_t tier_blocks = 0;         // KV tiers: blocks the tiers are taken to hold (the
                                  // directory's size); 0: no tiers
  bool tier_prefetch = false;     // KV tiers: plans name waiting requests' blocks, for the
                                  // shards to read up from the lower tiers meanwhile
  std::vector<slo_class> classes; // SLO classes requests may name; with any, the queue is
                                  // ordered by priority, deadline, arrival
  int32_t default_class = -1;     // the class of a request that names none (-1: none)
  bool slo_admission = false;     // refuse what cannot meet its class's targets
};

class scheduler {
 public:
  scheduler(const scheduler_config& cfg, const tokenizer& tok);
  scheduler(const scheduler&) = delete;  // (its parts hold its configuration)
  scheduler& operator=(const scheduler&) = delete;

  // Queues a request; an error (duplicate id, empty or too long prompt, bad token ids,
  // bad sampling parameters) leaves nothing queued.
  status add(request_id id, request_params params);
  // With slo_admission: why a request of these parameters cannot meet its class's targets
  // here now (the prompt tokens queued before it and its own at the measured step times;
  // its cached prefix is not known yet, so all of its prompt counts), or nullopt. A request
  // with output already delivered (moved off a lost replica) is never refused.
  std::optional<std::string> slo_refusal(const request_params& p) const;
  // A step that computed `tokens` positions took `ms` (the estimates' measure).
  void observe_step(int32_t tokens, double ms) { slo_.observe(tokens, ms); }
  const slo_estimator& slo() const { return slo_; }

  // Ends a request at once, releasing its blocks; its final output, or nullopt if unknown.
  std::optional<step_output> abort(request_id id);

  // Forgets every computed KV block (a stage lost its cache): running requests go back to
  // waiting with their tokens kept, the prefix cache empties, nothing is in flight. The
  // plans in flight must be dropped, never applied. Returns how many requests were sent
  // back.
  size_t reset_kv();
  // Requests whose last max_lost_steps steps were each lost with the replica's state (a
  // plan a stage refuses every time, a step that always times out): recomputing them would
  // fail the same way again, so the caller ends them (abort) with an error.
  static constexpr int32_t max_lost_steps = 4;
  std::vector<request_id> doomed() const;

  // Plans a step with the block manager the scheduler owns (remote_kv off).
  step_plan schedule();

  // Planning a step against a block manager elsewhere (see above). A draft dropped half
  // way (a lost stage) must be followed by reset_kv(). A request must not be aborted
  // between next_claims() and the plan going out: its granted blocks are in the prefix
  // cache from the claim on, another request of the step may share them, and only its
  // step computes them (the scheduler actor defers such aborts: end_request).
  step_draft begin_step();
  std::optional<kv_step_request> next_claims(step_draft& d);
  void apply(step_draft& d, kv_step_grants grants);
  step_plan end_step(step_draft& d);
  // Requests whose blocks the remote block manager may free, if no claims carry them.
  std::vector<request_id> take_releases() { return std::exchange(releases_, {}); }
  // The remote block manager's figures, as its latest answer gave them (the caller of
  // apply() passes them on; apply() looks at the grants only).
  void set_kv_usage(const kv_usage& u) { remote_usage_ = u; }
  // samples: the sampled chunks' tokens, in order, emitted[i] of them for the i-th (empty:
  // one each). A chunk that verified drafts emits the accepted ones and one more; the KV
  // of the accepted ones counts as computed, the rest of its draft slots as never written.
  std::vector<step_output> update_from_output(const step_plan& plan, std::span<sample_result> samples,
                                              std::span<const int32_t> emitted = {});
  // KV tiers, before update_from_output: the requests of `plan` whose loads failed in some
  // shard. Those go back to waiting, computing what they had loaded (their outputs of
  // this step are dropped) and the directory forgets their blocks; the others' loads
  // have landed.
  void settle_tier_loads(const step_plan& plan, std::span<const request_id> failed);
  // KV tiers that outlive the scheduler (a directory, Redis): asked, once per request whose
  // prompt the directory does not cover, how many of the keys given (from the first) they
  // hold. Those join the directory.
  using tier_probe = std::function<size_t(std::span<const tier_key>)>;
  void set_tier_probe(tier_probe p) { tiers_.set_probe(std::move(p)); }
  tier_usage tiers_now() const { return tiers_.usage(); }
  // KV eviction: the attention the slots of the step just applied received, its chunks'
  // sums one after the other (plan.attention_sums() of them), each summed over its last
  // attention_mass_queries tokens and `heads` softmax rows a token (query heads times
  // layers). Each request's policy decides what to keep from these; slots past what it
  // kept, such as rejected drafts', are ignored.
  void observe_attention(const step_plan& plan, std::span<const float> sums, int32_t heads);

  request* find(request_id id);
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  std::span<request* const> running() const { return running_; }  // in scheduling order
  // Requests to run, or outputs decided without a step that the next one delivers.
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty() || !pending_.empty(); }
  // Block figures now; prefix-cache token counts since construction (reset_kv included).
  kv_usage usage() const {
    kv_usage u = kv_ ? kv_->usage() : remote_usage_;
    u.queried_tokens += queried_before_reset_;
    u.hit_tokens += hits_before_reset_;
    return u;
  }
  const scheduler_config& config() const { return cfg_; }
  // KV eviction: tokens dropped from requests' caches so far.
  uint64_t evicted_tokens() const { return eviction_.evicted_tokens(); }
  // KV eviction now: the running requests under a budget, their budgets and the tokens
  // their caches hold, summed.
  using eviction_usage = eviction_part::usage;
  eviction_usage eviction_now() const { return eviction_.now(running_); }

 private:
  // Scheduling order: priority (the class's, under classes; else under the priority
  // policy), then deadline (under classes), then arrival.
  struct queue_key {
    int32_t priority = 0;
    double deadline_ms = 0;
    uint64_t arrival = 0;
  };
  queue_key key_of(const request& r) const {
    return {r.slo.cls >= 0 ? cfg_.classes[r.slo.cls].priority : r.params.priority, r.slo.deadline_ms, r.arrival};
  }
  bool before(const queue_key& a, const queue_key& b) const;
  bool before(const request& a, const request& b) const { return before(key_of(a), key_of(b)); }
  // Whether a request's positions may pass the model's context (a part's say: streaming
  // eviction's RoPE positions are slots, which its budget bounds).
  bool past_context(const request_params& p) const;
  void requeue(request& r);
  void release(request& r);
  void preempt(step_draft& d, request& r);
  void add_chunk(step_draft& d, request& r, int32_t first, int32_t count);
  void out_of_blocks(step_draft& d, request& r);
  bool grant_here(step_draft& d, const kv_step_request& q);
  int32_t whole_chunk(const request& r, bool admit) const;
  step_output finish(request& r, finish_reason why);
  void insert_waiting(request* r);

  scheduler_config cfg_;
  const tokenizer& tok_;
  std::optional<kv_block_manager> kv_;  // unless remote_kv
  std::vector<request_id> releases_;     // for the remote block manager
  kv_usage remote_usage_;
  std::unordered_map<request_id, std::unique_ptr<request>> requests_;
  std::deque<request*> waiting_;   // in scheduling order
  std::vector<request*> running_;  // in scheduling order
  uint64_t next_arrival_ = 0;
  std::vector<step_output> pending_;  // outputs decided outside a step (out of memory, a
                                      // resubmission with its whole output delivered)
  uint64_t queried_before_reset_ = 0, hits_before_reset_ = 0;
  slo_estimator slo_;
  // The features' parts, called in this order (scheduler_part.hpp).
  eviction_part eviction_{cfg_};
  speculation_part speculation_;
  tier_part tiers_{cfg_};
  handoff_part handoff_{cfg_};
  slo_part classes_{cfg_};
  std::array<scheduler_part*, 5> parts_{&eviction_, &speculation_, &tiers_, &handoff_, &classes_};
};

}  // namespace troupe

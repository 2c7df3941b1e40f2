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
// Policies: FCFS (arrival order) or priority (lower first, then arrival). Single-threaded;
// owned by one engine loop.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/kv/kv_block_manager.hpp"
#include "engine/sched/step_plan.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

enum class schedule_policy : uint8_t { fcfs, priority };

struct scheduler_config {
  int32_t max_step_tokens = 512;  // tokens per step, decode and prefill together
  int32_t max_running = 64;       // requests in a step at most
  schedule_policy policy = schedule_policy::fcfs;
  uint32_t num_blocks = 1024;     // KV blocks in the pool
  int32_t block_size = 16;        // tokens per KV block
  bool prefix_caching = true;
  int32_t context = 0;            // longest sequence (the model's context)
  int32_t vocab = 0;              // token ids must be below this
  int32_t micro_batches = 1;      // plans share the requests this many ways (pipelines of
                                  // P stages keep P plans in flight)
};

class scheduler {
 public:
  scheduler(const scheduler_config& cfg, const tokenizer& tok);

  // Queues a request; an error (duplicate id, empty or too long prompt, bad token ids,
  // bad sampling parameters) leaves nothing queued.
  status add(request_id id, request_params params);
  // Ends a request at once, releasing its blocks; its final output, or nullopt if unknown.
  std::optional<step_output> abort(request_id id);

  // Forgets every computed KV block (a stage lost its cache): running requests go back to
  // waiting with their tokens kept, the prefix cache empties, nothing is in flight. The
  // plans in flight must be dropped, never applied. Returns how many requests were sent
  // back.
  size_t reset_kv();

  step_plan schedule();
  std::vector<step_output> update_from_output(const step_plan& plan, std::span<sample_result> samples);

  request* find(request_id id);
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  // Block figures now; prefix-cache token counts since construction (reset_kv included).
  kv_usage usage() const {
    kv_usage u = kv_.usage();
    u.queried_tokens += queried_before_reset_;
    u.hit_tokens += hits_before_reset_;
    return u;
  }
  const kv_block_manager& kv() const { return kv_; }
  const scheduler_config& config() const { return cfg_; }

 private:
  bool before(const request& a, const request& b) const;  // scheduling order
  void requeue(request& r);
  void preempt(request& r, step_plan& plan);
  step_output finish(request& r, finish_reason why);
  void insert_waiting(request* r);

  scheduler_config cfg_;
  const tokenizer& tok_;
  kv_block_manager kv_;
  std::unordered_map<request_id, std::unique_ptr<request>> requests_;
  std::deque<request*> waiting_;   // in scheduling order
  std::vector<request*> running_;  // in scheduling order
  uint64_t next_arrival_ = 0;
  std::vector<step_output> pending_;  // outputs decided in schedule() (out of memory)
  uint64_t queried_before_reset_ = 0, hits_before_reset_ = 0;
};

}  // namespace troupe

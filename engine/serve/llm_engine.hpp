// llm_engine: the serving loop of one engine instance, in one thread: the scheduler
// decides a step, one shard with every layer runs it, each request's sampler picks its
// token, and the scheduler applies the results. The scheduler and kv manager actors
// drive the same pieces across processes; this loop is what they do inside one.
//
// API (one thread at a time): add_request, abort, step. step() returns what each request
// got: its new tokens, the text that became final, and whether it finished.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/forward/transformer_shard.hpp"
#include "engine/sched/scheduler.hpp"
#include "kernels/common/aligned.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

struct engine_config {
  scheduler_config sched;  // context and vocab are filled from the model when zero
  int32_t num_threads = 1;
  std::optional<dtype> kv_type;  // the KV cache's: f32, f16 or q8_0 (default: the
                                 // model's, transformer_shard::kv_type_for)
};

struct engine_stats {
  uint64_t steps = 0;
  uint64_t tokens_computed = 0;   // every token a forward pass processed
  uint64_t prompt_tokens_computed = 0;
  uint64_t preemptions = 0;
};

class llm_engine {
 public:
  llm_engine(const model& m, const tokenizer& tok, engine_config cfg);

  status add_request(request_id id, request_params params);
  std::optional<step_output> abort(request_id id);
  std::vector<step_output> step();
  // Forgets the KV cache (as after losing a shard): running requests recompute.
  size_t reset_kv() { return sched_.reset_kv(); }

  bool has_unfinished() const { return sched_.has_unfinished(); }
  size_t num_waiting() const { return sched_.num_waiting(); }
  size_t num_running() const { return sched_.num_running(); }
  kv_usage kv() const { return sched_.usage(); }
  const engine_stats& stats() const { return stats_; }
  const scheduler_config& config() const { return sched_.config(); }

 private:
  static engine_config complete(engine_config cfg, const model& m);

  const model& model_;
  engine_config cfg_;
  scheduler sched_;
  thread_pool pool_;
  kv_cache cache_;
  no_collective solo_;
  transformer_shard shard_;
  engine_stats stats_;
  step_batch batch_;
  aligned_vector<float> hidden_, logits_;
  std::vector<sample_result> samples_;
};

}  // namespace troupe

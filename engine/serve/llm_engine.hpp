// llm_engine: the serving loop of one engine instance, in one thread: the scheduler
// decides a step, one shard with every layer runs it (on the CPU, or on a GPU: see
// on_gpu), each request's sampler picks its token, and the scheduler applies the
// results. With speculative decoding (engine_config::spec), a proposer drafts tokens for
// the requests that decode, the step computes them too, and each sampler verifies its
// request's drafts (engine/speculative/speculative.hpp). A step is step_path.hpp's, the
// scheduler actor's too: the two differ only in how the step reaches the shards (here, a
// call to the one shard; there, messages through the pipeline's stages).
//
// API (one thread at a time): add_request, abort, step. step() returns what each request
// got: its new tokens, the text that became final, and whether it finished.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/forward/forward_shard.hpp"
#include "engine/forward/shard_tiers.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/serve/step_choices.hpp"
#include "engine/serve/step_path.hpp"
#include "engine/speculative/speculative.hpp"
#include "kernels/common/aligned.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

// The forward pass on a GPU: a shard with every layer on device cuda:`device`, its
// weights in `weights` (f32, bf16 or f16; quantized checkpoints dequantized on the host
// first) and its KV cache in device memory, the scheduler's blocks by the same ids.
struct gpu_placement {
  int device = 0;
  dtype weights = dtype::bf16;
};

struct engine_config {
  scheduler_config sched;  // context and vocab are filled from the model when zero
  int32_t num_threads = 1;
  std::optional<dtype> kv_type;  // the CPU KV cache's: f32, f16 or q8_0 (default: the
                                 // model's, kv_cache_type_for)
  speculative_config spec;       // speculative decoding (engine/speculative/speculative.hpp)
  const model* draft = nullptr;  // the draft model, loaded, for spec.method draft
  const speculative_heads* heads = nullptr;  // the head file, loaded, for medusa and eagle
};

struct engine_stats {
  uint64_t steps = 0;
  uint64_t tokens_computed = 0;   // every token a forward pass processed
  uint64_t prompt_tokens_computed = 0;
  uint64_t preemptions = 0;
  spec_tally spec;                // speculative decoding: verifies, drafts proposed and
                                  // accepted, by drafts accepted (a tree's: its path's
                                  // depth) and by depth
  uint64_t evicted_tokens = 0;   // KV eviction: tokens dropped from requests' caches
};

class llm_engine {
 public:
  // On the CPU, with cfg.num_threads threads. A speculative configuration that does not
  // fit the model (validate, check_draft), or KV tiers that cannot be opened, throw
  // std::invalid_argument: check it first with llm_engine::check.
  llm_engine(const model& m, const tokenizer& tok, engine_config cfg);
  // Whether cfg's speculative decoding fits m (and its draft); the problem in words.
  static status check(const model& m, const engine_config& cfg);
  // Why KV eviction cannot run for m with speculation s, on CPU or GPU shards (nullopt: it
  // can): a deployment default that asks for it is refused, and so is each request.
  static std::optional<std::string> why_no_eviction(const speculative_config& s);
  // On the GPU `where` names; an error when its shard cannot be made there (this build has
  // no CUDA, no such device, not enough device memory). Tokens are chosen on the device
  // where step_choices.hpp's rule allows, else on the host as on the CPU.
  static expected<std::unique_ptr<llm_engine>> on_gpu(const model& m, const tokenizer& tok, engine_config cfg,
                                                      gpu_placement where);
  // Over a shard made elsewhere (on_gpu's, or a test's): it runs every layer of m, and its
  // KV cache holds cfg.sched.num_blocks blocks of cfg.sched.block_size positions.
  llm_engine(const model& m, const tokenizer& tok, engine_config cfg, std::unique_ptr<forward_shard> shard);

  status add_request(request_id id, request_params params);
  std::optional<step_output> abort(request_id id);
  std::vector<step_output> step();
  // Forgets the KV cache (as after losing a shard): running requests recompute.
  size_t reset_kv() {
    steps_->reset();
    return sched_.reset_kv();
  }

  bool has_unfinished() const { return sched_.has_unfinished(); }
  size_t num_waiting() const { return sched_.num_waiting(); }
  size_t num_running() const { return sched_.num_running(); }
  kv_usage kv() const { return sched_.usage(); }
  const engine_stats& stats() const { return stats_; }
  // KV tiers: the scheduler's figures, and each tier's (empty without tiers).
  tier_usage tiers() const { return sched_.tiers_now(); }
  std::vector<tier_stats> tier_figures() const { return tiers_ ? tiers_->tiers().stats() : std::vector<tier_stats>{}; }
  // Waits for the tiers' background writes (tests; a clean stop).
  void flush_tiers() {
    if (tiers_) tiers_->tiers().flush();
  }
  const scheduler_config& config() const { return sched_.config(); }

 private:
  static engine_config complete(engine_config cfg, const model& m);
  void start_speculation(transformer_shard* cpu_shard);
  void fill_batch(const step_plan& plan);

  const model& model_;
  engine_config cfg_;
  scheduler sched_;
  thread_pool pool_;
  std::unique_ptr<kv_cache> cache_;  // the CPU shard's, when made here
  no_collective solo_;
  std::unique_ptr<forward_shard> shard_;
  std::unique_ptr<shard_tiers> tiers_;  // KV tiers, for the CPU shard
  engine_stats stats_;
  step_batch batch_;
  aligned_vector<float> hidden_, logits_;
  std::vector<int32_t> chosen_, tokens_;
  std::vector<float> mass_;  // KV eviction: the attention sums, chunk after chunk
  std::vector<std::vector<int32_t>> tree_parents_;  // per chunk, a token tree's, as the batch has them
  std::optional<step_path> steps_;  // the step around the forward pass (made once the shard is)
};

}  // namespace troupe

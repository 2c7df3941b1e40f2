// model_proposer: drafts from a model run token by token, every request of the step in
// one batch per drafted position.
//
//   draft model:  a smaller model with the target's vocabulary, with a KV cache of its own
//                 laid out in the target's block ids, so each request's block table (which
//                 the scheduler sizes for its drafts too) serves both. It remembers which
//                 tokens its cache holds for each request and catches up from where they
//                 stop matching (after a prompt, after rejected drafts).
//   early exit:   the target's own first L layers, then its final norm and classifier. It
//                 shares the target's KV for those layers where the target's shard is at
//                 hand (the engine loop): the target computed them for every known token,
//                 and rewrites a drafted token's slots when it verifies. Where the target
//                 runs elsewhere (the scheduler actor's stages), it keeps a cache of its own
//                 for those L layers, as a draft model does.
//
// Under KV eviction (draft_slot::slot_positions) the draft follows the target's slots:
// each of its cache's slots holds the token the target's slot holds, at the same RoPE
// position. A cache of its own makes each of the target's compactions too (compacted), so
// its kept keys stay the ones it computed; it compares what each slot holds with the
// target's layout and computes from the first slot that differs (the tokens since its
// last drafts, or, where a compaction was not passed on, from there). Kept positions are
// not contiguous, so such a catch-up goes in runs of consecutive positions, as sequences
// of one step over the same block table (a CPU shard writes a layer's keys for every token
// before any attends). Sharing the target's cache, it drafts after the step's compactions
// are made (shares_target_kv).
//
// Drafts are chosen as the request's sampler would choose from the draft's logits (its
// penalties and biases, over the sequence and the drafts so far): greedy takes the argmax,
// sampling draws from that distribution with the request's draft stream and hands the
// distribution to verification.
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/forward/kv_cache.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "engine/speculative/speculative.hpp"
#include "kernels/common/aligned.hpp"

namespace troupe {

class model_proposer final : public proposer {
 public:
  // A draft model over num_blocks blocks of block_size positions (the target's pool).
  model_proposer(const model& draft, int32_t num_blocks, int32_t block_size, dtype kv_type, thread_pool& pool);
  // Early exit from the target's shard after exit_layer layers.
  model_proposer(const model& target, transformer_shard& shard, int32_t exit_layer);
  // Early exit after the target's first exit_layer layers, with a cache of their own.
  model_proposer(const model& target, int32_t exit_layer, int32_t num_blocks, int32_t block_size, dtype kv_type,
                 thread_pool& pool);

  void propose(std::span<draft_slot> slots) override;
  void forget(request_id id) override { held_.erase(id); }
  void forget_all() override { held_.clear(); }
  bool shares_target_kv() const override { return !own_kv_; }
  void compacted(request_id id, const kv_compaction& c) override;

 private:
  const model& model_;
  std::unique_ptr<kv_cache> cache_;          // a draft model's own
  no_collective solo_;
  std::unique_ptr<transformer_shard> own_;   // a draft model's shard
  std::function<void(const step_batch&, float*, float*)> run_;
  bool own_kv_;
  // What one slot of a request's cache holds: a token at a RoPE position.
  struct held_slot {
    int32_t token = 0;
    int32_t rope = 0;
    bool operator==(const held_slot&) const = default;
  };
  // The slots a request's known tokens take in the target's cache (draft_slot).
  static void layout_of(const draft_slot& s, std::vector<held_slot>& out);
  // Round 0 of a request: its slots from the first its cache does not hold as the target
  // does, to its last known token's, in runs of consecutive RoPE positions.
  void catch_up(const draft_slot& s);

  // A cache of its own: per request, what each slot holds, from slot 0.
  std::unordered_map<request_id, std::vector<held_slot>> held_;
  std::vector<held_slot> layout_;
  std::vector<int32_t> run_tokens_;
  step_batch batch_;
  aligned_vector<float> hidden_, logits_;
  std::vector<sampler> views_;  // each slot's sampler, advanced over its drafts
  std::vector<float> greedy_;   // a greedy request's distribution (one-hot)
};

}  // namespace troupe

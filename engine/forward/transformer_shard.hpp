// transformer_shard: runs a range of a Llama model's layers, for one tensor-parallel
// slice, over a step_batch. Pipeline parallelism gives each stage a layer range; tensor
// parallelism gives each shard of a stage a slice; one shard with every layer and
// slice {0, 1} is the whole model.
//
//   hidden: [num_tokens][dim] activations, in place. The first stage (first_layer == 0)
//           fills it from the token embedding; later stages receive it from the previous.
//   logits: [num_logits][vocab] for the sequences that want logits, in batch order;
//           produced by the last stage's rank-0 shard (other shards may pass nullptr).
//
// The shard borrows the model, its KV cache, a thread pool and the collective of its
// stage; all must outlive it. One thread calls forward() at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/forward/collective.hpp"
#include "engine/forward/forward_shard.hpp"
#include "engine/forward/kv_cache.hpp"
#include "engine/forward/step_batch.hpp"
#include "engine/forward/tp_slice.hpp"
#include "engine/model/model.hpp"
#include "engine/util/expected.hpp"
#include "kernels/common/aligned.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

class transformer_shard final : public forward_shard {
 public:
  transformer_shard(const model& m, const shard_spec& spec, kv_cache& kv, thread_pool& pool,
                    collective& comm);

  void forward(const step_batch& batch, float* hidden, float* logits) override;
  // Self-speculation by early exit: the first exit_layer layers (writing their KV, the
  // same values forward() writes for the same tokens), then the final norm and the
  // classifier. A first-stage shard of one slice {0, 1} with at least exit_layer layers
  // (every layer, or only the first ones: an early-exit draft's own).
  void forward_early_exit(const step_batch& batch, float* hidden, float* logits, int32_t exit_layer);

  bool compact_kv(const kv_compaction& c) override {
    compact(c);
    return true;
  }
  bool is_first_stage() const override { return spec_.first_layer == 0; }
  bool is_last_stage() const override { return spec_.end_layer == cfg_.num_layers; }
  const shard_spec& spec() const override { return spec_; }

  // The cache shape this shard needs for num_blocks blocks of block_size tokens.
  static kv_cache_shape cache_shape(const model_config& c, const shard_spec& spec,
                                    int32_t num_blocks, int32_t block_size, dtype kv_type = dtype::f32);
  // How the CPU shards run the model on this machine, for operators: "q8_0 weights with
  // int8 activations (AMX and VNNI), F16 KV cache", "f32 weights, F32 KV cache", ...
  // (with kv_type, the cache named is that one).
  static std::string cpu_kernels(const model& m, std::optional<dtype> kv_type = std::nullopt);

 private:
  struct sliced_layer {
    const float* attn_norm;
    const float* ffn_norm;
    matrix_view wq, wk, wv, wo, w1, w2, w3;
    const float *bq, *bk, *bv;  // this slice's q/k/v biases, or null
  };

  void run(const step_batch& batch, float* hidden, float* logits, int32_t num_layers, bool head);
  void run_layer(int32_t idx, const step_batch& batch, float* hidden);
  void run_head(const step_batch& batch, const float* hidden, float* logits);
  void add_attention(const step_batch& batch);
  void compact(const kv_compaction& c);

  const model& model_;
  const model_config& cfg_;
  shard_spec spec_;
  kv_cache& kv_;
  thread_pool& pool_;
  collective& comm_;
  // On CPUs with VNNI, the q8_0 views of layers_ and classifier_ point to packed copies
  // the model keeps.
  std::vector<sliced_layer> layers_;  // [end_layer - first_layer]
  matrix_view classifier_;
  int32_t local_heads_, local_kv_heads_, local_hidden_;
  std::vector<float> rope_cos_, rope_sin_;  // [max_seq_len][rope_dim / 2]
  std::vector<float> rope_freqs_;           // [rope_dim / 2]

  // Scratch, grown to the largest step seen.
  aligned_vector<float> xb_, q_, k_, v_, att_, proj_, gate_, up_;
  std::vector<attention_token> att_tokens_;
  std::vector<int32_t> rope_at_;  // each token's RoPE position
  std::vector<uint32_t> tables_;  // the step's block tables, for att_tokens_
  // KV eviction's attention figures: every token's softmax weights for a layer, and each
  // sequence's sums (at mass_at_[sequence], -1 for one that wants none).
  aligned_vector<float> weights_;
  std::vector<float> mass_;
  std::vector<int64_t> mass_at_;
};

}  // namespace troupe

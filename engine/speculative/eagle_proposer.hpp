// eagle_proposer: drafts from an EAGLE head (heads.hpp): one decoder layer that runs
// autoregressively over the target's features.
//
// Per request it keeps the layer's keys and values for the pairs (f_j, token j + 1) it has
// fed, and the target's features it has seen but not fed (observe). Drafting for a request
// of n tokens feeds every pair up to j = n - 2 (the target's own features: these stay),
// whose output predicts f_{n-1}; the target's final norm and classifier turn it into draft
// 0 (token n). Each further draft feeds the predicted feature with the draft before it, at
// the next position; those keys and values are dropped once the drafts are made, since the
// target's features replace them after verification. A request's features must arrive in
// order: a gap (positions the target did not compute here: a prefix from the cache, KV
// from a tier) starts its layer's history afresh from the first feature after it, and
// drafting goes on from there. Requests are drafted one after another (the layer is small
// beside the target).
#pragma once

#include <unordered_map>
#include <vector>

#include "engine/speculative/heads.hpp"
#include "engine/speculative/speculative.hpp"
#include "kernels/common/aligned.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

class eagle_proposer final : public proposer {
 public:
  eagle_proposer(const model& target, const speculative_heads& heads, thread_pool& pool);

  void propose(std::span<draft_slot> slots) override;
  bool wants_features() const override { return true; }
  bool wants_every_feature() const override { return true; }
  void observe(request_id id, int32_t first, const float* features, int32_t n) override;
  void forget(request_id id) override { states_.erase(id); }
  void forget_all() override { states_.clear(); }

 private:
  struct state {
    int32_t first = 0;            // the position of the first pair fed
    int32_t fed = 0;              // pairs in k and v: positions first .. first + fed - 1
    std::vector<float> k, v;      // [fed][kv_dim], and drafts' rows while drafting
    std::vector<float> pending;   // [.][dim]: features from position first + fed on
    std::vector<float> last_fed;  // [dim]: the feature of the last pair fed
    // One past the last position with a feature.
    int32_t end(size_t dim) const { return first + fed + static_cast<int32_t>(pending.size() / dim); }
  };

  // Runs the layer over pairs at positions pos .. pos + n - 1 of request s (input: [n][2
  // dim], features then embeddings), appending their keys and values; out: [n][dim].
  void run_layer(state& s, const float* input, int32_t n, int32_t pos, float* out);
  // The logits of predicted features: the target's final norm and classifier.
  void head(const float* feature, float* logits);

  const model& target_;
  const eagle_layer& w_;
  thread_pool& pool_;
  int32_t dim_, q_dim_, kv_dim_, ffn_;
  std::vector<float> cos_, sin_;  // [context][head_dim / 2]
  std::unordered_map<request_id, state> states_;
  aligned_vector<float> in_, x_, xb_, q_, k_, v_, att_, gate_, up_, out_, normed_, logits_;
  std::vector<float> scores_, greedy_, feature_;  // feature_: the prediction drafting feeds back
};

}  // namespace troupe

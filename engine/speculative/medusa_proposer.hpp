// medusa_proposer: drafts from Medusa heads (heads.hpp) on the target's last hidden state.
//
// The target's feature at position n - 2 (the one whose logits chose token n - 1, the
// request's last) goes through the final norm; head i's residual blocks and the target's
// classifier then guess token n + i. All heads of all requests run as one GEMM per block
// and one through the classifier; each guess is chosen as the request's sampler would
// choose (choose_draft), in order. A request whose feature at n - 2 the proposer has not
// seen (its step computed elsewhere, its KV restored from a tier) gets no drafts that step.
#pragma once

#include <unordered_map>
#include <vector>

#include "engine/speculative/heads.hpp"
#include "engine/speculative/speculative.hpp"
#include "kernels/common/aligned.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

class medusa_proposer final : public proposer {
 public:
  medusa_proposer(const model& target, const speculative_heads& heads, thread_pool& pool);

  void propose(std::span<draft_slot> slots) override;
  bool wants_features() const override { return true; }
  void observe(request_id id, int32_t first, const float* features, int32_t n) override;
  void forget(request_id id) override { last_.erase(id); }
  void forget_all() override { last_.clear(); }

 private:
  struct last_feature {
    int32_t position = -1;
    std::vector<float> feature;  // [dim]
  };

  const model& target_;
  const speculative_heads& heads_;
  thread_pool& pool_;
  std::unordered_map<request_id, last_feature> last_;
  aligned_vector<float> x_, y_, logits_;
  std::vector<float> greedy_;
};

}  // namespace troupe

#include "engine/speculative/medusa_proposer.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/rmsnorm.hpp"

namespace troupe {

medusa_proposer::medusa_proposer(const model& target, const speculative_heads& heads, thread_pool& pool)
    : target_(target), heads_(heads), pool_(pool) {}

void medusa_proposer::observe(request_id id, int32_t first, const float* features, int32_t n) {
  if (n <= 0) return;
  const int32_t dim = target_.config.dim;
  last_feature& l = last_[id];
  l.position = first + n - 1;
  l.feature.assign(features + int64_t{n - 1} * dim, features + int64_t{n} * dim);
}

void medusa_proposer::propose(std::span<draft_slot> slots) {
  const int32_t dim = target_.config.dim, vocab = target_.config.vocab_size;
  const auto heads = static_cast<int32_t>(heads_.medusa.size());
  // Which slots draft, and how many heads each runs.
  std::vector<int32_t> runs(slots.size(), 0);
  std::vector<const float*> feature(slots.size(), nullptr);
  int32_t rows = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    draft_slot& s = slots[i];
    s.tokens.clear();
    s.q.clear();
    const auto it = last_.find(s.req->id);
    if (it == last_.end() || it->second.position != s.req->num_tokens() - 2) continue;
    runs[i] = std::min(s.max_tokens, heads);
    feature[i] = it->second.feature.data();
    rows += runs[i];
  }
  if (rows == 0) return;
  // Row r of x_ is head h's state for slot i; rows of one head are contiguous, so each of
  // its blocks is one GEMM.
  x_.resize(static_cast<size_t>(rows) * dim);
  y_.resize(static_cast<size_t>(rows) * dim);
  std::vector<int32_t> head_first(static_cast<size_t>(heads) + 1, 0);
  std::vector<int32_t> row_of(slots.size() * static_cast<size_t>(heads), -1);
  int32_t r = 0;
  for (int32_t h = 0; h < heads; ++h) {
    head_first[h] = r;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (runs[i] <= h) continue;
      rmsnorm(x_.data() + int64_t{r} * dim, feature[i], target_.weights.final_norm, dim, target_.config.rms_eps);
      row_of[i * heads + h] = r++;
    }
  }
  head_first[heads] = r;
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t n = head_first[h + 1] - head_first[h];
    if (n == 0) continue;
    float* x = x_.data() + int64_t{head_first[h]} * dim;
    float* y = y_.data() + int64_t{head_first[h]} * dim;
    for (const medusa_block& b : heads_.medusa[h].blocks) {
      gemm(x, dim, n, b.w, y, dim, pool_);
      for (int64_t t = 0; t < n; ++t)
        for (int32_t c = 0; c < dim; ++c) {
          const float z = y[t * dim + c] + b.bias[c];
          x[t * dim + c] += z / (1.0f + std::exp(-z));
        }
    }
  }
  logits_.resize(static_cast<size_t>(rows) * vocab);
  const auto& own = heads_.medusa[0].classifier;
  if (!own) {
    gemm(x_.data(), dim, rows, target_.weights.classifier, logits_.data(), vocab, pool_);
  } else {
    for (int32_t h = 0; h < heads; ++h)
      if (const int32_t n = head_first[h + 1] - head_first[h]; n > 0)
        gemm(x_.data() + int64_t{head_first[h]} * dim, dim, n, *heads_.medusa[h].classifier,
             logits_.data() + int64_t{head_first[h]} * vocab, vocab, pool_);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (runs[i] == 0) continue;
    sampler view = slots[i].req->smp;
    for (int32_t h = 0; h < runs[i]; ++h)
      draft_next(slots[i], view, logits_.data() + int64_t{row_of[i * heads + h]} * vocab, vocab, greedy_);
  }
}

}  // namespace troupe

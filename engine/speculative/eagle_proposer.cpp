#include "engine/speculative/eagle_proposer.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/silu_mul.hpp"
#include "kernels/cpu/softmax.hpp"

namespace troupe {

eagle_proposer::eagle_proposer(const model& target, const speculative_heads& heads, thread_pool& pool)
    : target_(target), w_(heads.eagle), pool_(pool) {
  const model_config& c = target.config;
  dim_ = c.dim;
  q_dim_ = c.q_dim();
  kv_dim_ = c.kv_dim();
  ffn_ = w_.gate.rows;
  const int32_t half = c.head_dim / 2;
  // Drafts run past the last known position by at most max_draft_tokens.
  const int32_t positions = c.max_seq_len + max_draft_tokens;
  cos_.resize(static_cast<size_t>(positions) * half);
  sin_.resize(cos_.size());
  const std::vector<float> freqs = rope_frequencies(c);
  rope_table(cos_.data(), sin_.data(), positions, c.head_dim, freqs.data(), rope_attention_factor(c));
}

void eagle_proposer::observe(request_id id, int32_t first, const float* features, int32_t n) {
  if (n <= 0) return;
  state& s = states_[id];
  const size_t d = static_cast<size_t>(dim_);
  const int32_t end = s.end(d);
  if (end == s.first || first < s.first || first > end) {
    // A gap, or positions before everything held: afresh from here.
    s.first = first;
    s.fed = 0;
    s.k.clear();
    s.v.clear();
    s.pending.clear();
  } else if (first < s.first + s.fed) {  // computed again (after a preemption): unfeed
    s.fed = first - s.first;
    s.k.resize(static_cast<size_t>(s.fed) * kv_dim_);
    s.v.resize(s.k.size());
    s.pending.clear();
  } else {
    s.pending.resize(static_cast<size_t>(first - s.first - s.fed) * d);
  }
  s.pending.insert(s.pending.end(), features, features + static_cast<size_t>(n) * d);
}

void eagle_proposer::head(const float* feature, float* logits) {
  normed_.resize(static_cast<size_t>(dim_));
  rmsnorm(normed_.data(), feature, target_.weights.final_norm, dim_, target_.config.rms_eps);
  gemm(normed_.data(), dim_, 1, target_.weights.classifier, logits, target_.config.vocab_size, pool_);
}

void eagle_proposer::run_layer(state& s, const float* input, int32_t n, int32_t pos, float* out) {
  const model_config& c = target_.config;
  const int32_t hd = c.head_dim, heads = c.num_heads, group = c.num_heads / c.num_kv_heads;
  const size_t rows = static_cast<size_t>(n);
  x_.resize(rows * dim_);
  xb_.resize(rows * dim_);
  q_.resize(rows * q_dim_);
  k_.resize(rows * kv_dim_);
  v_.resize(rows * kv_dim_);
  att_.resize(rows * q_dim_);
  gate_.resize(rows * ffn_);
  up_.resize(rows * ffn_);
  gemm(input, 2 * dim_, n, w_.fc, x_.data(), dim_, pool_);
  for (size_t t = 0; t < rows; ++t)
    for (int32_t i = 0; i < dim_; ++i) x_[t * dim_ + i] += w_.fc_bias[i];
  for (size_t t = 0; t < rows; ++t) rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, w_.attn_norm, dim_, c.rms_eps);
  const gemm_output qkv[] = {{&w_.wq, q_.data(), q_dim_}, {&w_.wk, k_.data(), kv_dim_}, {&w_.wv, v_.data(), kv_dim_}};
  gemm_multi(xb_.data(), dim_, n, qkv, 3, pool_);
  const size_t half = static_cast<size_t>(hd / 2);
  for (size_t t = 0; t < rows; ++t) {
    const size_t p = static_cast<size_t>(pos) + t;
    rope(q_.data() + t * q_dim_, heads, hd, hd, cos_.data() + p * half, sin_.data() + p * half, rope_layout::halves);
    rope(k_.data() + t * kv_dim_, c.num_kv_heads, hd, hd, cos_.data() + p * half, sin_.data() + p * half,
         rope_layout::halves);
  }
  const size_t before = s.k.size() / kv_dim_;  // rows held before these
  s.k.insert(s.k.end(), k_.begin(), k_.end());
  s.v.insert(s.v.end(), v_.begin(), v_.end());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (size_t t = 0; t < rows; ++t) {
    const size_t seen = before + t + 1;  // itself and every row before it
    scores_.resize(seen);
    for (int32_t h = 0; h < heads; ++h) {
      const float* q = q_.data() + t * q_dim_ + static_cast<size_t>(h) * hd;
      const size_t kvo = static_cast<size_t>(h / group) * hd;
      for (size_t j = 0; j < seen; ++j) {
        const float* k = s.k.data() + j * kv_dim_ + kvo;
        float dot = 0.0f;
        for (int32_t i = 0; i < hd; ++i) dot += q[i] * k[i];
        scores_[j] = dot * scale;
      }
      softmax(scores_.data(), static_cast<int32_t>(seen));
      float* o = att_.data() + t * q_dim_ + static_cast<size_t>(h) * hd;
      std::fill(o, o + hd, 0.0f);
      for (size_t j = 0; j < seen; ++j) {
        const float* v = s.v.data() + j * kv_dim_ + kvo;
        for (int32_t i = 0; i < hd; ++i) o[i] += scores_[j] * v[i];
      }
    }
  }
  gemm(att_.data(), q_dim_, n, w_.wo, xb_.data(), dim_, pool_);
  for (size_t i = 0; i < rows * dim_; ++i) x_[i] += xb_[i];
  for (size_t t = 0; t < rows; ++t) rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, w_.ffn_norm, dim_, c.rms_eps);
  const gemm_output ffn[] = {{&w_.gate, gate_.data(), ffn_}, {&w_.up, up_.data(), ffn_}};
  gemm_multi(xb_.data(), dim_, n, ffn, 2, pool_);
  silu_mul(gate_.data(), up_.data(), n * ffn_);
  gemm(gate_.data(), ffn_, n, w_.down, xb_.data(), dim_, pool_);
  for (size_t i = 0; i < rows * dim_; ++i) out[i] = x_[i] + xb_[i];
}

void eagle_proposer::propose(std::span<draft_slot> slots) {
  const int32_t vocab = target_.config.vocab_size;
  const size_t d = static_cast<size_t>(dim_);
  logits_.resize(static_cast<size_t>(vocab));
  for (draft_slot& slot : slots) {
    slot.tokens.clear();
    slot.q.clear();
    const request& r = *slot.req;
    const int32_t n = r.num_tokens();
    const auto it = states_.find(r.id);
    if (slot.max_tokens <= 0 || it == states_.end() || it->second.end(d) != n - 1) continue;
    state& s = it->second;
    if (s.pending.empty()) {  // drafted before and not verified since: feed its last pair again
      if (s.fed == 0) continue;
      --s.fed;
      s.k.resize(static_cast<size_t>(s.fed) * kv_dim_);
      s.v.resize(s.k.size());
      s.pending = s.last_fed;
    }
    // The pairs (f_j, token j + 1) not yet fed, up to j = n - 2.
    const int32_t from = s.first + s.fed, count = n - 1 - from;
    in_.resize(static_cast<size_t>(count) * 2 * d);
    out_.resize(static_cast<size_t>(count) * d);
    for (int32_t t = 0; t < count; ++t) {
      std::copy_n(s.pending.data() + static_cast<size_t>(t) * d, d, in_.data() + static_cast<size_t>(t) * 2 * d);
      embedding(target_.weights.token_embedding, r.tokens.data() + from + t + 1, 1,
                in_.data() + static_cast<size_t>(t) * 2 * d + d, dim_);
    }
    run_layer(s, in_.data(), count, from, out_.data());
    s.fed += count;
    s.last_fed.assign(s.pending.end() - static_cast<std::ptrdiff_t>(d), s.pending.end());
    s.pending.clear();
    // Draft 0 from the last output; each further one from the prediction before it.
    sampler view = r.smp;
    feature_.assign(out_.end() - static_cast<std::ptrdiff_t>(d), out_.end());
    in_.resize(2 * d);
    for (int32_t i = 0;; ++i) {
      head(feature_.data(), logits_.data());
      draft_next(slot, view, logits_.data(), vocab, greedy_);
      if (i + 1 >= slot.max_tokens) break;
      std::copy(feature_.begin(), feature_.end(), in_.begin());
      embedding(target_.weights.token_embedding, &slot.tokens.back(), 1, in_.data() + d, dim_);
      run_layer(s, in_.data(), 1, n - 1 + i, feature_.data());
    }
    s.k.resize(static_cast<size_t>(s.fed) * kv_dim_);  // the drafts' rows go
    s.v.resize(s.k.size());
  }
}

}  // namespace troupe

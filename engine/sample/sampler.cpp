#include "engine/sample/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "kernels/common/assert.hpp"
#include "kernels/cpu/argmax.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {

std::optional<std::string> validate(const sampling_params& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return "temperature must be a finite number >= 0";
  if (p.top_k < 0) return "top_k must be >= 0";
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return "top_p must be in (0, 1]";
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return "min_p must be in [0, 1]";
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    return "repetition_penalty must be a finite number > 0";
  if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2.0f)
    return "frequency_penalty must be in [-2, 2]";
  if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2.0f)
    return "presence_penalty must be in [-2, 2]";
  if (p.logprobs < -1 || p.logprobs > 20) return "logprobs must be in 0..20";
  if (p.logit_bias.size() > max_logit_bias)
    return "logit bias has " + std::to_string(p.logit_bias.size()) + " entries; at most " + std::to_string(max_logit_bias);
  std::unordered_set<int32_t> biased;
  for (const auto& b : p.logit_bias) {
    if (b.token < 0) return "logit bias: token id " + std::to_string(b.token) + " is negative";
    if (!(b.bias >= -100.0f && b.bias <= 100.0f)) return "logit bias: a bias must be in [-100, 100]";
    if (!biased.insert(b.token).second) return "logit bias: token " + std::to_string(b.token) + " appears twice";
  }
  return std::nullopt;
}

sampler::sampler(const sampling_params& p, std::span<const int32_t> prompt)
    : p_(p), rng_(p.seed) {
  for (int32_t t : prompt) ++seen_[t];
}

bool sampler::needs_only_logits() const {
  return p_.repetition_penalty == 1.0f && p_.frequency_penalty == 0.0f && p_.presence_penalty == 0.0f &&
         p_.logprobs < 0 && p_.logit_bias.empty();
}

token_choice sampler::next_choice() const {
  token_choice c{how(), 0.0f};
  if (p_.temperature != 0.0f) {
    rng ahead = rng_;
    c.u = ahead.uniform();
  }
  return c;
}

void sampler::replay(int32_t token) {
  if (p_.temperature != 0.0f) (void)rng_.uniform();  // draw() takes exactly one
  ++seen_[token];
  ++output_[token];
}

int32_t sampler::draw(const float* logits, int32_t vocab) {
  return troupe::sample(logits, vocab, how(), rng_.uniform(), scratch_);
}

void sampler::adjust_logits(float* logits, int32_t vocab) const {
  if (p_.repetition_penalty != 1.0f)
    for (auto [t, n] : seen_) {
      if (t < 0 || t >= vocab) continue;
      logits[t] = logits[t] > 0.0f ? logits[t] / p_.repetition_penalty
                                   : logits[t] * p_.repetition_penalty;
    }
  if (p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f)
    for (auto [t, n] : output_) {
      if (t < 0 || t >= vocab) continue;
      logits[t] -= static_cast<float>(n) * p_.frequency_penalty + p_.presence_penalty;
    }
  for (const auto& b : p_.logit_bias)
    if (b.token < vocab) logits[b.token] += b.bias;
}

void sampler::add_logprobs(const float* logits, int32_t vocab, sample_result& r) {
  if (p_.logprobs < 0) return;
  float max = logits[0];
  for (int32_t i = 1; i < vocab; ++i) max = std::max(max, logits[i]);
  double z = 0.0;
  for (int32_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(logits[i] - max));
  const float log_z = max + static_cast<float>(std::log(z));
  if (p_.logprobs > 0) {
    auto& candidates = scratch_.candidates;
    candidates.clear();
    for (int32_t i = 0; i < vocab; ++i) candidates.emplace_back(logits[i], i);
    const int32_t n = std::min(p_.logprobs, vocab);
    std::partial_sort(candidates.begin(), candidates.begin() + n, candidates.end(),
                      [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    r.top.clear();
    for (int32_t i = 0; i < n; ++i) r.top.push_back({candidates[i].second, candidates[i].first - log_z});
  }
  r.logprob = logits[r.token] - log_z;
}

sample_result sampler::sample(float* logits, int32_t vocab) {
  adjust_logits(logits, vocab);
  sample_result r;
  r.token = p_.temperature == 0.0f ? argmax(logits, vocab) : draw(logits, vocab);
  add_logprobs(logits, vocab, r);  // of the penalised logits, before temperature
  record(r.token);
  return r;
}

void sampler::distribution(float* logits, int32_t vocab, float* probs) {
  adjust_logits(logits, vocab);
  troupe::distribution(logits, vocab, how(), probs, scratch_);
}

std::vector<sample_result> sampler::verify(float* rows, int32_t vocab, std::span<const int32_t> draft,
                                           std::span<const float> q) {
  TROUPE_ASSERT(q.empty() || q.size() == draft.size() * static_cast<size_t>(vocab), q.size(), draft.size());
  std::vector<sample_result> out;
  for (size_t j = 0; j <= draft.size(); ++j) {
    float* row = rows + j * static_cast<size_t>(vocab);
    if (j == draft.size()) {  // every draft accepted: one more, as sample() chooses it
      out.push_back(sample(row, vocab));
      break;
    }
    const int32_t d = draft[j];
    TROUPE_ASSERT(d >= 0 && d < vocab, d, vocab);
    adjust_logits(row, vocab);
    sample_result r;
    bool accepted;
    if (p_.temperature == 0.0f) {
      r.token = argmax(row, vocab);
      accepted = r.token == d;
    } else {
      p_row_.resize(vocab);
      troupe::distribution(row, vocab, how(), p_row_.data(), scratch_);
      const float qd = q.empty() ? 1.0f : q[j * vocab + d];
      accepted = qd > 0.0f && rng_.uniform() * qd < p_row_[d];
      if (accepted) {
        r.token = d;
      } else {
        // The residual max(0, p - q), drawn from as draw() normalizes it.
        residual_.resize(vocab);
        float mass = 0.0f;
        for (int32_t i = 0; i < vocab; ++i) {
          const float qi = q.empty() ? (i == d ? 1.0f : 0.0f) : q[j * vocab + i];
          residual_[i] = std::max(0.0f, p_row_[i] - qi);
          mass += residual_[i];
        }
        // (p == q leaves nothing, and then rejection cannot happen but by rounding: p.)
        r.token = troupe::draw(mass > 0.0f ? residual_.data() : p_row_.data(), vocab, rng_.uniform());
      }
    }
    add_logprobs(row, vocab, r);
    record(r.token);
    out.push_back(std::move(r));
    if (!accepted) break;
  }
  return out;
}

std::vector<int32_t> sampler::ranked(float* logits, int32_t vocab, int32_t k) const {
  adjust_logits(logits, vocab);
  k = std::clamp(k, 0, vocab);
  // One pass, the best k kept in order (by logit, the lower id first among equals): a
  // token enters only past the k-th best, so most of a vocabulary costs one compare.
  std::vector<int32_t> top;
  if (k == 0) return top;
  top.reserve(static_cast<size_t>(k));
  for (int32_t i = 0; i < vocab; ++i) {
    const float x = logits[i];
    if (static_cast<int32_t>(top.size()) == k && !(x > logits[top.back()])) continue;
    const auto at = std::find_if(top.begin(), top.end(), [&](int32_t t) { return x > logits[t]; }) - top.begin();
    if (static_cast<int32_t>(top.size()) == k) top.pop_back();
    top.insert(top.begin() + at, i);
  }
  return top;
}

std::vector<sample_result> sampler::verify_tree(float* rows, int32_t vocab, std::span<const int32_t> draft,
                                                std::span<const int32_t> parent, std::vector<int32_t>& path) {
  TROUPE_ASSERT(parent.size() == draft.size(), parent.size(), draft.size());
  path.clear();
  std::vector<sample_result> out;
  std::vector<int32_t>& children = children_;
  for (int32_t at = -1;;) {  // at: the node whose row is read (-1: the sequence's end)
    float* row = rows + static_cast<size_t>(at + 1) * vocab;
    children.clear();
    for (size_t i = 0; i < draft.size(); ++i)
      if (parent[i] == at) children.push_back(static_cast<int32_t>(i));
    if (children.empty()) {  // a leaf: one more, as sample() chooses it
      out.push_back(sample(row, vocab));
      return out;
    }
    adjust_logits(row, vocab);
    sample_result r;
    int32_t taken = -1;
    if (p_.temperature == 0.0f) {
      r.token = argmax(row, vocab);
      for (int32_t c : children)
        if (draft[c] == r.token) taken = c;
    } else {
      p_row_.resize(vocab);
      troupe::distribution(row, vocab, how(), p_row_.data(), scratch_);
      residual_.assign(p_row_.begin(), p_row_.end());
      float mass = 0.0f;
      for (float x : residual_) mass += x;
      for (int32_t c : children) {
        const int32_t d = draft[c];
        TROUPE_ASSERT(d >= 0 && d < vocab, d, vocab);
        if (mass > 0.0f && rng_.uniform() * mass < residual_[d]) {
          taken = c;
          r.token = d;
          break;
        }
        mass -= residual_[d];
        residual_[d] = 0.0f;
      }
      // None taken: a draw from what is left (p itself, should rounding leave nothing).
      if (taken < 0) {
        float left = 0.0f;
        for (float x : residual_) left += x;
        r.token = troupe::draw(left > 0.0f ? residual_.data() : p_row_.data(), vocab, rng_.uniform());
      }
    }
    add_logprobs(row, vocab, r);
    record(r.token);
    out.push_back(std::move(r));
    if (taken < 0) return out;
    path.push_back(taken);
    at = taken;
  }
}

}  // namespace troupe

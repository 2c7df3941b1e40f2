#include "engine/sample/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_set>

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

sample_result sampler::sample(float* logits, int32_t vocab) {
  adjust_logits(logits, vocab);
  sample_result r;

  // Log-probabilities of the penalised logits.
  float log_z = 0.0f;
  if (p_.logprobs >= 0) {
    float max = logits[0];
    for (int32_t i = 1; i < vocab; ++i) max = std::max(max, logits[i]);
    double z = 0.0;
    for (int32_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(logits[i] - max));
    log_z = max + static_cast<float>(std::log(z));
    if (p_.logprobs > 0) {
      auto& candidates = scratch_.candidates;  // free until the draw below
      candidates.clear();
      for (int32_t i = 0; i < vocab; ++i) candidates.emplace_back(logits[i], i);
      const int32_t n = std::min(p_.logprobs, vocab);
      std::partial_sort(candidates.begin(), candidates.begin() + n, candidates.end(),
                        [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      for (int32_t i = 0; i < n; ++i) r.top.push_back({candidates[i].second, candidates[i].first - log_z});
    }
  }

  if (p_.temperature == 0.0f) {
    r.token = argmax(logits, vocab);
  } else {
    r.token = draw(logits, vocab);
  }
  if (p_.logprobs >= 0) r.logprob = logits[r.token] - log_z;
  ++seen_[r.token];
  ++output_[r.token];
  return r;
}

}  // namespace troupe

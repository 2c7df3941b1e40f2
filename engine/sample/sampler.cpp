#include "engine/sample/sampler.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/argmax.hpp"

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
  return std::nullopt;
}

sampler::sampler(const sampling_params& p, std::span<const int32_t> prompt)
    : p_(p), rng_(p.seed) {
  for (int32_t t : prompt) ++seen_[t];
}

void sampler::replay(int32_t token) {
  if (p_.temperature != 0.0f) (void)rng_.uniform();  // draw() takes exactly one
  ++seen_[token];
  ++output_[token];
}

int32_t sampler::draw(const float* logits, int32_t vocab) {
  // Unnormalised probabilities of logits / temperature; the most likely token gets 1.
  const float inv_t = 1.0f / p_.temperature;
  const float top_logit = logits[argmax(logits, vocab)];
  probs_.resize(vocab);
  float total = 0.0f;
  for (int32_t i = 0; i < vocab; ++i) {
    probs_[i] = std::exp((logits[i] - top_logit) * inv_t);
    total += probs_[i];
  }
  if (p_.top_k == 0 && p_.top_p >= 1.0f && p_.min_p == 0.0f) {
    const float u = rng_.uniform() * total;
    float acc = 0.0f;
    for (int32_t i = 0; i < vocab; ++i) {
      acc += probs_[i];
      if (u < acc) return i;
    }
    return vocab - 1;
  }

  // Truncation works on candidates sorted by probability. Tokens under a small floor are
  // left out of the sort when the tokens above it already hold the top-p mass, which
  // then lies entirely among them (the result is the same, the sort much shorter).
  const float target = p_.top_p * total;
  auto collect = [&](float floor) {
    candidates_.clear();
    float mass = 0.0f;
    for (int32_t i = 0; i < vocab; ++i)
      if (probs_[i] >= floor) {
        candidates_.emplace_back(probs_[i], i);
        mass += probs_[i];
      }
    return mass;
  };
  const float min_floor = p_.min_p;  // min-p keeps prob >= min_p * top prob (= 1)
  if (p_.top_k != 0 || p_.top_p >= 1.0f || collect(std::max(min_floor, 1e-3f)) < target)
    collect(min_floor);
  auto by_prob = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + p_.top_k, candidates_.end(), by_prob);
    keep = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_prob);
  }
  if (p_.top_p < 1.0f) {
    float acc = 0.0f;
    size_t n = 0;
    while (n < keep) {
      acc += candidates_[n++].first;
      if (acc >= target) break;
    }
    keep = n;
  }
  float mass = 0.0f;
  for (size_t i = 0; i < keep; ++i) mass += candidates_[i].first;
  const float u = rng_.uniform() * mass;
  float acc = 0.0f;
  for (size_t i = 0; i < keep; ++i) {
    acc += candidates_[i].first;
    if (u < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

void sampler::apply_penalties(float* logits, int32_t vocab) const {
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
}

sample_result sampler::sample(float* logits, int32_t vocab) {
  apply_penalties(logits, vocab);
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
      candidates_.clear();
      for (int32_t i = 0; i < vocab; ++i) candidates_.emplace_back(logits[i], i);
      const int32_t n = std::min(p_.logprobs, vocab);
      std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(),
                        [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      for (int32_t i = 0; i < n; ++i)
        r.top.push_back({candidates_[i].second, candidates_[i].first - log_z});
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

#include "kernels/cpu/sample.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/argmax.hpp"

namespace troupe {

namespace {

// The tokens a draw may land on, and their weights: probs[i] = exp((logit - top) / T) for
// every token; with truncation, candidates[0 .. keep) (sorted by probability) are kept.
struct kept_tokens {
  bool all = true;  // no truncation: every token, in index order, weight probs[i]
  size_t keep = 0;
  float mass = 0.0f;  // the kept weights' sum
};

kept_tokens keep_tokens(const float* logits, int32_t vocab, const truncation& t, sample_scratch& scratch) {
  auto& probs = scratch.probs;
  auto& candidates = scratch.candidates;
  const float inv_t = 1.0f / t.temperature;
  const float top_logit = logits[argmax(logits, vocab)];
  probs.resize(vocab);
  float total = 0.0f;
  for (int32_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp((logits[i] - top_logit) * inv_t);
    total += probs[i];
  }
  if (t.top_k == 0 && t.top_p >= 1.0f && t.min_p == 0.0f) return {true, static_cast<size_t>(vocab), total};

  // Truncation works on candidates sorted by probability. Tokens under a small floor are
  // left out of the sort when the tokens above it already hold the top-p mass, which
  // then lies entirely among them (the result is the same, the sort much shorter).
  const float target = t.top_p * total;
  auto collect = [&](float floor) {
    candidates.clear();
    float mass = 0.0f;
    for (int32_t i = 0; i < vocab; ++i)
      if (probs[i] >= floor) {
        candidates.emplace_back(probs[i], i);
        mass += probs[i];
      }
    return mass;
  };
  const float min_floor = t.min_p;  // min-p keeps prob >= min_p * top prob (= 1)
  if (t.top_k != 0 || t.top_p >= 1.0f || collect(std::max(min_floor, 1e-3f)) < target) collect(min_floor);
  auto by_prob = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates.size();
  if (t.top_k > 0 && static_cast<size_t>(t.top_k) < keep) {
    std::partial_sort(candidates.begin(), candidates.begin() + t.top_k, candidates.end(), by_prob);
    keep = static_cast<size_t>(t.top_k);
  } else {
    std::sort(candidates.begin(), candidates.end(), by_prob);
  }
  if (t.top_p < 1.0f) {
    float acc = 0.0f;
    size_t n = 0;
    while (n < keep) {
      acc += candidates[n++].first;
      if (acc >= target) break;
    }
    keep = n;
  }
  float mass = 0.0f;
  for (size_t i = 0; i < keep; ++i) mass += candidates[i].first;
  return {false, keep, mass};
}

}  // namespace

int32_t sample(const float* logits, int32_t vocab, const truncation& t, float u01, sample_scratch& scratch) {
  const kept_tokens k = keep_tokens(logits, vocab, t, scratch);
  const float u = u01 * k.mass;
  float acc = 0.0f;
  if (k.all) {
    for (int32_t i = 0; i < vocab; ++i) {
      acc += scratch.probs[i];
      if (u < acc) return i;
    }
    return vocab - 1;
  }
  const auto& candidates = scratch.candidates;
  for (size_t i = 0; i < k.keep; ++i) {
    acc += candidates[i].first;
    if (u < acc) return candidates[i].second;
  }
  return candidates[k.keep - 1].second;
}

void distribution(const float* logits, int32_t vocab, const truncation& t, float* probs, sample_scratch& scratch) {
  if (t.temperature == 0.0f) {
    std::fill(probs, probs + vocab, 0.0f);
    probs[argmax(logits, vocab)] = 1.0f;
    return;
  }
  const kept_tokens k = keep_tokens(logits, vocab, t, scratch);
  const float inv = 1.0f / k.mass;
  if (k.all) {
    for (int32_t i = 0; i < vocab; ++i) probs[i] = scratch.probs[i] * inv;
    return;
  }
  std::fill(probs, probs + vocab, 0.0f);
  for (size_t i = 0; i < k.keep; ++i) probs[scratch.candidates[i].second] = scratch.candidates[i].first * inv;
}

int32_t draw(const float* probs, int32_t vocab, float u01) {
  float total = 0.0f;
  for (int32_t i = 0; i < vocab; ++i) total += probs[i];
  const float u = u01 * total;
  float acc = 0.0f;
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    last = i;
    if (u < acc) return i;
  }
  return last;
}

int32_t choose(const float* logits, int32_t vocab, const token_choice& c, sample_scratch& scratch) {
  return c.how.temperature == 0.0f ? argmax(logits, vocab) : sample(logits, vocab, c.how, c.u, scratch);
}

}  // namespace troupe

#include "engine/kv/kv_eviction.hpp"

#include <algorithm>
#include <bit>
#include <numeric>

#include "kernels/common/assert.hpp"

namespace troupe {

std::string_view kv_policy_name(kv_policy p) {
  switch (p) {
    case kv_policy::none: return "none";
    case kv_policy::streaming: return "streaming";
    case kv_policy::h2o: return "h2o";
    case kv_policy::scissorhands: return "scissorhands";
  }
  return "?";
}

std::optional<kv_policy> parse_kv_policy(std::string_view s) {
  for (kv_policy p : {kv_policy::none, kv_policy::streaming, kv_policy::h2o, kv_policy::scissorhands})
    if (s == kv_policy_name(p)) return p;
  return std::nullopt;
}

std::optional<std::string> validate(const kv_eviction_config& c, bool topology) {
  const std::string budget = topology ? "budget" : "--kv-budget", sinks = topology ? "sinks" : "--sinks",
                    window = topology ? "window" : "--window";
  if (!c.enabled()) return std::nullopt;
  const std::string policy(kv_policy_name(c.policy));
  if (c.budget < 2) return "KV policy " + policy + " needs " + budget + " of 2 tokens or more; got " + std::to_string(c.budget);
  if (c.policy == kv_policy::streaming && c.sinks < -1) return sinks + " must be 0 or more";
  if (c.window < -1) return window + " must be 0 or more";
  const int32_t s = c.sinks_kept(), w = c.window_kept();
  if (c.policy == kv_policy::streaming && (w < 1 || s + w > c.budget))
    return "a KV budget of " + std::to_string(c.budget) + " tokens cannot hold " + std::to_string(s) + " sinks and a window of " +
           std::to_string(w) + ": " + budget + " must be at least " + sinks + " + " + window + ", and the window at least 1";
  if (c.policy != kv_policy::streaming && w >= c.budget)
    return "a KV budget of " + std::to_string(c.budget) + " tokens leaves no room for heavy hitters beside a window of " +
           std::to_string(w) + ": " + window + " must be below " + budget;
  if (c.policy == kv_policy::scissorhands && (c.history < 1 || c.history > 32))
    return "the scissorhands history must be 1 to 32 steps; got " + std::to_string(c.history);
  return std::nullopt;
}

int32_t slots_to_keep(const kv_eviction_config& c, int32_t slots, int32_t wanted, int32_t block_size) {
  if (!c.enabled() || slots + wanted <= c.budget) return slots;
  const int32_t slack = std::max({1, std::min(block_size, c.budget), c.budget / 8});
  return std::min(slots, std::max(c.budget / 2, c.budget - wanted - slack));
}

void kv_eviction_state::append(int32_t count, int32_t position) {
  for (int32_t i = 0; i < count; ++i) {
    position_.push_back(position + i);
    score_.push_back(0.0f);
    low_.push_back(0);
  }
}

void kv_eviction_state::observe(std::span<const float> mass, int32_t rows) {
  TROUPE_ASSERT(static_cast<int32_t>(mass.size()) == size(), mass.size(), size());
  if (rows <= 0 || mass.empty()) return;
  const float even = static_cast<float>(rows) / static_cast<float>(mass.size());
  for (size_t i = 0; i < mass.size(); ++i) {
    score_[i] += mass[i];
    low_[i] = (low_[i] << 1) | (mass[i] < even ? 1u : 0u);
  }
}

std::vector<int32_t> kv_eviction_state::choose(const kv_eviction_config& c, int32_t keep, int32_t from) const {
  const int32_t n = size();
  TROUPE_ASSERT(keep >= 0 && from >= 0 && keep < n - from, keep, from, n);
  std::vector<int32_t> kept;
  if (c.policy == kv_policy::streaming) {
    const int32_t sinks = std::min(c.sinks_kept(), keep);
    for (int32_t i = from; i < from + sinks; ++i) kept.push_back(i);
    for (int32_t i = n - (keep - sinks); i < n; ++i) kept.push_back(i);
    return kept;
  }
  const int32_t recent = std::min(c.window_kept(), keep);
  std::vector<int32_t> older(static_cast<size_t>(n - recent - from));
  std::iota(older.begin(), older.end(), from);
  const uint32_t mask = c.history >= 32 ? ~0u : (1u << c.history) - 1;
  // Best first; ties to the later token.
  auto better = [&](int32_t a, int32_t b) {
    if (c.policy == kv_policy::scissorhands) {
      const int la = std::popcount(low_[a] & mask), lb = std::popcount(low_[b] & mask);
      if (la != lb) return la < lb;
    } else if (score_[a] != score_[b]) {
      return score_[a] > score_[b];
    }
    return a > b;
  };
  const int32_t heavy = keep - recent;
  std::partial_sort(older.begin(), older.begin() + heavy, older.end(), better);
  kept.assign(older.begin(), older.begin() + heavy);
  std::sort(kept.begin(), kept.end());
  for (int32_t i = n - recent; i < n; ++i) kept.push_back(i);
  return kept;
}

void kv_eviction_state::retain(std::span<const int32_t> kept) {
  for (size_t i = 0; i < kept.size(); ++i) {
    TROUPE_ASSERT(kept[i] >= static_cast<int32_t>(i) && kept[i] < size() && (i == 0 || kept[i] > kept[i - 1]), i, kept[i]);
    position_[i] = position_[kept[i]];
    score_[i] = score_[kept[i]];
    low_[i] = low_[kept[i]];
  }
  position_.resize(kept.size());
  score_.resize(kept.size());
  low_.resize(kept.size());
}

void kv_eviction_state::clear() {
  position_.clear();
  score_.clear();
  low_.clear();
}

}  // namespace troupe

#include "engine/speculative/ngram_proposer.hpp"

#include <algorithm>

namespace troupe {

std::vector<int32_t> ngram_proposer::lookup(std::span<const int32_t> tokens, int32_t k, int32_t min_n, int32_t max_n) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const auto suffix = tokens.subspan(len - n);
    // Latest occurrence first; it must end before the suffix does, so something follows.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const int64_t from = i + n, to = std::min(len, from + k);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

void ngram_proposer::propose(std::span<draft_slot> slots) {
  for (draft_slot& s : slots) s.tokens = lookup(s.req->tokens, s.max_tokens, min_n_, max_n_);
}

}  // namespace troupe

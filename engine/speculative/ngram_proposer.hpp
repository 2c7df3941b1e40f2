// ngram_proposer: prompt lookup. The last n tokens of a request (n from ngram_max down to
// ngram_min) are looked up earlier in its own prompt and output, the most recent match
// first, and the tokens that followed that match are proposed. Free to run, and right
// wherever output repeats its context: code edits, extraction, summaries that quote.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/speculative/speculative.hpp"

namespace troupe {

class ngram_proposer final : public proposer {
 public:
  ngram_proposer(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(std::span<draft_slot> slots) override;

  // Up to k tokens that followed the latest earlier occurrence of the longest suffix of
  // `tokens` (min_n .. max_n tokens long) that occurs earlier; none without one.
  static std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t k, int32_t min_n, int32_t max_n);

 private:
  int32_t min_n_, max_n_;
};

}  // namespace troupe

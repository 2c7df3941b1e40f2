// step_batch: the tokens one forward step processes, sequence by sequence. A sequence
// contributes a prefill chunk (many tokens) or a decode token (one); all tokens of the
// step go through each weight matrix in one GEMM.
//
// Sequence i's tokens are tokens[first_i .. first_i + num_tokens_i), where first_i is the
// sum of the earlier sequences' num_tokens, at positions start_pos .. start_pos +
// num_tokens - 1. Its block_table must cover every position up to the last one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/block_id.hpp"

namespace troupe {

struct step_sequence {
  int32_t num_tokens = 0;
  int32_t start_pos = 0;               // tokens of this sequence already in the cache
  std::span<const block_id> block_table;
  int32_t logit_rows = 0;              // logits of its last logit_rows tokens are wanted
                                       // (1 to sample; more to verify drafts)
};

struct step_batch {
  std::vector<int32_t> tokens;
  std::vector<step_sequence> sequences;

  void clear() {
    tokens.clear();
    sequences.clear();
  }
  void add(std::span<const int32_t> toks, int32_t start_pos, std::span<const block_id> blocks,
           int32_t logit_rows) {
    tokens.insert(tokens.end(), toks.begin(), toks.end());
    sequences.push_back({static_cast<int32_t>(toks.size()), start_pos, blocks, logit_rows});
  }
  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_logits() const {
    int32_t n = 0;
    for (const auto& s : sequences) n += s.logit_rows;
    return n;
  }
};

}  // namespace troupe

// step_batch: the tokens one forward step processes, sequence by sequence. A sequence
// contributes a prefill chunk (many tokens) or a decode token (one); all tokens of the
// step go through each weight matrix in one GEMM.
//
// Sequence i's tokens are tokens[first_i .. first_i + num_tokens_i), where first_i is the
// sum of the earlier sequences' num_tokens, at positions start_pos .. start_pos +
// num_tokens - 1. Its block_table must cover every position up to the last one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/block_id.hpp"

namespace troupe {

struct step_sequence {
  int32_t num_tokens = 0;
  int32_t start_pos = 0;               // tokens of this sequence already in the cache (its
                                       // first token's slot)
  std::span<const block_id> block_table;
  int32_t logit_rows = 0;              // logits of its last logit_rows tokens are wanted
                                       // (1 to sample; more to verify drafts)
  int32_t rope_pos = -1;               // its first token's RoPE position, where KV eviction
                                       // made it differ from its slot (-1: start_pos)
  const int32_t* tree_parents = nullptr;  // when set, [num_tokens]: the tokens are a token
                                          // tree (speculative decoding), token i's parent
                                          // tree_parents[i] < i, the first the root (-1).
                                          // Each token sees the slots before the root and its
                                          // own ancestors; its RoPE position is the root's
                                          // plus its depth. At most max_tree_tokens.
  const int32_t* window_first = nullptr;  // a sliding-window model's, when set,
                                          // [num_tokens]: the first slot each token sees
                                          // (KV eviction left slots and positions apart);
                                          // otherwise its slot minus the window
  float* attention_mass = nullptr;     // when set, [start_pos + num_tokens]: the attention
                                       // each slot receives from this sequence's last
                                       // attention_mass_queries tokens (all of a shorter
                                       // chunk's), summed over every head and layer, is
                                       // added to it
};

// The queries of a sequence whose attention attention_mass sums: a long prefill chunk's
// last ones only, which bounds the scratch the weights need (heads x queries x slots).
inline constexpr int32_t attention_mass_queries = 32;
inline int32_t attention_mass_rows(int32_t num_tokens) { return std::min(num_tokens, attention_mass_queries); }

// The attention sums of `count` tokens from slot `first_slot`: one per slot the last token
// sees, or, by token (step_batch::add_by_token), one per slot each token sees.
inline int64_t attention_values(int32_t first_slot, int32_t count, bool by_token) {
  if (!by_token) return int64_t{first_slot} + count;
  return int64_t{count} * first_slot + int64_t{count} * (count + 1) / 2;
}

// KV eviction (engine/kv/kv_eviction.hpp): a sequence keeps only some of its cache's slots,
// moved down in order (slot kept[i] becomes slot i) within its block table. With `rotate`,
// each moved key turns back by as many positions as it moved: its RoPE position is its
// slot (StreamingLLM's positions within the cache).
struct kv_compaction {
  std::span<const block_id> block_table;  // covering the slots before the move
  std::span<const int32_t> kept;          // ascending
  bool rotate = false;
  std::span<const block_id> new_table;    // where slot i goes, when not block_table: the
                                          // same blocks but for copies of shared ones
                                          // (whose slots are copied whether they move
                                          // or not)

  std::span<const block_id> target() const { return new_table.empty() ? block_table : new_table; }
  // Whether kept slot i is where it goes already (the same slot of the same block).
  bool stays(size_t i, int32_t block_size) const {
    const auto at = static_cast<int32_t>(i);
    return kept[i] == at && target()[at / block_size] == block_table[kept[i] / block_size];
  }
};

// A token tree's step_sequence::tree_parents for a sequence of one known token, the root,
// and drafts whose parents are `draft_parents` (-1: the root; otherwise an earlier
// draft): the root's -1, then each draft's parent as a position in the sequence.
template <class Parents>  // a range of int32_t
void tree_parents_of(const Parents& draft_parents, std::vector<int32_t>& out) {
  out.assign(1, -1);
  for (int32_t p : draft_parents) out.push_back(p + 1);
}

struct step_batch {
  std::vector<int32_t> tokens;
  std::vector<step_sequence> sequences;
  std::vector<kv_compaction> compactions;  // applied before the step's tokens are computed

  void clear() {
    tokens.clear();
    sequences.clear();
    compactions.clear();
  }
  void add(std::span<const int32_t> toks, int32_t start_pos, std::span<const block_id> blocks,
           int32_t logit_rows) {
    tokens.insert(tokens.end(), toks.begin(), toks.end());
    sequences.push_back({static_cast<int32_t>(toks.size()), start_pos, blocks, logit_rows});
  }
  // A verifying sequence (a known token, then drafts) whose eviction policy reads the
  // attention its tokens receive: each token is a sequence of its own over the same table
  // (each sees the slots of the ones before it, whose keys a step writes before any token
  // attends), with logits for each, and its attention sums go to `mass` token after token
  // (attention_values). So its policy sees the tokens it keeps one by one, as it would
  // without drafts. Returns the end of its sums.
  float* add_by_token(std::span<const int32_t> toks, int32_t start_pos, int32_t rope_pos,
                      std::span<const block_id> blocks, float* mass, const int32_t* window_first = nullptr) {
    for (size_t j = 0; j < toks.size(); ++j) {
      const auto at = static_cast<int32_t>(j);
      add(toks.subspan(j, 1), start_pos + at, blocks, 1);
      sequences.back().rope_pos = rope_pos + at;
      sequences.back().window_first = window_first ? window_first + j : nullptr;
      sequences.back().attention_mass = mass;
      mass += start_pos + at + 1;
    }
    return mass;
  }
  // A chunk of a step plan: its tokens (known ones, then any drafts) from slot start_pos,
  // the first at RoPE position rope_pos, its last logit_rows wanted, a token tree's
  // parents (tree_parents_of) or none; with attention, its sums go to `mass` (token by
  // token where by_token: add_by_token). Returns the end of its sums.
  struct chunk_layout {
    int32_t start_pos = 0;
    int32_t rope_pos = 0;
    int32_t logit_rows = 0;
    const int32_t* tree_parents = nullptr;
    const int32_t* window_first = nullptr;
    bool attention = false;
    bool by_token = false;
  };
  float* add_chunk(std::span<const int32_t> toks, std::span<const block_id> blocks, const chunk_layout& l,
                   float* mass) {
    if (l.attention && l.by_token) return add_by_token(toks, l.start_pos, l.rope_pos, blocks, mass, l.window_first);
    add(toks, l.start_pos, blocks, l.logit_rows);
    step_sequence& s = sequences.back();
    s.rope_pos = l.rope_pos;
    s.tree_parents = l.tree_parents;
    s.window_first = l.window_first;
    if (!l.attention) return mass;
    s.attention_mass = mass;
    return mass + l.start_pos + static_cast<int32_t>(toks.size());
  }
  bool wants_attention() const {
    for (const auto& s : sequences)
      if (s.attention_mass) return true;
    return false;
  }
  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_logits() const {
    int32_t n = 0;
    for (const auto& s : sequences) n += s.logit_rows;
    return n;
  }
};

}  // namespace troupe

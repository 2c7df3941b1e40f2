// step_plan: what one engine step computes, as the scheduler decided it; step_output: what
// one request got from a step.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/forward/step_batch.hpp"
#include "engine/kv/block_id.hpp"
#include "engine/kv/tier_types.hpp"
#include "engine/sched/request.hpp"

namespace troupe {

struct scheduled_chunk {
  request_id id;
  int32_t first = 0;       // index of the first token computed (== num_computed_tokens)
  int32_t count = 0;       // positions computed this step: known tokens, then drafts
  int32_t num_draft = 0;   // of which draft slots: positions after the known tokens whose
                           // tokens a proposer fills in (speculative decoding)
  std::span<const int32_t> tokens;        // the known tokens (count - num_draft of them)
  std::span<const int32_t> draft;         // the drafts, once a proposer filled the slots
                                          // (request::drafts.tokens)
  std::span<const int32_t> draft_parents; // a token tree's (request::drafts.parents); empty:
                                          // a chain
  std::span<const block_id> block_table;  // the request's blocks, covering first + count
  bool sample = false;     // the chunk reaches the end of the known tokens: sample one
                           // (with drafts, verify them: 1 to num_draft + 1 tokens)
  int32_t evicted = 0;     // KV eviction: tokens gone from the request's cache, so token
                           // `first` goes to slot first - evicted
  bool rope_in_cache = false;  // its RoPE positions are its slots (streaming); otherwise
                               // the tokens' own positions
  std::span<const int32_t> window_first;  // KV eviction on a sliding-window model: each
                                         // token's first slot it sees (empty: its slot
                                         // minus the window, as without eviction)
  bool attention = false;  // KV eviction: the request's policy wants the attention its
                           // slots receive (its last attention_mass_queries tokens'; with
                           // drafts, each token's: attention_by_token)

  // Whether its attention comes back token by token (step_batch::add_by_token): a
  // verifying chunk's, so that its policy observes the tokens it keeps one at a time.
  bool attention_by_token() const { return attention && num_draft > 0; }
  int64_t attention_sums() const {
    return attention ? attention_values(first_slot(), count, attention_by_token()) : 0;
  }
  int32_t first_slot() const { return first - evicted; }
  int32_t slots_seen() const { return first_slot() + count; }  // its last token's
  int32_t first_rope_position() const { return rope_in_cache ? first_slot() : first; }
};

// KV eviction before a step: the request keeps slots `kept` of its cache (ascending),
// moved down in order within `block_table` (its table before the step's grant), keys
// turned back as they move where its RoPE positions are its slots.
struct planned_compaction {
  request_id id;
  std::vector<block_id> block_table;
  std::vector<int32_t> kept;
  bool rotate = false;
  // The table the kept slots move into: the request's after the step's grant, whose
  // blocks from rewrite_from()'s on are its own (copies of shared ones; empty: the same).
  std::vector<block_id> new_table;

  // The first slot the move writes (the step's tokens follow the kept ones).
  int32_t rewrite_from() const {
    for (size_t i = 0; i < kept.size(); ++i)
      if (kept[i] != static_cast<int32_t>(i)) return static_cast<int32_t>(i);
    return static_cast<int32_t>(kept.size());
  }
};

struct step_plan {
  std::vector<scheduled_chunk> chunks;  // decode tokens first, then prefill chunks
  std::vector<request_id> preempted;    // requests sent back to waiting this step
  std::vector<planned_compaction> compactions;  // KV eviction: applied before the chunks,
                                                // each of a request with a chunk here
  std::vector<tier_move> tier_loads;  // KV tiers: filled before anything else (a request
                                      // whose loads fail is computed again later; its
                                      // outputs of this step are dropped)
  std::vector<tier_move> tier_saves;  // KV tiers: copied down after the step (blocks its
                                      // tokens filled), unless their request's loads failed
  std::vector<tier_key> tier_prefetch;  // KV tiers: blocks of waiting requests' prefixes,
                                        // read up into the first tier in the background
  std::vector<tier_move> kv_pushes;  // disaggregation: prompt blocks sent to the decode
                                     // replica each names after the step (blocks its tokens
                                     // filled, or the prefix cache had), unless their
                                     // request's loads failed
  int32_t num_tokens = 0;
  int32_t num_samples() const {
    int32_t n = 0;
    for (const auto& c : chunks) n += c.sample;
    return n;
  }
  // KV eviction: the attention sums the step returns, chunk after chunk, one per slot
  // each chunk with `attention` sees (or each of its tokens, attention_by_token).
  int64_t attention_sums() const {
    int64_t n = 0;
    for (const auto& c : chunks) n += c.attention_sums();
    return n;
  }
  // Rows of logits the step returns: one per sampled chunk, and one more per draft.
  int32_t num_logit_rows() const {
    int32_t n = 0;
    for (const auto& c : chunks) n += c.sample ? 1 + c.num_draft : 0;
    return n;
  }
};

struct step_output {
  request_id id;
  std::vector<int32_t> new_tokens;  // one per step; with speculation, up to the drafts + 1
  std::string text;                 // text that became final this step
  std::vector<sample_result> logprobs;
  bool finished = false;
  finish_reason reason = finish_reason::none;
  int32_t num_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;  // prompt tokens served by the prefix cache
  bool handed_off = false;  // disaggregation: a prefill-only request (kv_to) ended after its
                            // first token, to go on on its decode replica
  int32_t kv_sent = 0;      // with handed_off: prompt tokens whose KV was sent there
};

}  // namespace troupe

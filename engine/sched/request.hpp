// request: one generation request as the scheduler tracks it.
//
//   waiting --admit--> running --stop / max tokens--> finished
//      ^                  |
//      +----preempt-------+          (any state) --abort--> finished (aborted)
//
// tokens holds the prompt then every generated token. num_computed_tokens of them have
// their KV in the cache; the scheduler closes the gap to num_tokens() each step, which
// covers prefill, chunked prefill, prefix hits (num_computed starts at the hit length)
// and resumption after preemption (num_computed back to 0, the tokens kept).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/tokenizer/stop_matcher.hpp"
#include "engine/kv/kv_eviction.hpp"
#include "engine/kv/block_id.hpp"
#include "engine/kv/tier_types.hpp"
#include "engine/sample/rng.hpp"
#include "engine/sample/sampler.hpp"
#include "engine/tokenizer/utf8_stream.hpp"

namespace troupe {

enum class request_state : uint8_t { waiting, running, finished };
enum class finish_reason : uint8_t { none, stop, length, aborted };

std::string_view finish_reason_name(finish_reason r);

inline constexpr int32_t max_draft_tokens = 16;  // speculative drafts per step at most
inline constexpr int32_t max_tree_width = 16;    // a token tree's candidates per position at most

// What a client asks for.
struct request_params {
  std::vector<int32_t> prompt;            // token ids, BOS included where wanted
  sampling_params sampling;
  int32_t max_tokens = 256;               // generated tokens at most
  std::vector<int32_t> stop_tokens;       // besides EOS and BOS, which always stop
  std::vector<std::string> stop_strings;  // output text ends before the first one
  bool ignore_eos = false;                // run to max_tokens (benchmarks)
  int32_t priority = 0;                   // lower runs first under the priority policy
  uint64_t cache_namespace = 0;           // prefix-cache isolation key (per tenant)
  int32_t speculative = -1;               // drafts per step at most, speculative decoding
                                          // on: -1 the engine's k, 0 none
  std::optional<kv_eviction_config> eviction;  // KV eviction: this request's own policy and
                                               // budget (nullopt: the deployment's)
  std::string slo_class;                  // its SLO class (empty: the deployment's default)
  double arrival_ms = 0;                  // when it arrived, on the caller's clock (deadlines)
  std::vector<int32_t> delivered;         // output an earlier attempt already streamed (a
                                          // request moved off a failed replica): replayed
                                          // through sampler, detokenizer and stop strings,
                                          // counted as output, never streamed again
  std::string kv_to;                      // disaggregation: prefill only; the prompt's whole
                                          // blocks go to this decode replica, and the
                                          // request ends after its first token (handed off)
  int32_t kv_from = 0;                    // disaggregation: the prompt's first kv_from
                                          // tokens' KV was sent here by a prefill replica
};

// A request's speculative decoding (engine/speculative/speculative.hpp): its drafts and how long
// they should be.
struct draft_state {
  int32_t wanted = 0;            // slots its next decode step claims (set before each
                                 // plan; 0: none)
  std::vector<int32_t> tokens = {};  // the drafts its step in flight verifies
  std::vector<float> q = {};     // [tokens.size()][vocab] they were drawn from, or empty
  std::vector<int32_t> parents = {};  // a token tree's: each draft's parent (-1: under the
                                      // sequence's end); empty: a chain
  int32_t length = 0;            // its adaptive draft length (0: not yet speculating)
  int32_t pause = 0;             // decode steps to go without drafts (they kept failing)
  int32_t misses = 0;            // single drafts rejected in a row
  rng stream;                    // the proposer's draws for it, apart from the sampler's
};

// A request's KV eviction (engine/kv/kv_eviction.hpp; the scheduler's eviction part).
struct eviction_state {
  kv_eviction_config config;  // its policy: its own, or the deployment's
  kv_eviction_state kept;     // what its policy knows of each slot
  int32_t evicted = 0;        // tokens dropped from its cache, so that its blocks hold
                              // num_computed_tokens - evicted slots
  std::vector<int32_t> window_first;  // a sliding-window model's: each token of its step
                                      // in flight, the first slot it sees
                                      // (scheduled_chunk::window_first)

  bool enabled() const { return config.enabled(); }
  bool rope_in_cache() const { return config.rope_in_cache(); }
  bool wants_attention() const { return config.wants_attention(); }
};

// A request's KV tiers (engine/kv/kv_tiers.hpp; the scheduler's tier part).
struct tier_state {
  std::vector<tier_key> keys;    // its full blocks' content addresses, as far as needed
  int32_t saved = 0;             // full blocks whose copy down is decided
  bool loads_in_flight = false;  // its step in flight loads blocks from the tiers
  bool loads_landed = false;     // they landed: its next claim says so
  bool probed = false;           // the tiers were asked what they hold of its prompt
  bool prefetched = false;       // a plan named its blocks for reading up
};

// A request's prefill/decode roles (request_params::kv_to; the scheduler's handoff part).
struct handoff_state {
  int32_t pushed = 0;  // prompt blocks whose push to its decode replica is planned
};

// A request's SLO class (engine/sched/slo.hpp; the scheduler's SLO part).
struct slo_state {
  int32_t cls = -1;          // scheduler_config::classes, or -1
  double deadline_ms = 0;    // its first token is due then (arrival plus its class's TTFT
                             // target; no target: never)
};

struct request {
  request_id id;
  request_params params;
  std::vector<int32_t> tokens;  // prompt, then output
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;
  uint64_t arrival = 0;         // admission order, for FCFS and ties
  request_state state = request_state::waiting;
  finish_reason reason = finish_reason::none;
  int32_t num_preemptions = 0;
  int32_t num_cached_prompt_tokens = 0;  // prefix-cache hit at first admission
  bool in_flight = false;  // a step computing this request has not come back yet
  int32_t lost_steps = 0;   // its steps lost with the replica's state since one last came back
  std::vector<block_id> blocks;  // its KV blocks, as the block manager granted them
  // The features' own state of it: each is read and written by its scheduler part
  // (engine/sched/scheduler_part.hpp), and the proposers read drafts and eviction.
  draft_state drafts;
  eviction_state eviction;
  tier_state tiers;
  handoff_state handoff;
  slo_state slo;
  sampler smp;
  utf8_stream utf8;
  stop_matcher stops;

  request(request_id i, request_params p, uint64_t arrival_seq)
      : id(i), params(std::move(p)), tokens(params.prompt),
        num_prompt_tokens(static_cast<int32_t>(params.prompt.size())), arrival(arrival_seq),
        drafts{.stream = rng(params.sampling.seed ^ 0xd1b54a32d192ed03ull)}, smp(params.sampling, params.prompt),
        stops(params.stop_strings) {}

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  // Whether its full blocks hold what their content addresses (tier_key) name: the
  // positions of a run of its tokens. Until KV eviction first compacts its cache; after,
  // a block holds slots of scattered positions that no other sequence's prefix has. Where
  // KV eviction meets the features that move blocks by content: the KV tiers save, and a
  // prefill replica pushes, only blocks filled before.
  bool blocks_by_content() const { return eviction.evicted == 0; }
};

}  // namespace troupe

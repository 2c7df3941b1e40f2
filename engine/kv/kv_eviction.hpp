// kv_eviction: which of a request's cached tokens to keep when its KV would outgrow a
// budget, so that long generations run in bounded memory instead of being preempted:
//
//   streaming     StreamingLLM: the first `sinks` tokens (attention sinks) and the most
//                 recent ones;
//   h2o           H2O: the most recent `window` tokens, and the heavy hitters among the
//                 rest, by the attention they have received in total;
//   scissorhands  Scissorhands: the most recent `window` tokens, and among the rest those
//                 whose importance persisted: the fewest steps, over the last `history`,
//                 in which they received less than an even share of the attention.
//
// The attention a slot received in a step is summed over the step's query tokens of the
// request, every head of every shard and every layer, so all of them keep the same
// tokens. Ties go to the later token (streaming keeps by position alone).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

enum class kv_policy : uint8_t { none, streaming, h2o, scissorhands };

std::string_view kv_policy_name(kv_policy p);  // "none", "streaming", "h2o", "scissorhands"
std::optional<kv_policy> parse_kv_policy(std::string_view s);

struct kv_eviction_config {
  kv_policy policy = kv_policy::none;
  int32_t budget = 0;    // cached tokens per request at most
  int32_t sinks = -1;    // streaming: first tokens always kept (-1: 4)
  int32_t window = -1;   // recent tokens always kept (-1: streaming: the rest of the budget;
                         // h2o and scissorhands: half the budget)
  int32_t history = 16;  // scissorhands: steps a token's importance is judged over (1..32)

  bool enabled() const { return policy != kv_policy::none; }
  // Whether the policy ranks tokens by the attention they receive (streaming keeps by
  // position alone).
  bool wants_attention() const { return policy == kv_policy::h2o || policy == kv_policy::scissorhands; }
  // Whether RoPE positions are cache slots (streaming), so a request may run past the
  // model's context; otherwise tokens keep their own positions.
  bool rope_in_cache() const { return policy == kv_policy::streaming; }
  int32_t sinks_kept() const { return policy != kv_policy::streaming ? 0 : sinks < 0 ? 4 : sinks; }
  int32_t window_kept() const {
    if (window >= 0) return window;
    return policy == kv_policy::streaming ? budget - sinks_kept() : budget / 2;
  }
};

// Output tokens a request may ask for where streaming eviction lets it run past the
// model's context (elsewhere the context bounds them).
inline constexpr int32_t max_tokens_past_context = 1 << 24;

// The first problem with c, in words, naming the settings as `flag` spells them
// ("--kv-budget"; "budget" in a topology).
std::optional<std::string> validate(const kv_eviction_config& c, bool topology = false);

// How many of `slots` cached tokens to keep before a step adds `wanted` positions: all of
// them while they fit the budget; else fewer than fit by an eighth of the budget (a block
// at least), so that a compaction, which moves most of the cache, comes once every so
// many steps; and never fewer than half the budget (so a long prompt goes in chunks of at
// most that many tokens, the rest of the budget: the block manager caps a claim there).
int32_t slots_to_keep(const kv_eviction_config& c, int32_t slots, int32_t wanted, int32_t block_size);

// What a request's policy knows of each of its cached tokens, slot by slot (slot i holds
// the i-th token still cached, in sequence order).
class kv_eviction_state {
 public:
  // count tokens entered the cache after the last slot, the first at sequence position
  // `position`.
  void append(int32_t count, int32_t position);
  // A step's attention: mass[i] is what slot i received, summed over `rows` softmax rows
  // (query tokens times heads times layers), each of which spread one unit over the slots
  // it saw (`seen` of them at most).
  void observe(std::span<const float> mass, int32_t rows);

  // The slots to keep so that `keep` remain, ascending, chosen from slot `from` on (the
  // ones before it are dropped first: a sliding window's dead slots); keep < size() - from.
  std::vector<int32_t> choose(const kv_eviction_config& c, int32_t keep, int32_t from = 0) const;
  // Only those slots remain, in that order.
  void retain(std::span<const int32_t> kept);

  int32_t size() const { return static_cast<int32_t>(position_.size()); }
  std::span<const int32_t> positions() const { return position_; }
  std::span<const float> scores() const { return score_; }
  void clear();

 private:
  std::vector<int32_t> position_;  // each slot's position in the sequence
  std::vector<float> score_;       // h2o: attention received in total
  std::vector<uint32_t> low_;      // scissorhands: bit k set when it got less than an even
                                   // share k steps ago
};

}  // namespace troupe

// kv_block_manager: which KV blocks each request holds. It combines the block pool (ref
// counts, eviction order) and the prefix cache (which blocks hold which prefixes), hands
// out block tables for the forward pass, and reports usage.
//
// A request's blocks: [prefix hits (shared, ref-counted)][blocks it computes itself].
// As a request's blocks fill, they are cached (when prefix caching is on), so a request
// admitted later, even in the same step, reuses them. On release, a request's blocks go
// back to the pool last block first, so a shared prefix outlives the tails that follow it.
//
// A step's blocks are granted in one call, grant(): the scheduler sends its claims (the
// requests it wants to run, in scheduling order, with the step's token budget) and gets
// back the blocks and token counts of those that fit. The same call serves a block
// manager inside the scheduler and one behind an actor (the kv manager), so a step costs
// one exchange with it however many requests run.
//
// Single-threaded: owned by the scheduler or by a kv manager actor.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv/block_pool.hpp"
#include "engine/kv/prefix_block_index.hpp"
#include "engine/kv/prefix_summary.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

struct kv_usage {
  uint32_t num_blocks = 0;
  uint32_t used = 0;    // referenced by a request
  uint32_t free = 0;    // unreferenced, cached or not
  uint32_t cached = 0;  // holding a cached prefix, in use or free
  uint64_t queried_tokens = 0;  // prompt tokens looked up in the prefix cache
  uint64_t hit_tokens = 0;      // of which found cached
};

// One request's claim on a step: it wants every token of `tokens` past `computed`
// computed, then `speculative` positions more (drafted tokens a speculative step verifies),
// as far as the step's budget allows. Blocks holding drafts are never cached, and a claim
// that needs fewer blocks than the request holds (drafts rejected) gives the rest back.
struct kv_claim {
  request_id id;
  bool admit = false;        // a waiting request: its cached prefix counts as computed and
                             // `computed` is ignored
  int32_t computed = 0;      // tokens whose KV the request's blocks already hold
  int32_t held = 0;          // blocks the request holds (as its last grants gave them)
  uint64_t ns = 0;           // prefix-cache namespace
  std::span<const int32_t> tokens;  // the request's whole sequence
  int32_t speculative = 0;   // positions after tokens (a running request's drafts)
  int32_t evicted = 0;       // KV eviction: tokens dropped from its cache (its blocks hold
                             // computed - evicted slots)
  int32_t kv_budget = 0;     // KV eviction: slots its blocks may hold at most (0: no limit);
                             // granted no more positions than fit, cached as its admission
                             // fills its blocks (not later), prefix hits within its first
                             // chunk (chunk_limit, hit_margin)
  int32_t rewrite_from = -1; // KV eviction: this step's compaction rewrites its slots from
                             // here on (-1: none), so the blocks from there to the step's
                             // last position must be its own: one shared with another
                             // request, or holding a cached prefix, is replaced by a copy
                             // first (copy-on-write; the compaction reads the old one)
  int32_t tier_tokens = 0;   // KV tiers, an admission: its prefix the tiers hold, whole
                             // blocks from the start; what the pool lacks of it is loaded
                             // (kv_grant::loads) and counts as computed
  bool loads_landed = false; // KV tiers, a running request: its loads came back whole, so
                             // its blocks are cached from now on (not before: a failed load
                             // would leave garbage in them)
  int32_t chunk_limit = 0;   // KV eviction: positions a step computes for it at most (0: no
                             // limit); an admission's first chunk ends there, or at its
                             // budget or prompt, whatever its prefix hit
  int32_t hit_margin = 0;    // KV eviction, an admission: the last tokens of that first chunk
                             // a prefix hit never covers (the queries whose attention its
                             // policy counts; at least one), so that a hit changes nothing
                             // the request computes or its policy sees
};

struct kv_grant {
  request_id id;
  int32_t first = 0;             // first token to compute (an admission: its prefix hit)
  int32_t count = 0;             // positions to compute this step, at least one (drafts
                                 // included)
  std::vector<block_id> added;   // blocks appended to the request's table (an admission:
                                 // its whole table); with them it covers first + count
  int32_t dropped = 0;           // blocks taken off the end of the request's table before
                                 // `added`: those of rejected drafts, those a compaction
                                 // emptied, and from the first block replaced by a copy on
                                 // (`added` then holds the table from there)
  int32_t loads = 0;             // KV tiers, an admission: the blocks of its table before
                                 // `first` that the tiers fill (the last `loads` of them)
};

struct kv_step_request {
  std::vector<request_id> releases;  // requests whose blocks go back first
  std::vector<kv_claim> claims;      // granted in order
  int32_t budget = 0;                // tokens the step may still compute
};

struct kv_step_grants {
  std::vector<kv_grant> grants;  // for claims[0 .. grants.size())
  bool short_of_blocks = false;  // claims[grants.size()] did not fit; otherwise the budget
                                 // ran out or every claim was granted
  kv_usage usage;                // after the grants
};

class kv_block_manager {
 public:
  kv_block_manager(uint32_t num_blocks, int32_t block_size, bool prefix_caching);

  // The cached blocks holding the longest prefix of `tokens` in whole blocks, leaving at
  // least the last token to compute (its logits are needed). Takes no reference.
  std::vector<block_id> match_prefix(std::span<const int32_t> tokens, uint64_t ns);

  // Sizes request `id`'s blocks to hold `num_positions` positions, starting from `hits` on
  // its first allocation, and caches the blocks that tokens of `tokens` fill (positions
  // past tokens.size() are drafts: their blocks are held, never cached; with `loading` on
  // its first allocation, nothing is cached until a claim says its loads landed). Blocks past
  // those positions (left by drafts) go back to the pool. Returns false, changing
  // nothing, if too few blocks are free.
  bool allocate(request_id id, std::span<const int32_t> tokens, int32_t num_positions,
                std::span<const block_id> hits, uint64_t ns, bool loading = false);

  // Releases every block of the request (cached ones stay cached until evicted).
  void free(request_id id);
  // Copy-on-write: request `id`'s blocks [from, to) become its own, `reserve` free blocks
  // left over. A block another request holds too is replaced by a fresh one; so is one
  // that holds a cached prefix while blocks are spare (else it leaves the cache), the old
  // one held until the next grant(), so that no claim of this step reuses it before the
  // compaction has read it. Returns the first index replaced (`to` or past: none), or
  // nullopt, changing nothing, when too few blocks are free.
  std::optional<size_t> make_own(request_id id, size_t from, size_t to, uint32_t reserve);

  // Frees the releases, then grants the claims in order until one does not fit or the
  // budget is spent. An admission is matched against the prefix cache first. A claim
  // that contradicts what is held (an admission of a request holding blocks, a running
  // request holding none or fewer than it computed, nothing left to compute, a count of
  // held blocks that differ from the holding) is an error, and the claims before it stay
  // granted in the usage figures only: the caller must start over (a reset).
  expected<kv_step_grants> grant(const kv_step_request& req);
  bool holds(request_id id) const { return held_.count(id) != 0; }

  std::span<const block_id> block_table(request_id id) const;
  int32_t block_size() const { return block_size_; }
  kv_usage usage() const;
  // The cached prefixes, as a router sees them (engine/kv/prefix_summary.hpp).
  prefix_summary summary() const;
  const block_pool& pool() const { return pool_; }
  uint32_t num_free_blocks() const { return pool_.num_free(); }

 private:
  struct holding {
    std::vector<block_id> blocks;
    uint64_t ns = 0;
    uint64_t last_hash = 0;     // chained hash of the last cached (or hit) full block
    int32_t num_hashed = 0;     // full blocks whose hash is known
    bool loading = false;       // KV tiers: some of its blocks are being loaded; none is
                                // cached until they have landed
  };

  block_pool pool_;
  prefix_block_index cache_;
  int32_t block_size_;
  bool prefix_caching_;
  std::unordered_map<request_id, holding> held_;
  std::vector<block_id> held_for_copy_;  // cached blocks replaced by copies this step
  uint64_t queried_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace troupe

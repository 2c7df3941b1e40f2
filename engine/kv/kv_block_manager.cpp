#include "engine/kv/kv_block_manager.hpp"

#include <algorithm>
#include <string>

#include "kernels/common/assert.hpp"

namespace troupe {
namespace {

// Where an evicting admission's first chunk ends: at its prompt, its budget or the most a
// step computes for it, whichever comes first.
int32_t first_chunk_end(const kv_claim& c, int32_t total) {
  return std::min({total, c.kv_budget, c.chunk_limit > 0 ? c.chunk_limit : total});
}

}  // namespace

kv_block_manager::kv_block_manager(uint32_t num_blocks, int32_t block_size, bool prefix_caching)
    : pool_(num_blocks), cache_(num_blocks), block_size_(block_size), prefix_caching_(prefix_caching) {
  TROUPE_ASSERT(block_size > 0 && num_blocks > 0, block_size, num_blocks);
}

prefix_summary kv_block_manager::summary() const {
  prefix_summary s(cache_.size());
  cache_.for_each_hash([&](uint64_t h) { s.add(h); });
  return s;
}

std::vector<block_id> kv_block_manager::match_prefix(std::span<const int32_t> tokens, uint64_t ns) {
  std::vector<block_id> hits;
  if (!prefix_caching_ || tokens.empty()) return hits;
  queried_tokens_ += tokens.size();
  const size_t max_blocks = (tokens.size() - 1) / block_size_;
  uint64_t parent = prefix_block_index::root(ns);
  for (size_t b = 0; b < max_blocks; ++b) {
    const auto blk = tokens.subspan(b * block_size_, block_size_);
    const uint64_t h = prefix_block_index::chain(parent, blk);
    const auto found = cache_.find(h, parent, blk);
    if (!found) break;
    hits.push_back(*found);
    parent = h;
  }
  hit_tokens_ += hits.size() * block_size_;
  return hits;
}

bool kv_block_manager::allocate(request_id id, std::span<const int32_t> tokens, int32_t num_positions,
                                std::span<const block_id> hits, uint64_t ns, bool loading) {
  TROUPE_ASSERT(num_positions >= 0, num_positions);
  const int32_t num_tokens = std::min(num_positions, static_cast<int32_t>(tokens.size()));
  auto it = held_.find(id);
  const bool first = it == held_.end();
  TROUPE_ASSERT(first || hits.empty(), "prefix hits only on a request's first allocation");
  const size_t have = first ? 0 : it->second.blocks.size();
  const size_t want = (static_cast<size_t>(num_positions) + block_size_ - 1) / block_size_;
  const size_t from_hits = std::min(hits.size(), want);
  const size_t fresh = want > have + from_hits ? want - have - from_hits : 0;
  // Hits on free blocks take those blocks out of the free list.
  size_t hits_on_free = 0;
  for (size_t i = 0; i < from_hits; ++i) hits_on_free += pool_.ref_count(hits[i]) == 0;
  if (fresh + hits_on_free > pool_.num_free()) return false;

  if (first) it = held_.emplace(id, holding{{}, ns, prefix_block_index::root(ns), 0, loading}).first;
  holding& h = it->second;
  // Blocks past the positions wanted held rejected drafts, never a cached block (those
  // hold known tokens, which the positions cover).
  while (h.blocks.size() > want) {
    TROUPE_ASSERT(static_cast<int32_t>(h.blocks.size()) > h.num_hashed, h.blocks.size(), h.num_hashed);
    pool_.unref(h.blocks.back());
    h.blocks.pop_back();
  }
  for (size_t i = 0; i < from_hits; ++i) {
    pool_.ref(hits[i]);
    h.blocks.push_back(hits[i]);
  }
  for (size_t i = 0; i < fresh; ++i) {
    const auto b = pool_.allocate();
    TROUPE_ASSERT(b.has_value());
    cache_.evict(*b);  // it may have held a cached prefix nobody was using
    h.blocks.push_back(*b);
  }
  // Hash (and, with caching on, cache) every block the known tokens fill. (A block already
  // cached, such as a hit, stays as it is.)
  const size_t full = h.loading ? 0 : static_cast<size_t>(num_tokens) / block_size_;
  for (size_t b = static_cast<size_t>(h.num_hashed); b < full; ++b) {
    const auto blk = tokens.subspan(b * block_size_, block_size_);
    const uint64_t hash = prefix_block_index::chain(h.last_hash, blk);
    if (prefix_caching_ && b >= from_hits && !cache_.holds(h.blocks[b])) cache_.insert(hash, h.last_hash, blk, h.blocks[b]);
    h.last_hash = hash;
    h.num_hashed = static_cast<int32_t>(b + 1);
  }
  return true;
}

void kv_block_manager::free(request_id id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  const auto& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_.unref(*b);
  held_.erase(it);
}

std::optional<size_t> kv_block_manager::make_own(request_id id, size_t from, size_t to, uint32_t reserve) {
  auto it = held_.find(id);
  TROUPE_ASSERT(it != held_.end(), id.value);
  std::vector<block_id>& blocks = it->second.blocks;
  to = std::min(to, blocks.size());
  auto shared = [&](block_id b) { return pool_.ref_count(b) > 1; };
  uint32_t copies = 0;
  for (size_t i = from; i < to; ++i) copies += shared(blocks[i]);
  if (copies + reserve > pool_.num_free()) return std::nullopt;
  uint32_t spare = pool_.num_free() - copies - reserve;
  size_t first = to;
  for (size_t i = from; i < to; ++i) {
    const block_id old = blocks[i];
    const bool keep_cached = !shared(old) && cache_.holds(old) && spare > 0;
    if (!shared(old) && !keep_cached) {
      cache_.evict(old);  // (nothing cached, or no block to spare: the cache loses it)
      continue;
    }
    const auto b = pool_.allocate();
    TROUPE_ASSERT(b.has_value());
    cache_.evict(*b);
    blocks[i] = *b;
    if (keep_cached) {
      --spare;
      held_for_copy_.push_back(old);  // (its reference, until the next grant)
    } else {
      pool_.unref(old);  // still held by another request
    }
    first = std::min(first, i);
  }
  return first;
}

expected<kv_step_grants> kv_block_manager::grant(const kv_step_request& req) {
  // Cached blocks the last grants replaced by copies go free: whatever a later claim
  // writes into them runs after the compaction that reads them (stages run plans in order,
  // and a plan's compactions in the order of its claims).
  for (block_id b : held_for_copy_) pool_.unref(b);
  held_for_copy_.clear();
  for (request_id id : req.releases) free(id);
  kv_step_grants out;
  int32_t budget = req.budget;
  for (const kv_claim& c : req.claims) {
    if (budget <= 0) break;
    auto who = [&] { return "request " + std::to_string(c.id.value) + ": "; };  // built only for an error
    const int32_t total = static_cast<int32_t>(c.tokens.size());
    auto held = held_.find(c.id);
    kv_grant g;
    g.id = c.id;
    std::vector<block_id> hits;
    const int32_t shift = c.admit ? 0 : c.evicted;  // tokens before the first slot
    if (c.admit) {
      if (held != held_.end()) return error{who() + "admitted while it holds blocks"};
      if (total == 0) return error{who() + "admitted without tokens"};
      hits = match_prefix(c.tokens, c.ns);
      // An evicting request's first chunk ends where it would without a hit, and the hit
      // leaves the chunk's last hit_margin tokens to compute: what its policy sees then is
      // the same with or without a hit. Blocks loaded from the tiers are held to the same.
      int32_t reuse = (total - 1) / block_size_ * block_size_;  // never its last token
      if (c.kv_budget > 0) {
        const int32_t end = first_chunk_end(c, total);
        reuse = std::min(reuse, std::max(0, end - std::max(1, c.hit_margin)) / block_size_ * block_size_);
        hits.resize(std::min(hits.size(), static_cast<size_t>(reuse / block_size_)));
      }
      g.first = static_cast<int32_t>(hits.size()) * block_size_;
      // The tiers hold more of its prefix: those blocks are loaded, not computed (whole
      // blocks, and never its last token, whose logits are wanted).
      const int32_t tier = std::min(c.tier_tokens, reuse);
      if (prefix_caching_ && tier > g.first) {
        g.loads = (tier - g.first) / block_size_;
        g.first = tier;
      }
    } else {
      if (held == held_.end()) return error{who() + "runs without blocks"};
      if (static_cast<int64_t>(held->second.blocks.size()) != c.held)
        return error{who() + "claims to hold " + std::to_string(c.held) + " blocks; it holds " +
                     std::to_string(held->second.blocks.size())};
      if (c.computed < 0 || c.computed >= total || c.evicted < 0 || c.evicted > c.computed ||
          static_cast<int64_t>(held->second.blocks.size()) * block_size_ < c.computed - c.evicted)
        return error{who() + "claims " + std::to_string(c.computed) + " computed of " + std::to_string(total) +
                     " tokens (" + std::to_string(c.evicted) + " evicted), which its " +
                     std::to_string(held->second.blocks.size()) + " blocks contradict"};
      if (c.speculative < 0) return error{who() + "claims a negative number of drafts"};
      if (c.loads_landed) held->second.loading = false;
      g.first = c.computed;
    }
    g.count = std::min(total + (c.admit ? 0 : c.speculative) - g.first, budget);
    if (c.kv_budget > 0) {
      // No request holds more slots than its budget.
      const int32_t slots = g.first - shift;
      if (slots >= c.kv_budget)
        return error{who() + "holds " + std::to_string(slots) + " slots, at or over its KV budget of " +
                     std::to_string(c.kv_budget)};
      g.count = std::min(g.count, c.kv_budget - slots);
      if (c.admit) g.count = std::min(g.count, first_chunk_end(c, total) - g.first);
      if (c.chunk_limit > 0) g.count = std::min(g.count, c.chunk_limit);
    }
    const size_t before = c.admit ? 0 : static_cast<size_t>(c.held);
    const int32_t end_slot = g.first - shift + g.count;
    // A compaction writes the request's blocks from rewrite_from on, and the step's tokens
    // follow: blocks it shares, or that hold a cached prefix, are copied first.
    size_t same = before;
    if (!c.admit && c.rewrite_from >= 0) {
      if (c.rewrite_from > c.computed - c.evicted) return error{who() + "rewrites slots it does not hold"};
      const size_t want = static_cast<size_t>((end_slot + block_size_ - 1) / block_size_);
      const auto own = make_own(c.id, static_cast<size_t>(c.rewrite_from / block_size_), want,
                                static_cast<uint32_t>(want > before ? want - before : 0));
      if (!own) {
        out.short_of_blocks = true;
        break;
      }
      same = std::min(same, *own);
      // Its blocks hold its prefix no more: nothing of it is cached from here on.
      held->second.num_hashed = 0;
    }
    // An evicting request's blocks are cached as its admission fills them (its prompt, as
    // far as the first step takes it), not later: they would not hold its prefix for long.
    const std::span<const int32_t> cached = c.kv_budget > 0 && !c.admit ? std::span<const int32_t>{} : c.tokens;
    if (!allocate(c.id, cached, end_slot, hits, c.ns, g.loads > 0)) {
      out.short_of_blocks = true;
      break;
    }
    const auto table = block_table(c.id);
    const size_t kept = std::min(same, table.size());
    g.dropped = static_cast<int32_t>(before - kept);
    g.added.assign(table.begin() + static_cast<int64_t>(kept), table.end());
    budget -= g.count;
    out.grants.push_back(std::move(g));
  }
  out.usage = usage();
  return out;
}

std::span<const block_id> kv_block_manager::block_table(request_id id) const {
  auto it = held_.find(id);
  if (it == held_.end()) return {};
  return it->second.blocks;
}

kv_usage kv_block_manager::usage() const {
  kv_usage u;
  u.num_blocks = pool_.num_blocks();
  u.free = pool_.num_free();
  u.used = u.num_blocks - u.free;
  u.cached = static_cast<uint32_t>(cache_.size());
  u.queried_tokens = queried_tokens_;
  u.hit_tokens = hit_tokens_;
  return u;
}

}  // namespace troupe

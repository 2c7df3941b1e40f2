#include "actors/wire/kv_codec.hpp"

#include <unordered_set>

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/frame.hpp"
#include "kernels/cpu/paged_attention.hpp"
#include "schema/kv.capnp.h"

namespace troupe::wire {

namespace {

frame_limits limits_for(const kv_limits& lim) {
  // Every claim whole, with its fields, and the releases.
  return frame_limits::flat((static_cast<size_t>(lim.max_claims) * (static_cast<size_t>(lim.context) + 64) +
                             static_cast<size_t>(lim.max_releases)) * 8 + (1 << 16));
}

std::string span_text(int64_t a, int64_t b) { return std::to_string(a) + ".." + std::to_string(b); }

}  // namespace

void kv_claim_sender::restart(uint64_t session) {
  known_.clear();
  last_.clear();
  session_ = session;
  reset_pending_ = true;
}

std::vector<uint8_t> kv_claim_sender::encode(const kv_step_request& q) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::KvStep>();
  root.setSession(session_);
  root.setReset(reset_pending_);
  reset_pending_ = false;
  root.setBudget(q.budget);
  auto rel = root.initReleases(static_cast<unsigned>(q.releases.size()));
  for (size_t i = 0; i < q.releases.size(); ++i) {
    rel.set(static_cast<unsigned>(i), q.releases[i].value);
    known_.erase(q.releases[i]);
  }
  last_.clear();
  auto claims = root.initClaims(static_cast<unsigned>(q.claims.size()));
  for (size_t i = 0; i < q.claims.size(); ++i) {
    const kv_claim& c = q.claims[i];
    auto out = claims[static_cast<unsigned>(i)];
    out.setRequestId(c.id.value);
    out.setAdmit(c.admit);
    out.setComputed(c.computed);
    out.setHeldBlocks(static_cast<uint32_t>(c.held));
    out.setNamespace(c.ns);
    out.setSpeculative(c.speculative);
    out.setEvicted(c.evicted);
    out.setKvBudget(c.kv_budget);
    out.setRewriteFrom(c.rewrite_from);
    out.setTierTokens(c.tier_tokens);
    out.setLoadsLanded(c.loads_landed);
    out.setChunkLimit(c.chunk_limit);
    out.setHitMargin(c.hit_margin);
    int32_t& known = known_[c.id];
    if (c.admit) known = 0;
    const auto rest = c.tokens.subspan(static_cast<size_t>(known));
    out.setTokensFrom(known);
    auto toks = out.initTokens(static_cast<unsigned>(rest.size()));
    for (size_t k = 0; k < rest.size(); ++k) toks.set(static_cast<unsigned>(k), rest[k]);
    known = static_cast<int32_t>(c.tokens.size());
    last_.push_back({c.id, c.admit, c.computed, c.held, static_cast<int32_t>(c.tokens.size()), c.speculative,
                     c.admit ? 0 : c.evicted, c.kv_budget});
  }
  return to_bytes(msg);
}

expected<kv_step_grants> kv_claim_sender::decode(std::span<const uint8_t> bytes) const {
  auto frame = frame_reader::parse(
      bytes, frame_limits::flat((last_.size() * (static_cast<size_t>(lim_.context / lim_.block_size) + 16) + 64) * 8 + 4096));
  if (!frame) return error{"kv grants: " + frame.err().message};
  try {
    auto root = (*frame)->root<schema::KvGrants>();
    // A refusal says why, whichever session the kv manager serves.
    if (root.hasError() && root.getError().size() > 0)
      return error{std::string("kv manager: ") + root.getError().cStr()};
    if (root.getSession() != session_)
      return error{"kv grants of session " + std::to_string(root.getSession()) + ", not " + std::to_string(session_)};
    kv_step_grants out;
    out.short_of_blocks = root.getShortOfBlocks();
    const auto grants = root.getGrants();
    if (grants.size() + (out.short_of_blocks ? 1 : 0) > last_.size())
      return error{"kv grants: " + std::to_string(grants.size()) + " grants for " + std::to_string(last_.size()) + " claims"};
    const size_t max_table = static_cast<size_t>((lim_.context + lim_.block_size - 1) / lim_.block_size);
    for (unsigned k = 0; k < grants.size(); ++k) {
      const auto g = grants[k];
      const sent_claim& c = last_[k];
      auto who = [&] { return "kv grant " + std::to_string(k) + " (request " + std::to_string(c.id.value) + "): "; };
      if (g.getRequestId() != c.id.value) return error{who() + "names request " + std::to_string(g.getRequestId())};
      const int64_t first = g.getFirst(), count = g.getCount();
      if (first < 0 || count < 1 || first + count > c.total + c.speculative || (!c.admit && first != c.computed))
        return error{who() + "tokens " + span_text(first, first + count - 1) + " do not fit the claim"};
      const int64_t dropped = g.getDropped();
      if (dropped < 0 || dropped > (c.admit ? 0 : c.held))
        return error{who() + "drops " + std::to_string(dropped) + " blocks of a table of " +
                     std::to_string(c.admit ? 0 : c.held)};
      const auto added = g.getAdded();
      const size_t table = (c.admit ? 0 : static_cast<size_t>(c.held - dropped)) + added.size();
      const int64_t slots = first - c.evicted + count;  // (KV eviction: fewer slots than tokens)
      if (table > max_table || static_cast<int64_t>(table) * lim_.block_size < slots)
        return error{who() + "a table of " + std::to_string(table) + " blocks does not fit tokens " +
                     span_text(first, first + count - 1)};
      if (c.kv_budget > 0 && slots > c.kv_budget)
        return error{who() + std::to_string(slots) + " slots pass the request's KV budget of " + std::to_string(c.kv_budget)};
      const int64_t loads = g.getLoads();
      if (loads < 0 || (loads > 0 && !c.admit) || loads * lim_.block_size > first)
        return error{who() + std::to_string(loads) + " blocks to load before token " + std::to_string(first)};
      kv_grant out_g;
      out_g.id = c.id;
      out_g.loads = static_cast<int32_t>(loads);
      out_g.first = static_cast<int32_t>(first);
      out_g.count = static_cast<int32_t>(count);
      out_g.dropped = static_cast<int32_t>(dropped);
      out_g.added.reserve(added.size());
      for (uint32_t b : added) {
        if (b >= lim_.num_blocks)
          return error{who() + "block id " + std::to_string(b) + " is outside the pool of " + std::to_string(lim_.num_blocks)};
        out_g.added.push_back(block_id{b});
      }
      out.grants.push_back(std::move(out_g));
    }
    const auto u = root.getUsage();
    out.usage.num_blocks = u.getNumBlocks();
    out.usage.used = u.getUsed();
    out.usage.free = u.getFree();
    out.usage.cached = u.getCached();
    out.usage.queried_tokens = u.getQueriedTokens();
    out.usage.hit_tokens = u.getHitTokens();
    return out;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed kv grants: ") + e.getDescription().cStr()};
  }
}

expected<decoded_kv_step> kv_claim_receiver::decode(std::span<const uint8_t> bytes) {
  auto frame = frame_reader::parse(bytes, limits_for(lim_));
  if (!frame) return error{"kv claims: " + frame.err().message};
  try {
    auto root = (*frame)->root<schema::KvStep>();
    const bool reset = root.getReset();
    if (!reset && (!any_ || root.getSession() != session_))
      return error{"claims of scheduler session " + std::to_string(root.getSession()) +
                   (any_ ? ", but this kv manager serves session " + std::to_string(session_)
                         : ", but this kv manager was never reset (it restarted)")};
    const auto releases = root.getReleases();
    const auto claims = root.getClaims();
    if (releases.size() > static_cast<unsigned>(lim_.max_releases))
      return error{"kv claims release " + std::to_string(releases.size()) + " requests; at most " +
                   std::to_string(lim_.max_releases)};
    if (claims.size() > static_cast<unsigned>(lim_.max_claims))
      return error{"kv claims: " + std::to_string(claims.size()) + " claims; at most " + std::to_string(lim_.max_claims)};
    if (root.getBudget() < 0) return error{"kv claims: negative budget"};

    // Check everything first; apply only a message that passes.
    std::unordered_set<uint64_t> released, seen;
    for (uint64_t id : releases) released.insert(id);
    for (unsigned i = 0; i < claims.size(); ++i) {
      const auto c = claims[i];
      auto who = [&] { return "kv claim " + std::to_string(i) + " (request " + std::to_string(c.getRequestId()) + "): "; };
      if (!seen.insert(c.getRequestId()).second) return error{who() + "request claimed twice in one message"};
      size_t have = 0;
      if (!reset && !released.count(c.getRequestId()))
        if (auto it = tokens_.find(c.getRequestId()); it != tokens_.end()) have = it->second.size();
      const int64_t from = c.getTokensFrom();
      const int64_t total = from + c.getTokens().size();
      if (c.getAdmit() ? from != 0 : from != static_cast<int64_t>(have))
        return error{who() + "tokens start at " + std::to_string(from) + "; the kv manager has " + std::to_string(have)};
      const int64_t budget = c.getKvBudget(), evicted = c.getEvicted();
      if (budget < 0 || budget > lim_.context)
        return error{who() + "a KV budget of " + std::to_string(budget) + "; 0.." + std::to_string(lim_.context) + " may be asked"};
      // (A request within a KV budget may pass the context: its slots stay within it.)
      const int64_t most = budget > 0 ? lim_.max_evicting_tokens : lim_.context;
      if (total < 1 || total > most)
        return error{who() + std::to_string(total) + " tokens; the context holds " + std::to_string(lim_.context)};
      if (evicted < 0 || (c.getAdmit() ? evicted != 0 : evicted > c.getComputed()) || (evicted > 0 && budget == 0))
        return error{who() + std::to_string(evicted) + " tokens evicted of " + std::to_string(c.getComputed()) +
                     " computed" + (budget == 0 ? ", without a KV budget" : "")};
      if (!c.getAdmit() && (c.getComputed() < 0 || c.getComputed() >= total))
        return error{who() + std::to_string(c.getComputed()) + " computed of " + std::to_string(total) + " tokens"};
      const int64_t rewrite = c.getRewriteFrom();
      if (rewrite < -1 || (rewrite >= 0 && (c.getAdmit() || budget == 0 || rewrite > c.getComputed() - evicted)))
        return error{who() + "a compaction from slot " + std::to_string(rewrite) + " of " +
                     std::to_string(c.getAdmit() ? 0 : c.getComputed() - evicted) + " cached" +
                     (budget == 0 ? ", without a KV budget" : "")};
      if (c.getChunkLimit() < 0 || c.getChunkLimit() > most || c.getHitMargin() < 0 || c.getHitMargin() > lim_.context ||
          (budget == 0 && (c.getChunkLimit() != 0 || c.getHitMargin() != 0)))
        return error{who() + "a chunk limit of " + std::to_string(c.getChunkLimit()) + " and a hit margin of " +
                     std::to_string(c.getHitMargin()) + " tokens" + (budget == 0 ? ", without a KV budget" : "")};
      const int64_t drafts = c.getSpeculative();
      if (c.getTierTokens() < 0 || c.getTierTokens() > total || (!c.getAdmit() && c.getTierTokens() != 0))
        return error{who() + "a tier prefix of " + std::to_string(c.getTierTokens()) + " tokens of " + std::to_string(total)};
      // (A token tree's nodes, up to max_tree_tokens - 1; a chain's drafts, up to max_draft_tokens.)
      if (drafts < 0 || drafts > max_tree_tokens - 1 || (c.getAdmit() && drafts != 0))
        return error{who() + std::to_string(drafts) + " draft positions; a running request may claim 0.." +
                     std::to_string(max_tree_tokens - 1)};
      if (total + drafts > most)
        return error{who() + std::to_string(total) + " tokens and " + std::to_string(drafts) +
                     " drafts; the context holds " + std::to_string(lim_.context)};
    }

    decoded_kv_step out;
    out.reset = reset;
    out.session = root.getSession();
    if (reset) tokens_.clear();
    session_ = root.getSession();
    any_ = true;
    out.request.budget = root.getBudget();
    for (uint64_t id : releases) {
      tokens_.erase(id);
      out.request.releases.push_back(request_id{id});
    }
    for (const auto c : claims) {
      auto& toks = tokens_[c.getRequestId()];
      if (c.getAdmit()) toks.clear();
      for (int32_t t : c.getTokens()) toks.push_back(t);
    }
    for (const auto c : claims)
      out.request.claims.push_back(kv_claim{request_id{c.getRequestId()}, c.getAdmit(), c.getComputed(),
                                            static_cast<int32_t>(std::min<uint32_t>(c.getHeldBlocks(), INT32_MAX)),
                                            c.getNamespace(), tokens_[c.getRequestId()], c.getSpeculative(),
                                            c.getEvicted(), c.getKvBudget(), c.getRewriteFrom(), c.getTierTokens(),
                                            c.getLoadsLanded(), c.getChunkLimit(), c.getHitMargin()});
    return out;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed kv claims: ") + e.getDescription().cStr()};
  }
}

std::vector<uint8_t> encode_kv_grants(uint64_t session, const kv_step_grants& g) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::KvGrants>();
  root.setSession(session);
  root.setShortOfBlocks(g.short_of_blocks);
  auto list = root.initGrants(static_cast<unsigned>(g.grants.size()));
  for (size_t k = 0; k < g.grants.size(); ++k) {
    auto out = list[static_cast<unsigned>(k)];
    out.setRequestId(g.grants[k].id.value);
    out.setFirst(g.grants[k].first);
    out.setCount(g.grants[k].count);
    out.setDropped(g.grants[k].dropped);
    out.setLoads(g.grants[k].loads);
    const auto& added = g.grants[k].added;
    auto list = out.initAdded(static_cast<unsigned>(added.size()));
    for (size_t b = 0; b < added.size(); ++b) list.set(static_cast<unsigned>(b), added[b].value);
  }
  auto u = root.initUsage();
  u.setNumBlocks(g.usage.num_blocks);
  u.setUsed(g.usage.used);
  u.setFree(g.usage.free);
  u.setCached(g.usage.cached);
  u.setQueriedTokens(g.usage.queried_tokens);
  u.setHitTokens(g.usage.hit_tokens);
  return to_bytes(msg);
}

std::vector<uint8_t> encode_kv_error(uint64_t session, const std::string& why) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::KvGrants>();
  root.setSession(session);
  root.setError(why);
  return to_bytes(msg);
}

}  // namespace troupe::wire

#include "actors/wire/draft_codec.hpp"

#include <algorithm>
#include <cmath>

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/client_codec.hpp"
#include "actors/wire/frame.hpp"
#include "schema/draft.capnp.h"

namespace troupe::wire {

namespace {

// An order: every slot's sequence whole, its table, its slots' positions, uniforms and
// settings.
frame_limits order_limits(const draft_limits& lim) {
  const size_t per_slot = static_cast<size_t>(lim.context) * 3 + max_draft_tokens + max_logit_bias * 2 + 64;
  return frame_limits::flat(static_cast<size_t>(lim.max_slots) * per_slot * 8 + (1 << 16));
}

// An answer: every slot's drafts with dense rows.
frame_limits answer_limits(const draft_limits& lim) {
  const size_t per_slot = static_cast<size_t>(max_draft_tokens) * (static_cast<size_t>(lim.vocab) / 2 + 16) + 32;
  return frame_limits::flat(static_cast<size_t>(lim.max_slots) * per_slot * 8 + (1 << 16));
}

std::string slot_name(uint64_t id) { return "draft order: request " + std::to_string(id); }

}  // namespace

std::vector<uint8_t> encode_draft_order(const draft_order& o) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::DraftOrder>();
  root.setSession(o.session);
  auto forget = root.initForget(static_cast<unsigned>(o.forget.size()));
  for (size_t i = 0; i < o.forget.size(); ++i) forget.set(static_cast<unsigned>(i), o.forget[i].value);
  auto slots = root.initSlots(static_cast<unsigned>(o.slots.size()));
  for (size_t i = 0; i < o.slots.size(); ++i) {
    const draft_order_slot& s = o.slots[i];
    auto out = slots[static_cast<unsigned>(i)];
    out.setRequestId(s.id.value);
    out.setMaxTokens(s.max_tokens);
    out.setTokensFrom(s.from);
    auto toks = out.initTokens(static_cast<unsigned>(s.tokens.size()));
    for (size_t k = 0; k < s.tokens.size(); ++k) toks.set(static_cast<unsigned>(k), s.tokens[k]);
    auto blocks = out.initBlocks(static_cast<unsigned>(s.blocks.size()));
    for (size_t k = 0; k < s.blocks.size(); ++k) blocks.set(static_cast<unsigned>(k), s.blocks[k].value);
    auto u = out.initUniforms(static_cast<unsigned>(s.uniforms.size()));
    for (size_t k = 0; k < s.uniforms.size(); ++k) u.set(static_cast<unsigned>(k), s.uniforms[k]);
    if (s.sampling) write_sampling(out.initSampling(), *s.sampling);
    out.setPromptTokens(s.prompt_tokens);
    out.setEvicted(s.evicted);
    auto pos = out.initSlotPositions(static_cast<unsigned>(s.positions.size()));
    for (size_t k = 0; k < s.positions.size(); ++k) pos.set(static_cast<unsigned>(k), s.positions[k]);
    out.setRopeInCache(s.rope_in_cache);
  }
  auto tree = root.initTree(static_cast<unsigned>(o.tree.size()));
  for (size_t d = 0; d < o.tree.size(); ++d) tree.set(static_cast<unsigned>(d), o.tree[d]);
  auto moves = root.initCompactions(static_cast<unsigned>(o.compactions.size()));
  for (size_t i = 0; i < o.compactions.size(); ++i) {
    const draft_compaction& c = o.compactions[i];
    auto out = moves[static_cast<unsigned>(i)];
    out.setRequestId(c.id.value);
    auto kept = out.initKept(static_cast<unsigned>(c.kept.size()));
    for (size_t k = 0; k < c.kept.size(); ++k) kept.set(static_cast<unsigned>(k), c.kept[k]);
    out.setRotate(c.rotate);
    for (const auto& [list, table] : {std::pair{out.initBlockTable(static_cast<unsigned>(c.block_table.size())), &c.block_table},
                                      std::pair{out.initNewTable(static_cast<unsigned>(c.new_table.size())), &c.new_table}}) {
      auto l = list;
      for (size_t k = 0; k < table->size(); ++k) l.set(static_cast<unsigned>(k), (*table)[k].value);
    }
  }
  return to_bytes(msg);
}

expected<draft_order> decode_draft_order(std::span<const uint8_t> bytes, const draft_limits& lim) {
  auto frame = frame_reader::parse(bytes, order_limits(lim));
  if (!frame) return error{"draft order: " + frame.err().message};
  try {
    auto root = (*frame)->root<schema::DraftOrder>();
    draft_order o;
    o.session = root.getSession();
    for (uint64_t id : root.getForget()) o.forget.push_back(request_id{id});
    const auto moves = root.getCompactions();
    if (moves.size() > static_cast<unsigned>(lim.max_slots) * 64)
      return error{"draft order: " + std::to_string(moves.size()) + " compactions"};
    for (auto in : moves) {
      draft_compaction c;
      c.id = request_id{in.getRequestId()};
      const std::string who = "draft order: request " + std::to_string(c.id.value) + "'s compaction";
      for (const auto& [list, table] : {std::pair{in.getBlockTable(), &c.block_table}, std::pair{in.getNewTable(), &c.new_table}}) {
        if (list.size() > static_cast<unsigned>(lim.context / lim.block_size + 1))
          return error{who + ": a table of " + std::to_string(list.size()) + " blocks"};
        for (uint32_t b : list) {
          if (b >= lim.num_blocks)
            return error{who + ": block " + std::to_string(b) + " is outside the pool of " + std::to_string(lim.num_blocks)};
          table->push_back(block_id{b});
        }
      }
      // Slot kept[i] goes to slot i: ascending, within the old table.
      const int64_t slots = static_cast<int64_t>(c.block_table.size()) * lim.block_size;
      for (int32_t k : in.getKept()) {
        const auto at = static_cast<int32_t>(c.kept.size());
        if (k < at || k >= slots || (!c.kept.empty() && k <= c.kept.back()))
          return error{who + ": kept slots must ascend within its table of " + std::to_string(slots) + " slots"};
        c.kept.push_back(k);
      }
      if (!c.new_table.empty() && static_cast<int64_t>(c.new_table.size()) * lim.block_size < static_cast<int64_t>(c.kept.size()))
        return error{who + ": a new table of " + std::to_string(c.new_table.size()) + " blocks for " +
                     std::to_string(c.kept.size()) + " kept slots"};
      c.rotate = in.getRotate();
      o.compactions.push_back(std::move(c));
    }
    const auto slots = root.getSlots();
    if (slots.size() > static_cast<unsigned>(lim.max_slots))
      return error{"draft order: " + std::to_string(slots.size()) + " requests; at most " + std::to_string(lim.max_slots)};
    const auto tree = root.getTree();
    if (tree.size() > static_cast<unsigned>(max_draft_tokens))
      return error{"draft order: a tree of depth " + std::to_string(tree.size()) + "; at most " +
                   std::to_string(max_draft_tokens)};
    for (int32_t w : tree) {
      if (w < 1 || w > max_tree_width) return error{"draft order: a tree's widths must be in 1.." + std::to_string(max_tree_width)};
      o.tree.push_back(w);
    }
    for (auto in : slots) {
      draft_order_slot s;
      s.id = request_id{in.getRequestId()};
      const std::string who = slot_name(s.id.value);
      for (const auto& earlier : o.slots)
        if (earlier.id == s.id) return error{who + " comes twice"};
      s.max_tokens = in.getMaxTokens();
      if (s.max_tokens < 1 || s.max_tokens > max_draft_tokens)
        return error{who + ": " + std::to_string(s.max_tokens) + " drafts; 1.." + std::to_string(max_draft_tokens) + " may be asked for"};
      if (!o.tree.empty() && s.max_tokens > static_cast<int32_t>(o.tree.size()))
        return error{who + ": " + std::to_string(s.max_tokens) + " positions in a tree of depth " + std::to_string(o.tree.size())};
      s.from = in.getTokensFrom();
      const auto toks = in.getTokens();
      const int64_t total = int64_t{s.from} + toks.size();
      if (s.from < 0 || total < 1 || total + s.max_tokens > lim.context)
        return error{who + ": a sequence of " + std::to_string(total) + " tokens and " + std::to_string(s.max_tokens) +
                     " drafts does not fit the context of " + std::to_string(lim.context)};
      for (int32_t t : toks) {
        if (t < 0 || t >= lim.vocab) return error{who + ": token " + std::to_string(t) + " is outside the vocabulary"};
        s.tokens.push_back(t);
      }
      // KV eviction: its computed tokens (all but the last) keep total - 1 - evicted slots,
      // one slot at least; the positions named are theirs, ascending.
      s.evicted = in.getEvicted();
      if (s.evicted < 0 || (s.evicted > 0 && s.evicted >= total - 1))
        return error{who + ": " + std::to_string(s.evicted) + " tokens evicted of " + std::to_string(total - 1) + " computed"};
      const auto named = in.getSlotPositions();
      if (named.size() > static_cast<unsigned>(total - 1 - s.evicted))
        return error{who + ": positions for " + std::to_string(named.size()) + " slots; it holds " +
                     std::to_string(total - 1 - s.evicted)};
      if (named.size() != 0 && s.evicted == 0) return error{who + ": slot positions without evicted tokens"};
      for (int32_t p : named) {
        if (p < (s.positions.empty() ? 0 : s.positions.back() + 1) || p >= total - 1)
          return error{who + ": slot positions must ascend within its " + std::to_string(total - 1) + " computed tokens"};
        s.positions.push_back(p);
      }
      s.rope_in_cache = in.getRopeInCache();
      // Every slot up to the last draft's input (the last draft itself is not fed).
      const int64_t positions = total - s.evicted + s.max_tokens - 1;
      const auto blocks = in.getBlocks();
      if (static_cast<int64_t>(blocks.size()) * lim.block_size < positions ||
          static_cast<int64_t>(blocks.size()) * lim.block_size > int64_t{lim.context} + lim.block_size)
        return error{who + ": a table of " + std::to_string(blocks.size()) + " blocks for " + std::to_string(positions) +
                     " positions"};
      for (uint32_t b : blocks) {
        if (b >= lim.num_blocks)
          return error{who + ": block " + std::to_string(b) + " is outside the pool of " + std::to_string(lim.num_blocks)};
        s.blocks.push_back(block_id{b});
      }
      const auto u = in.getUniforms();
      if (u.size() != 0 && u.size() != static_cast<unsigned>(s.max_tokens))
        return error{who + ": " + std::to_string(u.size()) + " uniforms for " + std::to_string(s.max_tokens) + " drafts"};
      for (float x : u) {
        if (!(x >= 0.0f && x < 1.0f)) return error{who + ": a uniform outside [0, 1)"};
        s.uniforms.push_back(x);
      }
      if (s.from == 0) {
        if (!in.hasSampling()) return error{who + ": a new request without its sampler settings"};
        auto sp = read_sampling(in.getSampling(), lim.vocab);
        if (!sp) return error{who + ": " + sp.err().message};
        s.sampling = std::move(sp).value();
        s.prompt_tokens = in.getPromptTokens();
        if (s.prompt_tokens < 1 || s.prompt_tokens > static_cast<int32_t>(s.tokens.size()))
          return error{who + ": a prompt of " + std::to_string(s.prompt_tokens) + " tokens in a sequence of " +
                       std::to_string(s.tokens.size())};
        if (o.tree.empty() && (s.sampling->temperature != 0.0f) != !s.uniforms.empty())
          return error{who + ": random drafts need one uniform each, greedy ones none"};
      }
      if (!o.tree.empty() && !s.uniforms.empty()) return error{who + ": a tree's candidates take no uniforms"};
      o.slots.push_back(std::move(s));
    }
    return o;
  } catch (const kj::Exception& e) {
    return error{std::string("draft order: malformed: ") + e.getDescription().cStr()};
  }
}

std::vector<uint8_t> encode_drafts(const draft_answer& a, int32_t vocab) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::Drafts>();
  root.setSession(a.session);
  auto slots = root.initSlots(static_cast<unsigned>(a.slots.size()));
  for (size_t i = 0; i < a.slots.size(); ++i) {
    const drafted& d = a.slots[i];
    auto out = slots[static_cast<unsigned>(i)];
    out.setRequestId(d.id.value);
    out.setUnknown(d.unknown);
    auto toks = out.initTokens(static_cast<unsigned>(d.tokens.size()));
    for (size_t k = 0; k < d.tokens.size(); ++k) toks.set(static_cast<unsigned>(k), d.tokens[k]);
    if (!d.levels.empty()) {
      auto levels = out.initLevels(static_cast<unsigned>(d.levels.size()));
      for (size_t p = 0; p < d.levels.size(); ++p) {
        auto level = levels.init(static_cast<unsigned>(p), static_cast<unsigned>(d.levels[p].size()));
        for (size_t k = 0; k < d.levels[p].size(); ++k) level.set(static_cast<unsigned>(k), d.levels[p][k]);
      }
    }
    if (d.q.empty()) continue;
    auto rows = out.initRows(static_cast<unsigned>(d.tokens.size()));
    for (size_t k = 0; k < d.tokens.size(); ++k) {
      const float* q = d.q.data() + k * static_cast<size_t>(vocab);
      const auto mass = static_cast<size_t>(std::count_if(q, q + vocab, [](float x) { return x != 0.0f; }));
      auto row = rows[static_cast<unsigned>(k)];
      if (mass * 2 >= static_cast<size_t>(vocab)) {
        auto dense = row.initDense(static_cast<unsigned>(vocab));
        for (int32_t v = 0; v < vocab; ++v) dense.set(static_cast<unsigned>(v), q[v]);
        continue;
      }
      auto ids = row.initTokens(static_cast<unsigned>(mass));
      auto probs = row.initProbs(static_cast<unsigned>(mass));
      unsigned n = 0;
      for (int32_t v = 0; v < vocab; ++v)
        if (q[v] != 0.0f) {
          ids.set(n, v);
          probs.set(n++, q[v]);
        }
    }
  }
  return to_bytes(msg);
}

std::vector<uint8_t> encode_draft_refusal(const std::string& why) {
  capnp::MallocMessageBuilder msg;
  msg.initRoot<schema::Drafts>().setError(why);
  return to_bytes(msg);
}

expected<draft_answer> decode_drafts(std::span<const uint8_t> bytes, const draft_limits& lim) {
  auto frame = frame_reader::parse(bytes, answer_limits(lim));
  if (!frame) return error{"drafts: " + frame.err().message};
  try {
    auto root = (*frame)->root<schema::Drafts>();
    if (root.hasError() && root.getError().size() > 0) return error{std::string("draft actor: ") + root.getError().cStr()};
    draft_answer a;
    a.session = root.getSession();
    const auto slots = root.getSlots();
    if (slots.size() > static_cast<unsigned>(lim.max_slots)) return error{"drafts: too many requests"};
    const auto vocab = static_cast<size_t>(lim.vocab);
    for (auto in : slots) {
      drafted d;
      d.id = request_id{in.getRequestId()};
      d.unknown = in.getUnknown();
      const auto toks = in.getTokens();
      if (toks.size() > static_cast<unsigned>(max_draft_tokens)) return error{"drafts: more than a step takes"};
      for (int32_t t : toks) d.tokens.push_back(t);  // (checked against the order: draft_orders::take)
      const auto levels = in.getLevels();
      if (levels.size() > toks.size()) return error{"drafts: candidates for more positions than drafted"};
      for (const auto level : levels) {
        if (level.size() > static_cast<unsigned>(max_tree_width)) return error{"drafts: more candidates than a tree is wide"};
        auto& out = d.levels.emplace_back();  // (checked against the order: draft_orders::take)
        for (int32_t t : level) out.push_back(t);
      }
      const auto rows = in.getRows();
      if (rows.size() != 0 && rows.size() != toks.size()) return error{"drafts: a distribution for each draft, or none"};
      d.q.assign(rows.size() * vocab, 0.0f);
      for (unsigned k = 0; k < rows.size(); ++k) {
        float* q = d.q.data() + k * vocab;
        const auto row = rows[k];
        if (row.hasDense() && row.getDense().size() > 0) {
          const auto dense = row.getDense();
          if (dense.size() != vocab) return error{"drafts: a distribution that is not over the vocabulary"};
          for (unsigned v = 0; v < dense.size(); ++v) q[v] = dense[v];
          continue;
        }
        const auto ids = row.getTokens();
        const auto probs = row.getProbs();
        if (ids.size() != probs.size() || ids.size() > vocab) return error{"drafts: a sparse distribution out of shape"};
        for (unsigned n = 0; n < ids.size(); ++n) {
          if (ids[n] < 0 || static_cast<size_t>(ids[n]) >= vocab) return error{"drafts: a token outside the vocabulary"};
          q[ids[n]] = probs[n];
        }
      }
      a.slots.push_back(std::move(d));
    }
    return a;
  } catch (const kj::Exception& e) {
    return error{std::string("drafts: malformed: ") + e.getDescription().cStr()};
  }
}

}  // namespace troupe::wire

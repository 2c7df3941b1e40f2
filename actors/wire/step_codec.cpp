#include "actors/wire/step_codec.hpp"

#include <cmath>
#include <optional>
#include <set>
#include <string>

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/frame.hpp"
#include "kernels/cpu/paged_attention.hpp"
#include "schema/step.capnp.h"

namespace troupe::wire {

void step_encoder::restart(uint64_t session) {
  sent_.clear();
  session_ = session;
  next_step_ = 0;
  reset_pending_ = true;
}

std::vector<uint8_t> step_encoder::encode(const step_plan& plan, std::span<const request_id> released,
                                          std::span<const std::optional<token_choice>> choices,
                                          std::span<const int32_t> features) {
  for (request_id id : plan.preempted) sent_.erase(id);  // their tables start anew
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::StepPlan>();
  root.setStepId(next_step_++);
  root.setSession(session_);
  root.setResetAll(reset_pending_);
  reset_pending_ = false;
  auto compactions = root.initCompactions(static_cast<unsigned>(plan.compactions.size()));
  for (size_t i = 0; i < plan.compactions.size(); ++i) {
    const planned_compaction& pc = plan.compactions[i];
    auto out = compactions[static_cast<unsigned>(i)];
    out.setRequestId(pc.id.value);
    auto kept = out.initKept(static_cast<unsigned>(pc.kept.size()));
    for (size_t k = 0; k < pc.kept.size(); ++k) kept.set(static_cast<unsigned>(k), pc.kept[k]);
    out.setRotate(pc.rotate);
  }
  auto chunks = root.initChunks(static_cast<unsigned>(plan.chunks.size()));
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const scheduled_chunk& c = plan.chunks[i];
    auto out = chunks[static_cast<unsigned>(i)];
    out.setRequestId(c.id.value);
    out.setFirst(c.first);
    TROUPE_ASSERT(c.draft.size() == static_cast<size_t>(c.num_draft), c.draft.size(), c.num_draft);
    auto toks = out.initTokens(static_cast<unsigned>(c.tokens.size() + c.draft.size()));
    for (size_t k = 0; k < c.tokens.size(); ++k) toks.set(static_cast<unsigned>(k), c.tokens[k]);
    for (size_t k = 0; k < c.draft.size(); ++k) toks.set(static_cast<unsigned>(c.tokens.size() + k), c.draft[k]);
    out.setDrafts(c.num_draft);
    if (!c.draft_parents.empty()) {
      TROUPE_ASSERT(c.draft_parents.size() == c.draft.size(), c.draft_parents.size(), c.draft.size());
      auto up = out.initDraftParents(static_cast<unsigned>(c.draft_parents.size()));
      for (size_t k = 0; k < c.draft_parents.size(); ++k) up.set(static_cast<unsigned>(k), c.draft_parents[k]);
    }
    if (i < features.size()) out.setFeatures(features[i]);
    if (!c.window_first.empty()) {
      TROUPE_ASSERT(c.window_first.size() == static_cast<size_t>(c.count), c.window_first.size(), c.count);
      auto w = out.initWindowFirst(static_cast<unsigned>(c.window_first.size()));
      for (size_t k = 0; k < c.window_first.size(); ++k) w.set(static_cast<unsigned>(k), c.window_first[k]);
    }
    out.setEvicted(c.evicted);
    out.setRopeInCache(c.rope_in_cache);
    out.setAttention(c.attention);
    // A table that changed other than by growing (blocks of rejected drafts handed back,
    // a compaction's copies of shared blocks) goes whole again: a delta only appends.
    std::vector<block_id>& known_table = sent_[c.id];
    const bool reset = known_table.empty() || known_table.size() > c.block_table.size() ||
                       !std::equal(known_table.begin(), known_table.end(), c.block_table.begin());
    const size_t known = reset ? 0 : known_table.size();
    out.setResetTable(reset);
    auto blocks = out.initNewBlocks(static_cast<unsigned>(c.block_table.size() - known));
    for (size_t b = known; b < c.block_table.size(); ++b) blocks.set(static_cast<unsigned>(b - known), c.block_table[b].value);
    known_table.assign(c.block_table.begin(), c.block_table.end());
    out.setSample(c.sample);
    if (c.sample && i < choices.size() && choices[i]) {
      const token_choice& ch = *choices[i];
      out.setChoose(true);
      out.setTemperature(ch.how.temperature);
      out.setTopK(ch.how.top_k);
      out.setTopP(ch.how.top_p);
      out.setMinP(ch.how.min_p);
      out.setU(ch.u);
    }
  }
  auto moves = [](auto list, const std::vector<tier_move>& from) {
    for (size_t i = 0; i < from.size(); ++i) {
      auto m = list[static_cast<unsigned>(i)];
      m.setRequestId(from[i].id.value);
      m.setBlock(from[i].block.value);
      m.setKeyHi(from[i].key.hi);
      m.setKeyLo(from[i].key.lo);
      if (!from[i].to.empty()) m.setTo(from[i].to);
    }
  };
  moves(root.initTierLoads(static_cast<unsigned>(plan.tier_loads.size())), plan.tier_loads);
  moves(root.initTierSaves(static_cast<unsigned>(plan.tier_saves.size())), plan.tier_saves);
  moves(root.initKvPushes(static_cast<unsigned>(plan.kv_pushes.size())), plan.kv_pushes);
  auto prefetch = root.initTierPrefetch(static_cast<unsigned>(plan.tier_prefetch.size()));
  for (size_t i = 0; i < plan.tier_prefetch.size(); ++i) {
    prefetch[static_cast<unsigned>(i)].setHi(plan.tier_prefetch[i].hi);
    prefetch[static_cast<unsigned>(i)].setLo(plan.tier_prefetch[i].lo);
  }
  auto rel = root.initReleased(static_cast<unsigned>(released.size()));
  for (size_t i = 0; i < released.size(); ++i) {
    rel.set(static_cast<unsigned>(i), released[i].value);
    sent_.erase(released[i]);
  }
  return to_bytes(msg);
}

namespace {

// What a chunk asks of the last stage (drafts and their tree, features, the choice of its
// token) that does not fit the chunk: the problem in words.
std::optional<std::string> last_stage_problem(schema::Chunk::Reader c) {
  const auto toks = c.getTokens();
  const auto parents = c.getDraftParents();
  const int32_t most = parents.size() > 0 ? max_tree_tokens - 1 : max_draft_tokens;
  if (c.getDrafts() != 0) {
    if (c.getDrafts() < 0 || c.getDrafts() > most)
      return std::to_string(c.getDrafts()) + " drafts; 0.." + std::to_string(most) + " allowed" +
             (parents.size() > 0 ? " in a token tree" : "");
    if (static_cast<unsigned>(c.getDrafts()) >= toks.size()) return "drafts but no known token before them";
    if (!c.getSample()) return "drafts in a chunk that samples nothing";
    if (c.getChoose() && c.getTemperature() != 0.0f)
      return "drafts are chosen on the shard only greedily (their verification needs the logits)";
  }
  if (parents.size() > 0) {
    if (parents.size() != static_cast<unsigned>(c.getDrafts()))
      return std::to_string(parents.size()) + " tree parents for " + std::to_string(c.getDrafts()) + " drafts";
    if (toks.size() != parents.size() + 1) return "a token tree follows one known token, its root";
    if (c.getAttention()) return "a token tree whose attention KV eviction reads (they do not run together)";
    if (c.getChoose()) return "a token tree's tokens are not chosen on the shard (its verification needs the logits)";
    for (unsigned k = 0; k < parents.size(); ++k)
      if (parents[k] < -1 || parents[k] >= static_cast<int32_t>(k))
        return "draft " + std::to_string(k) + "'s parent " + std::to_string(parents[k]) + " is not -1 or an earlier draft";
  }
  if (c.getFeatures() < 0 || static_cast<unsigned>(c.getFeatures()) > toks.size())
    return "features of " + std::to_string(c.getFeatures()) + " tokens; it has " + std::to_string(toks.size());
  if (c.getChoose()) {
    if (!c.getSample()) return "a choice for a chunk that samples nothing";
    const float t = c.getTemperature(), p = c.getTopP(), mp = c.getMinP(), u = c.getU();
    if (!(t >= 0.0f) || !std::isfinite(t)) return "temperature must be a finite number >= 0";
    if (c.getTopK() < 0) return "top_k must be >= 0";
    if (!(p > 0.0f && p <= 1.0f)) return "top_p must be in (0, 1]";
    if (!(mp >= 0.0f && mp <= 1.0f)) return "min_p must be in [0, 1]";
    if (!(u >= 0.0f && u < 1.0f)) return "u must be in [0, 1)";
  }
  return std::nullopt;
}

}  // namespace

expected<decoded_step> step_decoder::decode(std::span<const uint8_t> bytes) {
  const auto fl = frame_limits::flat(static_cast<size_t>(lim_.max_step_tokens + lim_.max_chunks * 4) * 16 +
                                     static_cast<size_t>(lim_.num_blocks) * 3 * 48 + (1 << 16));
  auto frame = frame_reader::parse(bytes, fl);
  if (!frame) return frame.err();
  try {
    auto root = (*frame)->root<schema::StepPlan>();
    const auto chunks = root.getChunks();
    if (chunks.size() > static_cast<unsigned>(lim_.max_chunks))
      return error{"step plan has " + std::to_string(chunks.size()) + " chunks; at most " + std::to_string(lim_.max_chunks)};
    const bool reset_all = root.getResetAll();
    if (!reset_all && any_ && root.getSession() != session_)
      return error{"step plan of scheduler session " + std::to_string(root.getSession()) + " is stale (now " +
                   std::to_string(session_) + ")"};
    if (!reset_all && any_ && root.getStepId() <= last_step_)
      return error{"step plan " + std::to_string(root.getStepId()) + " does not follow " + std::to_string(last_step_)};
    const size_t max_table = static_cast<size_t>((lim_.context + lim_.block_size - 1) / lim_.block_size);

    // Check everything first; apply only a plan that passes.
    std::set<uint64_t> seen;
    int64_t total = 0;
    for (unsigned i = 0; i < chunks.size(); ++i) {
      const auto c = chunks[i];
      auto who = [&] { return "chunk " + std::to_string(i) + " (request " + std::to_string(c.getRequestId()) + "): "; };
      if (!seen.insert(c.getRequestId()).second) return error{who() + "request appears twice in one step"};
      const auto toks = c.getTokens();
      const auto blocks = c.getNewBlocks();
      if (toks.size() == 0) return error{who() + "no tokens"};
      total += toks.size();
      if (total > lim_.max_step_tokens) return error{"step plan exceeds " + std::to_string(lim_.max_step_tokens) + " tokens"};
      const int64_t first = c.getFirst(), evicted = c.getEvicted();
      if (first >= 0 && (evicted < 0 || evicted > first))
        return error{who() + std::to_string(evicted) + " tokens evicted before position " + std::to_string(first)};
      // Slots, and RoPE positions (a request whose positions are its slots may pass the
      // context in tokens), within the context.
      const int64_t slot = first - evicted, rope = c.getRopeInCache() ? slot : first;
      if (first < 0 || std::max(slot, rope) + static_cast<int64_t>(toks.size()) > int64_t{lim_.context})
        return error{who() + "positions " + std::to_string(first) + ".." + std::to_string(first + toks.size() - 1) +
                     " are outside the context of " + std::to_string(lim_.context)};
      for (int32_t t : toks)
        if (t < 0 || t >= lim_.vocab) return error{who() + "token id " + std::to_string(t) + " is outside the vocabulary"};
      size_t known = 0;
      if (!c.getResetTable()) {
        if (reset_all) return error{who() + "a plan that resets every table must send each table whole"};
        auto it = tables_.find(c.getRequestId());
        if (it == tables_.end()) return error{who() + "unknown request (its table was never sent)"};
        known = it->second.size();
      }
      if (known + blocks.size() > max_table) return error{who() + "block table longer than the context needs"};
      for (uint32_t b : blocks)
        if (b >= lim_.num_blocks) return error{who() + "block id " + std::to_string(b) + " is outside the pool of " + std::to_string(lim_.num_blocks)};
      if ((known + blocks.size()) * static_cast<uint64_t>(lim_.block_size) < static_cast<uint64_t>(slot) + toks.size())
        return error{who() + "block table does not cover its positions"};
      if (auto problem = last_stage_problem(c)) return error{who() + *problem};
      if (const auto w = c.getWindowFirst(); w.size() > 0) {
        if (w.size() != toks.size()) return error{who() + "a window start for each token, or none"};
        for (unsigned k = 0; k < w.size(); ++k)
          if (w[k] < 0 || w[k] > slot + k || (k > 0 && w[k] < w[k - 1]))
            return error{who() + "window starts must ascend, none past its token's slot"};
      }
    }

    // Compactions move slots within tables the stages hold already.
    const auto compactions = root.getCompactions();
    if (compactions.size() > static_cast<unsigned>(lim_.max_chunks))
      return error{"step plan has " + std::to_string(compactions.size()) + " compactions; at most " +
                   std::to_string(lim_.max_chunks)};
    std::set<uint64_t> compacted;
    for (unsigned i = 0; i < compactions.size(); ++i) {
      const auto c = compactions[i];
      auto who = [&] { return "compaction " + std::to_string(i) + " (request " + std::to_string(c.getRequestId()) + "): "; };
      if (!compacted.insert(c.getRequestId()).second) return error{who() + "request compacted twice in one step"};
      const auto it = reset_all ? tables_.end() : tables_.find(c.getRequestId());
      if (it == tables_.end()) return error{who() + "unknown request (its table was never sent)"};
      const int64_t slots = static_cast<int64_t>(it->second.size()) * lim_.block_size;
      const auto kept = c.getKept();
      for (unsigned k = 0; k < kept.size(); ++k)
        if (kept[k] < static_cast<int32_t>(k) || kept[k] >= slots || (k > 0 && kept[k] <= kept[k - 1]))
          return error{who() + "kept slots must ascend within its table of " + std::to_string(it->second.size()) + " blocks"};
      // The table the plan leaves it (its chunk's, if it has one) holds them.
      size_t after = it->second.size();
      for (const auto ch : chunks)
        if (ch.getRequestId() == c.getRequestId()) after = (ch.getResetTable() ? 0 : after) + ch.getNewBlocks().size();
      if (after * static_cast<size_t>(lim_.block_size) < kept.size())
        return error{who() + std::to_string(kept.size()) + " kept slots do not fit the " + std::to_string(after) +
                     " blocks its table has after the plan"};
    }

    // KV tiers and pushes: blocks of requests with a chunk here, in their tables as the
    // plan leaves them, at most one load, one save and one push per block.
    const auto tier_loads = root.getTierLoads(), tier_saves = root.getTierSaves(), pushes = root.getKvPushes();
    for (const auto& [list, kind] :
         {std::pair{tier_loads, "load"}, std::pair{tier_saves, "save"}, std::pair{pushes, "push"}}) {
      const std::string what = kind;  // (clang 14 lets no lambda capture a structured binding)
      if (list.size() > lim_.num_blocks)
        return error{"step plan has " + std::to_string(list.size()) + " tier " + what + "s; the pool has " +
                     std::to_string(lim_.num_blocks) + " blocks"};
      std::set<std::pair<uint32_t, std::string>> blocks;  // (a push's block goes once to each replica)
      for (unsigned i = 0; i < list.size(); ++i) {
        const auto m = list[i];
        auto who = [&] { return std::string("tier ") + what + " " + std::to_string(i) + " (request " + std::to_string(m.getRequestId()) + "): "; };
        if (!blocks.emplace(m.getBlock(), std::string(m.getTo().cStr(), m.getTo().size())).second)
          return error{who() + "block " + std::to_string(m.getBlock()) + " twice"};
        if (m.getTo().size() > 64) return error{who() + "a replica name past 64 bytes"};
        const bool push = std::string_view(what) == "push";
        if (push != (m.getTo().size() > 0)) return error{who() + (push ? "no replica to send it to" : "a replica to send it to")};
        bool found = false;
        for (const auto ch : chunks) {
          if (ch.getRequestId() != m.getRequestId()) continue;
          for (uint32_t b : ch.getNewBlocks()) found = found || b == m.getBlock();
          if (!found && !ch.getResetTable() && !reset_all)
            if (auto it = tables_.find(m.getRequestId()); it != tables_.end())
              found = std::find(it->second.begin(), it->second.end(), block_id{m.getBlock()}) != it->second.end();
        }
        if (!found) return error{who() + "block " + std::to_string(m.getBlock()) + " is not in a table of this plan"};
      }
    }

    const auto prefetch = root.getTierPrefetch();
    if (prefetch.size() > lim_.num_blocks)
      return error{"step plan has " + std::to_string(prefetch.size()) + " tier prefetches; the pool has " +
                   std::to_string(lim_.num_blocks) + " blocks"};

    decoded_step out;
    out.step_id = root.getStepId();
    for (const auto k : prefetch) out.tier_prefetch.push_back(tier_key{k.getHi(), k.getLo()});
    for (const auto& [list, to] : {std::pair{tier_loads, &out.tier_loads}, std::pair{tier_saves, &out.tier_saves},
                                   std::pair{pushes, &out.kv_pushes}})
      for (const auto m : list)
        to->push_back({request_id{m.getRequestId()}, block_id{m.getBlock()}, tier_key{m.getKeyHi(), m.getKeyLo()},
                       std::string(m.getTo().cStr(), m.getTo().size())});
    for (const auto c : compactions) {
      out.compaction_tables.push_back(tables_[c.getRequestId()]);
      auto& kept = out.compaction_kept.emplace_back();
      for (int32_t k : c.getKept()) kept.push_back(k);
      out.compaction_rotate.push_back(c.getRotate());
    }
    if (reset_all) tables_.clear();
    session_ = root.getSession();
    for (uint64_t id : root.getReleased()) tables_.erase(id);
    for (const auto c : chunks) {
      auto& table = tables_[c.getRequestId()];
      if (c.getResetTable()) table.clear();
      for (uint32_t b : c.getNewBlocks()) table.push_back(block_id{b});
    }
    // A compaction moves the kept slots into the table the plan leaves its request (the
    // same blocks, but for copies of shared ones).
    for (const auto c : compactions) {
      const auto& now = tables_[c.getRequestId()];
      const auto& before = out.compaction_tables[out.compaction_new_tables.size()];
      out.compaction_new_tables.push_back(now == before ? std::vector<block_id>{} : now);
    }
    for (size_t i = 0; i < out.compaction_tables.size(); ++i) {
      const auto& to = out.compaction_new_tables[i];
      out.batch.compactions.push_back({out.compaction_tables[i], out.compaction_kept[i], out.compaction_rotate[i] != 0, to});
    }
    int64_t attention = 0;
    // (A verifying chunk's attention comes back by token: scheduled_chunk::attention_sums.)
    for (const auto c : chunks)
      if (c.getAttention())
        attention += attention_values(c.getFirst() - c.getEvicted(), static_cast<int32_t>(c.getTokens().size()),
                                      c.getDrafts() > 0);
    out.attention.assign(static_cast<size_t>(attention), 0.0f);
    float* mass = out.attention.data();
    bool every_sample_chooses = true;
    out.tree_parents.reserve(chunks.size());  // (the batch points into them)
    out.window_first.reserve(chunks.size());
    for (const auto c : chunks) {
      const auto toks = c.getTokens();
      const auto first_row = static_cast<int32_t>(out.batch.tokens.size());
      for (int32_t r = static_cast<int32_t>(toks.size()) - c.getFeatures(); r < static_cast<int32_t>(toks.size()); ++r)
        out.feature_rows.push_back(first_row + r);
      const int32_t rows = c.getSample() ? 1 + c.getDrafts() : 0;
      const int32_t slot = c.getFirst() - c.getEvicted();
      const int32_t* parents = nullptr;
      if (const auto up = c.getDraftParents(); up.size() > 0) {
        tree_parents_of(up, out.tree_parents.emplace_back());
        parents = out.tree_parents.back().data();
      }
      chunk_tokens_.clear();
      for (int32_t t : toks) chunk_tokens_.push_back(t);
      const int32_t* window = nullptr;
      if (const auto w = c.getWindowFirst(); w.size() > 0) {
        auto& starts = out.window_first.emplace_back();
        for (int32_t s : w) starts.push_back(s);
        window = starts.data();
      }
      mass = out.batch.add_chunk(chunk_tokens_, tables_[c.getRequestId()],
                                 {.start_pos = slot,
                                  .rope_pos = c.getRopeInCache() ? slot : c.getFirst(),
                                  .logit_rows = rows,
                                  .tree_parents = parents,
                                  .window_first = window,
                                  .attention = c.getAttention(),
                                  .by_token = c.getDrafts() > 0},
                                 mass);
      out.ids.push_back(request_id{c.getRequestId()});
      if (!c.getSample()) continue;
      every_sample_chooses = every_sample_chooses && c.getChoose();
      out.choices.insert(out.choices.end(), static_cast<size_t>(rows),
                         token_choice{{c.getTemperature(), c.getTopK(), c.getTopP(), c.getMinP()}, c.getU()});
      out.chosen_ids.insert(out.chosen_ids.end(), static_cast<size_t>(rows), request_id{c.getRequestId()});
    }
    if (!every_sample_chooses) {
      out.choices.clear();
      out.chosen_ids.clear();
    }
    last_step_ = out.step_id;
    any_ = true;
    return out;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed step plan: ") + e.getDescription().cStr()};
  }
}

}  // namespace troupe::wire

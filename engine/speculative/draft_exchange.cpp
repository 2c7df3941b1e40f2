#include "engine/speculative/draft_exchange.hpp"

#include <cmath>
#include <string>

namespace troupe {

void draft_orders::restart(uint64_t session) {
  session_ = session;
  told_.clear();
  told_evicted_.clear();
  forget_.clear();
  compactions_.clear();
  last_.clear();
}

void draft_orders::forget(request_id id) {
  told_evicted_.erase(id);
  std::erase_if(compactions_, [&](const draft_compaction& c) { return c.id == id; });
  if (told_.erase(id) > 0) forget_.push_back(id);
}

void draft_orders::compacted(const planned_compaction& c) {
  if (!told_.count(c.id)) return;  // (the server has no copy to move)
  compactions_.push_back({c.id, c.kept, c.rotate, c.block_table, c.new_table});
}

std::optional<draft_order> draft_orders::make(const step_plan& plan, scheduler& sched, std::span<const int32_t> tree) {
  last_.clear();
  tree_.assign(tree.begin(), tree.end());
  draft_order o;
  o.session = session_;
  o.tree = tree_;
  for (const auto& c : plan.chunks) {
    if (c.num_draft == 0) continue;
    request* r = sched.find(c.id);
    TROUPE_ASSERT(r != nullptr, c.id.value);
    draft_order_slot s;
    s.id = c.id;
    // A tree's proposer drafts its depth's positions along one path (fill_drafts; one,
    // for a tree cut to a single draft).
    s.max_tokens = tree.empty() ? c.num_draft : std::min(c.num_draft, static_cast<int32_t>(tree.size()));
    const auto told = told_.find(c.id);
    s.from = told == told_.end() ? 0 : std::min(told->second, r->num_tokens());
    s.tokens.assign(r->tokens.begin() + s.from, r->tokens.end());
    if (s.from == 0) {
      s.sampling = r->params.sampling;
      s.prompt_tokens = r->num_prompt_tokens;
    }
    s.blocks = r->blocks;
    s.evicted = r->eviction.evicted;
    s.rope_in_cache = r->eviction.rope_in_cache();
    if (s.from == 0 || told_evicted_[c.id] != r->eviction.evicted) {
      if (r->eviction.evicted > 0) s.positions.assign(r->eviction.kept.positions().begin(), r->eviction.kept.positions().end());
      told_evicted_[c.id] = r->eviction.evicted;
    }
    if (r->smp.params().temperature != 0.0f && tree.empty())
      for (int32_t j = 0; j < s.max_tokens; ++j) s.uniforms.push_back(static_cast<float>(r->drafts.stream.uniform()));
    told_[c.id] = r->num_tokens();
    last_.push_back({c.id, s.max_tokens});
    o.slots.push_back(std::move(s));
  }
  if (o.slots.empty()) return std::nullopt;
  o.forget = std::move(forget_);
  forget_.clear();
  o.compactions = std::move(compactions_);
  compactions_.clear();
  return o;
}

namespace {

// Whether q is a distribution each of whose rows gives its drafted token some mass (an
// acceptance test divides by it).
bool sound_q(std::span<const float> q, std::span<const int32_t> tokens, int32_t vocab) {
  for (size_t j = 0; j < tokens.size(); ++j) {
    const float* row = q.data() + j * static_cast<size_t>(vocab);
    double sum = 0.0;
    for (int32_t v = 0; v < vocab; ++v) {
      if (!(row[v] >= 0.0f && row[v] <= 1.0f)) return false;
      sum += row[v];
    }
    if (!(row[tokens[j]] > 0.0f) || std::abs(sum - 1.0) > 1e-3) return false;
  }
  return true;
}

}  // namespace

status draft_orders::take(step_plan& plan, scheduler& sched, draft_answer a, int32_t vocab) {
  if (a.session != session_) return error{"drafts of another session"};
  if (a.slots.size() != last_.size())
    return error{"drafts for " + std::to_string(a.slots.size()) + " requests; " + std::to_string(last_.size()) +
                 " were asked for"};
  for (size_t i = 0; i < a.slots.size(); ++i) {
    const drafted& d = a.slots[i];
    const std::string who = "drafts for request " + std::to_string(d.id.value);
    if (d.id != last_[i].id) return error{who + " where request " + std::to_string(last_[i].id.value) + "'s were due"};
    if (static_cast<int32_t>(d.tokens.size()) > last_[i].max_tokens)
      return error{who + ": " + std::to_string(d.tokens.size()) + " of " + std::to_string(last_[i].max_tokens) + " slots"};
    if (d.unknown && !d.tokens.empty()) return error{who + ": drafts from an unknown sequence"};
    for (int32_t t : d.tokens)
      if (t < 0 || t >= vocab) return error{who + ": token " + std::to_string(t) + " is outside the vocabulary"};
    if (!d.q.empty() && (d.q.size() != d.tokens.size() * static_cast<size_t>(vocab) || !sound_q(d.q, d.tokens, vocab)))
      return error{who + ": their distributions are not distributions over the vocabulary that drew them"};
    if (tree_.empty() != d.levels.empty() && !d.tokens.empty())
      return error{who + (tree_.empty() ? ": a tree's candidates for a chain" : ": a chain for a tree")};
    if (d.levels.size() > d.tokens.size()) return error{who + ": candidates for more positions than it drafted"};
    for (size_t p = 0; p < d.levels.size(); ++p) {
      if (d.levels[p].size() > static_cast<size_t>(tree_[p])) return error{who + ": more candidates than the tree's width"};
      for (int32_t t : d.levels[p])
        if (t < 0 || t >= vocab) return error{who + ": candidate " + std::to_string(t) + " is outside the vocabulary"};
    }
  }
  slots_.clear();
  for (drafted& d : a.slots) {
    if (d.unknown) {
      told_.erase(d.id);
      told_evicted_.erase(d.id);
    }
    request* r = sched.find(d.id);
    draft_slot s{r, static_cast<int32_t>(d.tokens.size()), std::move(d.tokens), {}, {}};
    // A greedy request verifies against its argmax alone.
    if (r && r->smp.params().temperature != 0.0f) s.q = std::move(d.q);
    if (!tree_.empty()) {  // take_drafts makes the tree
      s.tree = tree_;
      s.levels = std::move(d.levels);
    }
    slots_.push_back(std::move(s));
  }
  last_.clear();
  take_drafts(plan, slots_);
  return ok();
}

void draft_orders::give_up(step_plan& plan) {
  for (auto& c : plan.chunks) {
    c.count -= c.num_draft;
    plan.num_tokens -= c.num_draft;
    c.num_draft = 0;
    c.draft = {};
  }
}

void draft_server::drop(request_id id) {
  copies_.erase(id);
  slots_held_.erase(id);
  proposer_->forget(id);
}

bool draft_server::follow_slots(const draft_order_slot& s, const request& copy) {
  if (s.evicted == 0) {
    slots_held_.erase(s.id);
    return true;
  }
  std::vector<int32_t>& held = slots_held_[s.id];
  if (!s.positions.empty()) held = s.positions;
  // Its computed tokens (all but its last) take this many slots; those past the ones
  // named hold the positions after, in order.
  const int32_t slots = copy.num_tokens() - 1 - s.evicted;
  if (held.empty() || static_cast<int32_t>(held.size()) > slots) return false;
  while (static_cast<int32_t>(held.size()) < slots) held.push_back(held.back() + 1);
  return held.back() == copy.num_tokens() - 2;
}

draft_answer draft_server::serve(const draft_order& o) {
  if (!started_ || o.session != session_) {
    copies_.clear();
    proposer_->forget_all();
    session_ = o.session;
    started_ = true;
  }
  for (request_id id : o.forget) drop(id);
  for (const draft_compaction& c : o.compactions)
    if (copies_.count(c.id)) proposer_->compacted(c.id, {c.block_table, c.kept, c.rotate, c.new_table});
  draft_answer a;
  a.session = o.session;
  a.slots.resize(o.slots.size());
  slots_.clear();
  std::vector<size_t> at;  // the answer slot of each proposer slot
  for (size_t i = 0; i < o.slots.size(); ++i) {
    const draft_order_slot& s = o.slots[i];
    a.slots[i].id = s.id;
    request* r = nullptr;
    size_t known = 0;  // of s.tokens, already in the copy
    if (s.from == 0) {
      drop(s.id);
      request_params p;
      p.prompt.assign(s.tokens.begin(), s.tokens.begin() + s.prompt_tokens);
      p.sampling = s.sampling.value_or(sampling_params{});
      auto copy = std::make_unique<request>(s.id, std::move(p), 0);
      r = copy.get();
      copies_[s.id] = std::move(copy);
      known = static_cast<size_t>(s.prompt_tokens);
    } else {
      const auto it = copies_.find(s.id);
      if (it == copies_.end() || it->second->num_tokens() != s.from) {
        drop(s.id);
        a.slots[i].unknown = true;
        continue;
      }
      r = it->second.get();
    }
    // The output so far goes through the copy's sampler, for its penalties.
    for (size_t j = known; j < s.tokens.size(); ++j) {
      r->tokens.push_back(s.tokens[j]);
      r->smp.replay(s.tokens[j]);
    }
    r->blocks = s.blocks;
    if (!follow_slots(s, *r)) {
      drop(s.id);
      a.slots[i].unknown = true;
      continue;
    }
    slots_.push_back({r, s.max_tokens, {}, {}, s.uniforms, o.tree});
    if (s.evicted > 0) slots_.back().slot_positions = slots_held_[s.id];
    slots_.back().rope_in_cache = s.rope_in_cache;
    at.push_back(i);
  }
  if (!slots_.empty()) proposer_->propose(slots_);
  for (size_t j = 0; j < slots_.size(); ++j) {
    a.slots[at[j]].tokens = std::move(slots_[j].tokens);
    a.slots[at[j]].q = std::move(slots_[j].q);
    a.slots[at[j]].levels = std::move(slots_[j].levels);
  }
  return a;
}

}  // namespace troupe

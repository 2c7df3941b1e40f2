#include "engine/speculative/speculative.hpp"

#include <algorithm>

#include "engine/speculative/heads.hpp"
#include "kernels/cpu/argmax.hpp"
#include "kernels/cpu/paged_attention.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {

std::string_view spec_method_name(spec_method m) {
  switch (m) {
    case spec_method::none: return "none";
    case spec_method::ngram: return "ngram";
    case spec_method::draft: return "draft";
    case spec_method::early_exit: return "early-exit";
    case spec_method::medusa: return "medusa";
    case spec_method::eagle: return "eagle";
  }
  return "?";
}

std::optional<spec_method> parse_spec_method(std::string_view s) {
  for (spec_method m : {spec_method::none, spec_method::ngram, spec_method::draft, spec_method::early_exit,
                        spec_method::medusa, spec_method::eagle})
    if (s == spec_method_name(m)) return m;
  if (s == "off") return spec_method::none;
  return std::nullopt;
}

int32_t speculative_config::tree_nodes() const {
  int64_t nodes = 0, level = 1;
  for (int32_t w : tree) {
    level *= std::max(w, 0);
    nodes += level;
    if (nodes > 1 << 20) break;
  }
  return static_cast<int32_t>(std::min<int64_t>(nodes, 1 << 20));
}

std::string speculative_config::drafts_text() const {
  if (tree_auto > 0) return "a tree chosen by acceptance, " + std::to_string(tree_auto) + " nodes at most";
  if (tree.empty()) return "k " + std::to_string(k);
  std::string widths;
  for (int32_t w : tree) {
    if (!widths.empty()) widths += ',';
    widths += std::to_string(w);
  }
  return "tree " + widths + " (" + std::to_string(tree_nodes()) + " nodes)";
}

std::optional<std::string> validate(const speculative_config& c, const model_config& target) {
  if (!c.enabled()) return std::nullopt;
  if (c.tree_auto != 0) {
    if (c.tree_auto < 1 || c.tree_auto > max_tree_tokens - 1)
      return "a tree's node budget must be in 1.." + std::to_string(max_tree_tokens - 1) + "; got " +
             std::to_string(c.tree_auto);
    if (c.tree.empty()) return "a tree chosen from acceptance needs a first shape";
    if (c.max_step_tokens < c.tree_auto + 1)
      return "max_step_tokens " + std::to_string(c.max_step_tokens) + " cannot hold a tree of " +
             std::to_string(c.tree_auto) + " nodes and its root";
  }
  if (!c.tree.empty()) {
    if (static_cast<int32_t>(c.tree.size()) > max_draft_tokens)
      return "a tree of depth " + std::to_string(c.tree.size()) + " is deeper than " + std::to_string(max_draft_tokens);
    for (int32_t w : c.tree)
      if (w < 1 || w > max_tree_width)
        return "a tree's widths must be in 1.." + std::to_string(max_tree_width) + "; got " + std::to_string(w);
    if (c.tree_nodes() > max_tree_tokens - 1)
      return "a tree of " + std::to_string(c.tree_nodes()) + " nodes is more than one pass verifies (" +
             std::to_string(max_tree_tokens - 1) + ")";
    if (c.max_step_tokens < c.tree_nodes() + 1)
      return "max_step_tokens " + std::to_string(c.max_step_tokens) + " cannot hold a tree of " +
             std::to_string(c.tree_nodes()) + " nodes and its root";
  }
  if (c.k < 1 || c.k > max_draft_tokens)
    return "speculative k must be in 1.." + std::to_string(max_draft_tokens) + "; got " + std::to_string(c.k);
  if (c.max_step_tokens < 2)
    return "speculative max_step_tokens must be at least 2; got " + std::to_string(c.max_step_tokens);
  if (c.method == spec_method::ngram && (c.ngram_min < 1 || c.ngram_max < c.ngram_min || c.ngram_max > 64))
    return "n-gram lengths must satisfy 1 <= min <= max <= 64";
  if (c.method == spec_method::early_exit) {
    if (target.num_layers < 2) return "early exit needs a target of two layers or more";
    const int32_t l = c.exit_layer_for(target.num_layers);
    if (l < 1 || l >= target.num_layers)
      return "exit layer " + std::to_string(c.exit_layer) + " is outside the model: it has " +
             std::to_string(target.num_layers) + " layers, so the exit layer must be in 1.." +
             std::to_string(target.num_layers - 1);
  }
  return std::nullopt;
}

std::optional<std::string> check_draft(const model& draft, const model& target) {
  if (draft.config.vocab_size != target.config.vocab_size)
    return "the draft model's vocabulary has " + std::to_string(draft.config.vocab_size) +
           " tokens; the target's has " + std::to_string(target.config.vocab_size) +
           ": a draft must share the target's vocabulary";
  if (draft.config.max_seq_len < target.config.max_seq_len)
    return "the draft model's context is " + std::to_string(draft.config.max_seq_len) + " tokens; the target's is " +
           std::to_string(target.config.max_seq_len) + ": a draft must reach as far";
  if (draft.vocab && target.vocab) {
    const auto& a = draft.vocab->pieces;
    const auto& b = target.vocab->pieces;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i])
        return "the draft model's token " + std::to_string(i) + " differs from the target's: a draft must share the target's vocabulary";
  }
  return std::nullopt;
}

std::optional<std::string> check_heads(const speculative_config& c, const speculative_heads& h) {
  const bool medusa = h.kind == heads_kind::medusa;
  if (c.method != (medusa ? spec_method::medusa : spec_method::eagle))
    return h.path + " holds " + (medusa ? "Medusa heads" : "an EAGLE head") + "; speculative method " +
           std::string(spec_method_name(c.method)) + " needs " + (medusa ? "an EAGLE head" : "Medusa heads");
  if (!c.tree.empty() && static_cast<int32_t>(c.tree.size()) > h.depth())
    return "a tree of depth " + std::to_string(c.tree.size()) + " is deeper than the " + std::to_string(h.depth()) +
           " Medusa heads of " + h.path + " reach";
  if (c.tree.empty() && c.k > h.depth())
    return "k " + std::to_string(c.k) + " drafts a step, deeper than the " + std::to_string(h.depth()) +
           " Medusa heads of " + h.path + " reach";
  return std::nullopt;
}

int32_t next_draft_length(int32_t current, int32_t proposed, int32_t accepted, int32_t cap) {
  const int32_t next = accepted >= proposed ? std::max(current, proposed) + 1 : accepted + 1;
  return std::clamp(next, 1, std::max(cap, 1));
}

void after_verify(request& r, int32_t proposed, int32_t accepted, const speculative_config& c) {
  r.drafts.length = next_draft_length(r.drafts.length, proposed, accepted, draft_cap(r, c));
  if (accepted > 0) {
    r.drafts.misses = 0;
  } else if (proposed == 1 && ++r.drafts.misses >= 2) {
    r.drafts.pause = std::min(64, 4 << std::min(r.drafts.misses - 2, 4));
  }
}

void plan_drafts(std::span<request* const> running, const speculative_config& c, int32_t context) {
  // Every running request takes a token of the step; drafts share what is left.
  int32_t left = c.max_step_tokens - static_cast<int32_t>(running.size());
  for (request* r : running) {
    r->drafts.wanted = 0;
    if (!c.enabled() || r->in_flight || r->num_tokens() - r->num_computed_tokens != 1 || left <= 0) continue;
    if (r->drafts.pause > 0) {
      --r->drafts.pause;
      continue;
    }
    // Drafts past max_tokens or the context could never be kept (a sequence that streaming
    // eviction carries past the context goes on without them).
    const int32_t room = std::min(r->params.max_tokens - r->num_output_tokens(), context - r->num_tokens()) - 1;
    if (!c.tree.empty()) {
      // A whole tree, or nothing: its depth kept, its nodes held. After a tree that kept
      // nothing (its length is then 1), a single draft, until one is kept, as a chain
      // shrinks; single misses then pause drafting as they do a chain's.
      const bool single = r->drafts.length == 1;
      const int32_t nodes = single ? 1 : c.tree_nodes();
      const int32_t depth = single ? 1 : static_cast<int32_t>(c.tree.size());
      if (r->params.speculative == 0 || depth > room || nodes > std::min(left, context - r->num_tokens() - 1)) continue;
      r->drafts.wanted = nodes;
      left -= nodes;
      continue;
    }
    const int32_t limit = draft_cap(*r, c);
    if (r->drafts.length == 0) r->drafts.length = limit;
    const int32_t want = std::min({r->drafts.length, limit, room, left});
    if (want <= 0) continue;
    r->drafts.wanted = want;
    left -= want;
  }
}

void fill_drafts(step_plan& plan, scheduler& sched, proposer& p, std::vector<draft_slot>& slots,
                 std::span<const int32_t> tree) {
  slots.clear();
  for (const auto& c : plan.chunks) {
    if (c.num_draft == 0) continue;
    // A tree's proposer drafts its depth's positions along one path (one, for a tree cut
    // to a single draft).
    const int32_t positions = tree.empty() ? c.num_draft : std::min(c.num_draft, static_cast<int32_t>(tree.size()));
    request* r = sched.find(c.id);
    slots.push_back({r, positions, {}, {}, {}, tree});
    if (r->eviction.evicted > 0) {
      TROUPE_ASSERT(r->eviction.kept.size() == r->num_computed_tokens - r->eviction.evicted, r->eviction.kept.size(), r->num_computed_tokens, r->eviction.evicted);
      slots.back().slot_positions = r->eviction.kept.positions();
    }
    slots.back().rope_in_cache = r->eviction.rope_in_cache();
  }
  if (slots.empty()) return;
  p.propose(slots);
  take_drafts(plan, slots);
}

void build_tree(std::span<const std::vector<int32_t>> levels, std::span<const int32_t> widths, int32_t max_nodes,
                std::vector<int32_t>& tokens, std::vector<int32_t>& parents) {
  tokens.clear();
  parents.clear();
  std::vector<int32_t> above = {-1}, next;  // the nodes of the depth above
  for (size_t d = 0; d < levels.size() && d < widths.size(); ++d) {
    next.clear();
    const int32_t width = std::min(widths[d], static_cast<int32_t>(levels[d].size()));
    for (int32_t up : above)
      for (int32_t j = 0; j < width; ++j) {
        if (static_cast<int32_t>(tokens.size()) >= max_nodes) return;
        next.push_back(static_cast<int32_t>(tokens.size()));
        tokens.push_back(levels[d][j]);
        parents.push_back(up);
      }
    above.swap(next);
  }
}

void draft_next(draft_slot& s, sampler& view, float* logits, int32_t vocab, std::vector<float>& scratch) {
  if (s.tree.empty()) {
    choose_draft(s, view, logits, vocab, scratch);
    return;
  }
  const size_t depth = s.levels.size();
  s.levels.push_back(view.ranked(logits, vocab, depth < s.tree.size() ? s.tree[depth] : 1));
  const int32_t d = s.levels.back().front();
  view.replay(d);
  s.tokens.push_back(d);
}

void choose_draft(draft_slot& s, sampler& view, float* logits, int32_t vocab, std::vector<float>& scratch) {
  const bool greedy = view.params().temperature == 0.0f;
  float* q;
  if (greedy) {
    scratch.resize(static_cast<size_t>(vocab));
    q = scratch.data();
  } else {
    s.q.resize(s.q.size() + static_cast<size_t>(vocab));
    q = s.q.data() + s.q.size() - vocab;
  }
  view.distribution(logits, vocab, q);  // greedy: 1 at the argmax
  const float u = greedy ? 0.0f : s.uniforms.empty() ? s.req->drafts.stream.uniform() : s.uniforms[s.tokens.size()];
  const int32_t d = greedy ? argmax(q, vocab) : draw(q, vocab, u);
  view.replay(d);
  s.tokens.push_back(d);
}

void observe_features(const step_plan& plan, scheduler& sched, std::span<const int32_t> emitted,
                      std::span<const std::vector<int32_t>> paths, const float* hidden, int32_t dim, proposer& p) {
  if (!p.wants_features()) return;
  size_t row = 0, sampled = 0;
  std::vector<float> gathered;
  const auto d = static_cast<size_t>(dim);
  for (const auto& c : plan.chunks) {
    int32_t held = c.count - c.num_draft;  // the known tokens
    const float* rows = hidden + row * d;
    if (c.sample) {
      TROUPE_ASSERT(sampled < emitted.size(), sampled, emitted.size());
      const std::vector<int32_t>* path = sampled < paths.size() && !paths[sampled].empty() ? &paths[sampled] : nullptr;
      const int32_t e = emitted[sampled++];
      if (c.num_draft > 0) held += e - 1;  // and the accepted drafts
      if (path) {  // a tree's root, then its accepted path
        gathered.assign(rows, rows + d);
        for (int32_t node : *path) gathered.insert(gathered.end(), rows + (node + 1) * d, rows + (node + 2) * d);
        rows = gathered.data();
      }
    }
    const request* r = sched.find(c.id);
    if (r && r->state == request_state::running)  // (one that ended meanwhile is forgotten)
      p.observe(c.id, c.first, rows, held);
    row += static_cast<size_t>(c.count);
  }
}

void take_drafts(step_plan& plan, std::span<draft_slot> slots) {
  size_t i = 0;
  for (auto& c : plan.chunks) {
    if (c.num_draft == 0) continue;
    TROUPE_ASSERT(i < slots.size(), i, slots.size());
    draft_slot& s = slots[i++];
    if (!s.req) s.tokens.clear();
    if (!s.tree.empty()) {  // the path's candidates become the tree
      if (s.levels.size() < s.tokens.size())  // (a proposer of one candidate a position)
        for (size_t d = s.levels.size(); d < s.tokens.size(); ++d) s.levels.push_back({s.tokens[d]});
      build_tree(s.levels, s.tree, c.num_draft, s.tokens, s.parents);
      s.q.clear();
    }
    TROUPE_ASSERT(static_cast<int32_t>(s.tokens.size()) <= c.num_draft, s.tokens.size(), c.num_draft);
    const int32_t shortfall = c.num_draft - static_cast<int32_t>(s.tokens.size());
    c.count -= shortfall;
    plan.num_tokens -= shortfall;
    c.num_draft = static_cast<int32_t>(s.tokens.size());
    if (!s.req) {
      c.draft = {};
      continue;
    }
    s.req->drafts.tokens = std::move(s.tokens);
    s.req->drafts.q = std::move(s.q);
    s.req->drafts.parents = std::move(s.parents);
    c.draft = s.req->drafts.tokens;
    c.draft_parents = s.req->drafts.parents;
  }
}

}  // namespace troupe

#include "engine/spec/speculative.hpp"

#include <algorithm>

#include "engine/spec/heads.hpp"
#include "kernels/cpu/argmax.hpp"
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

std::optional<std::string> validate(const speculative_config& c, const model_config& target) {
  if (!c.enabled()) return std::nullopt;
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
  if (c.k > h.depth())
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
    const int32_t limit = draft_cap(*r, c);
    if (r->drafts.length == 0) r->drafts.length = limit;
    // Drafts past max_tokens or the context could never be kept.
    const int32_t room = std::min(r->params.max_tokens - r->num_output_tokens(), context - r->num_tokens()) - 1;
    const int32_t want = std::min({r->drafts.length, limit, room, left});
    if (want <= 0) continue;
    r->drafts.wanted = want;
    left -= want;
  }
}

void fill_drafts(step_plan& plan, scheduler& sched, proposer& p, std::vector<draft_slot>& slots) {
  slots.clear();
  for (const auto& c : plan.chunks)
    if (c.num_draft > 0) slots.push_back({sched.find(c.id), c.num_draft, {}, {}, {}});
  if (slots.empty()) return;
  p.propose(slots);
  take_drafts(plan, slots);
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

void observe_features(const step_plan& plan, scheduler& sched, std::span<const int32_t> emitted, const float* hidden,
                      int32_t dim, proposer& p) {
  if (!p.wants_features()) return;
  size_t row = 0, sampled = 0;
  for (const auto& c : plan.chunks) {
    int32_t held = c.count - c.num_draft;  // the known tokens
    if (c.sample) {
      TROUPE_ASSERT(sampled < emitted.size(), sampled, emitted.size());
      const int32_t e = emitted[sampled++];
      if (c.num_draft > 0) held += e - 1;  // and the accepted drafts
    }
    const request* r = sched.find(c.id);
    if (r && r->state == request_state::running)  // (one that ended meanwhile is forgotten)
      p.observe(c.id, c.first, hidden + row * static_cast<size_t>(dim), held);
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
    c.draft = s.req->drafts.tokens;
  }
}

}  // namespace troupe

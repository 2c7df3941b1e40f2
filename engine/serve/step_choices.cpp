#include "engine/serve/step_choices.hpp"

#include <algorithm>
#include <array>

#include "kernels/cpu/paged_attention.hpp"

namespace troupe {

std::vector<token_choice> shard_choices(const step_plan& plan, scheduler& sched) {
  std::vector<token_choice> out;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    const request* r = sched.find(c.id);
    if (r == nullptr || !r->smp.needs_only_logits()) return {};
    if (c.num_draft > 0 && (r->smp.params().temperature != 0.0f || !r->drafts.parents.empty())) return {};
    out.insert(out.end(), static_cast<size_t>(1 + c.num_draft), r->smp.next_choice());
  }
  return out;
}

std::vector<std::optional<token_choice>> shard_choices_by_chunk(const step_plan& plan, scheduler& sched) {
  std::vector<std::optional<token_choice>> out(plan.chunks.size());
  const std::vector<token_choice> rows = shard_choices(plan, sched);
  if (rows.empty()) return out;
  size_t k = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (!plan.chunks[i].sample) continue;
    out[i] = rows[k];
    k += 1 + static_cast<size_t>(plan.chunks[i].num_draft);
  }
  return out;
}

namespace {

// How deep the request's drafts reach: a chain's length, a tree's levels (its nodes,
// at most max_tree_tokens - 1, each after its parent).
int32_t draft_depth(const request& r, int32_t proposed) {
  if (r.drafts.parents.empty()) return proposed;
  TROUPE_ASSERT(r.drafts.parents.size() < max_tree_tokens, r.drafts.parents.size());
  std::array<int32_t, max_tree_tokens> depth;
  int32_t deepest = 0;
  for (size_t i = 0; i < r.drafts.parents.size(); ++i) {
    const int32_t p = r.drafts.parents[i];
    depth[i] = p < 0 ? 1 : depth[static_cast<size_t>(p)] + 1;
    deepest = std::max(deepest, depth[i]);
  }
  return deepest;
}

void count_verify(step_tokens& out, request& r, int32_t proposed, int32_t accepted, const speculative_config& spec) {
  const int32_t depth = std::min(draft_depth(r, proposed), max_draft_tokens);
  for (int32_t d = 0; d < depth; ++d) {
    ++out.spec.offered_at[static_cast<size_t>(d)];
    out.spec.kept_at[static_cast<size_t>(d)] += d < accepted;
  }
  ++out.spec.verifies;
  out.spec.proposed += static_cast<uint64_t>(proposed);
  out.spec.accepted += static_cast<uint64_t>(accepted);
  ++out.spec.by_accepted[static_cast<size_t>(accepted)];
  after_verify(r, proposed, accepted, spec);
}

}  // namespace

step_tokens replay_chosen(const step_plan& plan, scheduler& sched, std::span<const int32_t> chosen,
                          const speculative_config& spec) {
  step_tokens out;
  size_t row = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    const std::span<const int32_t> rows = chosen.subspan(row, static_cast<size_t>(1 + c.num_draft));
    row += rows.size();
    request* r = sched.find(c.id);
    // Ended while its step ran, or sent back to compute again (its KV loads failed): its
    // token, never recorded.
    if (r == nullptr || r->state != request_state::running) {
      out.samples.push_back({rows[0], 0.0f, {}});
      out.emitted.push_back(1);
      continue;
    }
    TROUPE_ASSERT(r->drafts.tokens.size() == static_cast<size_t>(c.num_draft), r->drafts.tokens.size(), c.num_draft);
    // Greedy drafts: kept while each equals its row's argmax, then that row's argmax.
    int32_t accepted = 0;
    while (accepted < c.num_draft && r->drafts.tokens[static_cast<size_t>(accepted)] == rows[static_cast<size_t>(accepted)])
      ++accepted;
    for (int32_t j = 0; j <= accepted; ++j) {
      sample_result s;
      s.token = rows[static_cast<size_t>(j)];
      r->smp.replay(s.token);
      out.samples.push_back(s);
    }
    out.emitted.push_back(accepted + 1);
    if (c.num_draft > 0) count_verify(out, *r, c.num_draft, accepted, spec);
  }
  return out;
}

step_tokens sample_rows(const step_plan& plan, scheduler& sched, float* logits, int32_t vocab,
                        const speculative_config& spec) {
  step_tokens out;
  size_t row = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    float* l = logits + row * static_cast<size_t>(vocab);
    row += 1 + static_cast<size_t>(c.num_draft);
    request* r = sched.find(c.id);
    // Ended while its step ran, or sent back to compute again (its KV loads failed): a
    // placeholder, never recorded (its sampler untouched).
    if (r == nullptr || r->state != request_state::running) {
      out.samples.emplace_back();
      out.emitted.push_back(1);
      continue;
    }
    if (c.num_draft == 0) {
      out.samples.push_back(r->smp.sample(l, vocab));
      out.emitted.push_back(1);
      continue;
    }
    const bool tree = !r->drafts.parents.empty();
    std::vector<int32_t> path;
    std::vector<sample_result> got = tree ? r->smp.verify_tree(l, vocab, r->drafts.tokens, r->drafts.parents, path)
                                          : r->smp.verify(l, vocab, r->drafts.tokens, r->drafts.q);
    const auto accepted = static_cast<int32_t>(got.size()) - 1;
    if (tree) {
      out.paths.resize(out.emitted.size());
      out.paths.push_back(std::move(path));
    }
    count_verify(out, *r, c.num_draft, accepted, spec);
    out.emitted.push_back(accepted + 1);
    for (auto& s : got) out.samples.push_back(std::move(s));
  }
  return out;
}

}  // namespace troupe

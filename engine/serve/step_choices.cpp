#include "engine/serve/step_choices.hpp"

namespace troupe {

std::vector<token_choice> shard_choices(const step_plan& plan, scheduler& sched) {
  std::vector<token_choice> out;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    const request* r = sched.find(c.id);
    if (r == nullptr || !r->smp.needs_only_logits()) return {};
    out.push_back(r->smp.next_choice());
  }
  return out;
}

std::vector<std::optional<token_choice>> shard_choices_by_chunk(const step_plan& plan, scheduler& sched) {
  std::vector<std::optional<token_choice>> out(plan.chunks.size());
  const std::vector<token_choice> rows = shard_choices(plan, sched);
  if (rows.empty()) return out;
  size_t k = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i)
    if (plan.chunks[i].sample) out[i] = rows[k++];
  return out;
}

std::vector<sample_result> replay_chosen(const step_plan& plan, scheduler& sched, std::span<const int32_t> chosen) {
  std::vector<sample_result> out;
  size_t k = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    sample_result s;
    s.token = chosen[k++];
    if (request* r = sched.find(c.id)) r->smp.replay(s.token);
    out.push_back(s);
  }
  return out;
}

std::vector<sample_result> sample_rows(const step_plan& plan, scheduler& sched, float* logits, int32_t vocab) {
  std::vector<sample_result> out;
  size_t row = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    float* l = logits + row++ * static_cast<size_t>(vocab);
    request* r = sched.find(c.id);
    out.push_back(r != nullptr ? r->smp.sample(l, vocab) : sample_result{});
  }
  return out;
}

}  // namespace troupe

#include "engine/sched/scheduler.hpp"

#include <algorithm>

namespace troupe {

std::string_view finish_reason_name(finish_reason r) {
  switch (r) {
    case finish_reason::none: return "none";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::aborted: return "aborted";
  }
  return "?";
}

scheduler::scheduler(const scheduler_config& cfg, const tokenizer& tok)
    : cfg_(cfg), tok_(tok), kv_(cfg.num_blocks, cfg.block_size, cfg.prefix_caching) {
  TROUPE_ASSERT(cfg.max_step_tokens > 0 && cfg.max_running > 0 && cfg.context > 0 && cfg.vocab > 0,
                cfg.max_step_tokens, cfg.max_running, cfg.context, cfg.vocab);
}

bool scheduler::before(const request& a, const request& b) const {
  if (cfg_.policy == schedule_policy::priority && a.params.priority != b.params.priority)
    return a.params.priority < b.params.priority;
  return a.arrival < b.arrival;
}

void scheduler::insert_waiting(request* r) {
  auto at = std::upper_bound(waiting_.begin(), waiting_.end(), r,
                             [this](const request* x, const request* y) { return before(*x, *y); });
  waiting_.insert(at, r);
}

status scheduler::add(request_id id, request_params p) {
  const std::string who = "request " + std::to_string(id.value) + ": ";
  if (requests_.count(id)) return error{who + "the id is already in use"};
  if (p.prompt.empty()) return error{who + "the prompt is empty"};
  if (static_cast<int64_t>(p.prompt.size()) >= cfg_.context)
    return error{who + "the prompt has " + std::to_string(p.prompt.size()) +
                 " tokens; the model's context is " + std::to_string(cfg_.context)};
  for (int32_t t : p.prompt)
    if (t < 0 || t >= cfg_.vocab)
      return error{who + "token id " + std::to_string(t) + " is outside the vocabulary (" +
                   std::to_string(cfg_.vocab) + ")"};
  for (int32_t t : p.stop_tokens)
    if (t < 0 || t >= cfg_.vocab) return error{who + "stop token " + std::to_string(t) + " is outside the vocabulary"};
  if (p.max_tokens < 1) return error{who + "max_tokens must be at least 1"};
  if (auto e = validate(p.sampling)) return error{who + *e};
  const int64_t blocks = (static_cast<int64_t>(p.prompt.size()) + cfg_.block_size) / cfg_.block_size;
  if (blocks > cfg_.num_blocks)
    return error{who + "the prompt needs " + std::to_string(blocks) + " KV blocks; the pool has " +
                 std::to_string(cfg_.num_blocks)};
  if (static_cast<int64_t>(p.delivered.size()) >= p.max_tokens ||
      static_cast<int64_t>(p.prompt.size() + p.delivered.size()) >= cfg_.context)
    return error{who + "the output already delivered leaves nothing to generate"};
  for (int32_t t : p.delivered)
    if (t < 0 || t >= cfg_.vocab) return error{who + "delivered token id " + std::to_string(t) + " is outside the vocabulary"};
  auto r = std::make_unique<request>(id, std::move(p), next_arrival_++);
  // Replay what was delivered: the same sampler, detokenizer and stop-string state as the
  // attempt that streamed it, and no text from it again.
  for (int32_t t : r->params.delivered) {
    const int32_t prev = r->tokens.back();
    r->tokens.push_back(t);
    r->smp.replay(t);
    (void)r->stops.push(r->utf8.push(tok_.decode(prev, t)));
  }
  if (r->stops.stopped()) return error{who + "the output already delivered ends at a stop string"};
  insert_waiting(r.get());
  requests_.emplace(id, std::move(r));
  return ok();
}

size_t scheduler::reset_kv() {
  const size_t n = running_.size();
  for (request* r : running_) requeue(*r);
  running_.clear();
  const kv_usage before = kv_.usage();
  queried_before_reset_ += before.queried_tokens;
  hits_before_reset_ += before.hit_tokens;
  kv_ = kv_block_manager(cfg_.num_blocks, cfg_.block_size, cfg_.prefix_caching);
  return n;
}

request* scheduler::find(request_id id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

step_output scheduler::finish(request& r, finish_reason why) {
  step_output out;
  out.id = r.id;
  out.finished = true;
  out.reason = why;
  if (why != finish_reason::aborted && !r.stops.stopped()) out.text = r.stops.push(r.utf8.finish()) + r.stops.flush();
  out.num_prompt_tokens = r.num_prompt_tokens;
  out.num_output_tokens = r.num_output_tokens();
  kv_.free(r.id);
  std::erase(running_, &r);
  std::erase(waiting_, &r);
  requests_.erase(r.id);  // r is gone from here on
  return out;
}

std::optional<step_output> scheduler::abort(request_id id) {
  request* r = find(id);
  if (!r) return std::nullopt;
  return finish(*r, finish_reason::aborted);
}

// Back to waiting with its tokens kept; it recomputes its KV when admitted again.
void scheduler::requeue(request& r) {
  r.num_computed_tokens = 0;
  r.state = request_state::waiting;
  r.in_flight = false;
  ++r.num_preemptions;
  insert_waiting(&r);
}

void scheduler::preempt(request& r, step_plan& plan) {
  kv_.free(r.id);
  std::erase(running_, &r);
  requeue(r);
  plan.preempted.push_back(r.id);
}

step_plan scheduler::schedule() {
  step_plan plan;
  int32_t budget = cfg_.max_step_tokens;
  // With micro-batches, one plan takes its share of the requests, not all of them.
  const size_t share = cfg_.micro_batches > 1
                           ? std::max<size_t>(1, (running_.size() + waiting_.size() + cfg_.micro_batches - 1) /
                                                     static_cast<size_t>(cfg_.micro_batches))
                           : SIZE_MAX;
  auto add_chunk = [&](request& r, int32_t n) {
    scheduled_chunk c;
    c.id = r.id;
    c.first = r.num_computed_tokens;
    c.count = n;
    c.tokens = std::span<const int32_t>(r.tokens).subspan(c.first, n);
    c.block_table = kv_.block_table(r.id);
    c.sample = c.first + n == r.num_tokens();
    r.in_flight = true;
    plan.chunks.push_back(c);
    plan.num_tokens += n;
    budget -= n;
  };

  // Running requests first, in scheduling order.
  for (size_t i = 0; i < running_.size() && budget > 0 && plan.chunks.size() < share;) {
    request& r = *running_[i];
    if (r.in_flight) {
      ++i;
      continue;
    }
    const int32_t n = std::min(r.num_tokens() - r.num_computed_tokens, budget);
    bool preempted_self = false, blocked = false;
    while (!kv_.allocate(r.id, r.tokens, r.num_computed_tokens + n, {}, r.params.cache_namespace)) {
      // The lowest-priority request not in flight gives way.
      request* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it)
        if (!(*it)->in_flight) {
          victim = *it;
          break;
        }
      if (victim == nullptr) {
        blocked = true;  // only requests in flight hold blocks: wait for them
        break;
      }
      if (victim == &r) {
        if (running_.size() == 1) {
          // Alone and still out of blocks: the pool cannot hold this sequence.
          pending_.push_back(finish(r, finish_reason::length));
        } else {
          preempt(r, plan);
        }
        preempted_self = true;
        break;
      }
      preempt(*victim, plan);
    }
    if (preempted_self) continue;  // running_[i] is now the next request
    if (blocked) {
      ++i;
      continue;
    }
    add_chunk(r, n);
    ++i;
  }

  // Then waiting requests, unless memory ran short this step.
  while (plan.preempted.empty() && budget > 0 && !waiting_.empty() && plan.chunks.size() < share &&
         static_cast<int32_t>(running_.size()) < cfg_.max_running) {
    request& r = *waiting_.front();
    const auto hits = kv_.match_prefix(r.tokens, r.params.cache_namespace);
    const int32_t computed = static_cast<int32_t>(hits.size()) * cfg_.block_size;
    const int32_t n = std::min(r.num_tokens() - computed, budget);
    if (!kv_.allocate(r.id, r.tokens, computed + n, hits, r.params.cache_namespace)) {
      if (running_.empty() && plan.chunks.empty()) {
        // Nothing runs that could free blocks: it can never fit.
        pending_.push_back(finish(r, finish_reason::length));
        continue;
      }
      break;
    }
    waiting_.pop_front();
    r.num_computed_tokens = computed;
    if (r.num_preemptions == 0) r.num_cached_prompt_tokens = computed;
    r.state = request_state::running;
    running_.push_back(&r);
    add_chunk(r, n);
  }
  return plan;
}

std::vector<step_output> scheduler::update_from_output(const step_plan& plan, std::span<sample_result> samples) {
  std::vector<step_output> outs = std::move(pending_);
  pending_.clear();
  size_t k = 0;
  for (const scheduled_chunk& c : plan.chunks) {
    request* rp = find(c.id);
    sample_result* s = c.sample ? &samples[k++] : nullptr;
    if (rp) rp->in_flight = false;
    if (!rp || rp->state != request_state::running || rp->num_computed_tokens != c.first) continue;
    request& r = *rp;
    r.num_computed_tokens += c.count;
    if (!s) continue;
    const int32_t tok = s->token;
    const auto& p = r.params;
    step_output out;
    out.id = r.id;
    out.num_cached_prompt_tokens = r.num_cached_prompt_tokens;
    const bool stop_token = (!p.ignore_eos && (tok == tok_.eos_id() || tok == tok_.bos_id())) ||
                            std::find(p.stop_tokens.begin(), p.stop_tokens.end(), tok) != p.stop_tokens.end();
    finish_reason why = finish_reason::none;
    if (stop_token) {
      why = finish_reason::stop;
    } else {
      const int32_t prev = r.tokens.back();
      r.tokens.push_back(tok);
      out.new_tokens.push_back(tok);
      if (p.sampling.logprobs >= 0) out.logprobs.push_back(std::move(*s));
      out.text = r.stops.push(r.utf8.push(tok_.decode(prev, tok)));
      if (r.stops.stopped())
        why = finish_reason::stop;
      else if (r.num_output_tokens() >= p.max_tokens || r.num_tokens() >= cfg_.context)
        why = finish_reason::length;
    }
    out.num_prompt_tokens = r.num_prompt_tokens;
    out.num_output_tokens = r.num_output_tokens();
    if (why != finish_reason::none) {
      step_output fin = finish(r, why);
      out.text += fin.text;
      out.finished = true;
      out.reason = why;
    }
    outs.push_back(std::move(out));
  }
  return outs;
}

}  // namespace troupe

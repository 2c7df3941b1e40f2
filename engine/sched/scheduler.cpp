#include "engine/sched/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/forward/step_batch.hpp"

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
    : cfg_(cfg), tok_(tok) {
  TROUPE_ASSERT(cfg.max_step_tokens > 0 && cfg.max_running > 0 && cfg.context > 0 && cfg.vocab > 0,
                cfg.max_step_tokens, cfg.max_running, cfg.context, cfg.vocab);
  if (!cfg.remote_kv) kv_.emplace(cfg.kv.num_blocks, cfg.kv.block_size, cfg.kv.prefix_caching);
  remote_usage_.num_blocks = remote_usage_.free = cfg.kv.num_blocks;
}

bool scheduler::before(const queue_key& a, const queue_key& b) const {
  if (!cfg_.classes.empty()) {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.deadline_ms != b.deadline_ms) return a.deadline_ms < b.deadline_ms;
  } else if (cfg_.policy == schedule_policy::priority && a.priority != b.priority) {
    return a.priority < b.priority;
  }
  return a.arrival < b.arrival;
}

bool scheduler::past_context(const request_params& p) const {
  return std::any_of(parts_.begin(), parts_.end(), [&](const scheduler_part* part) { return part->past_context(p); });
}

std::optional<std::string> scheduler::slo_refusal(const request_params& p) const {
  // A request moved off a lost replica has streamed already: it is not turned away now.
  if (!cfg_.slo_admission || !p.delivered.empty()) return std::nullopt;
  auto k = classes_.class_of(p);
  if (!k || *k < 0) return std::nullopt;  // add() says what is wrong; no class, no targets
  const slo_class& c = cfg_.classes[*k];
  const queue_key probe{c.priority, c.ttft_ms > 0 ? p.arrival_ms + c.ttft_ms : std::numeric_limits<double>::infinity(),
                        next_arrival_};
  auto fmt = [](double ms) { return std::to_string(static_cast<int64_t>(std::lround(ms))) + " ms"; };
  if (c.ttft_ms > 0) {
    // The prompt tokens still to compute of every request that runs before it, and its own.
    int64_t ahead = static_cast<int64_t>(p.prompt.size() + p.delivered.size());
    auto count = [&](const request* q) {
      if (before(key_of(*q), probe)) {
        const int64_t known = q->num_prompt_tokens + static_cast<int64_t>(q->params.delivered.size());
        ahead += std::max<int64_t>(0, known - q->num_computed_tokens);
      }
    };
    for (const request* q : waiting_) count(q);
    for (const request* q : running_) count(q);
    int32_t decoding = 0;
    for (const request* q : running_) decoding += q->num_computed_tokens >= q->num_prompt_tokens;
    if (auto t = slo_.ttft_ms(ahead, cfg_.max_step_tokens, decoding); t && *t > c.ttft_ms)
      return "class '" + c.name + "': the first token would come in about " + fmt(*t) + " (" + std::to_string(ahead) +
             " prompt tokens to compute first), past its target of " + fmt(c.ttft_ms);
  }
  // A prefill-only request (kv_to) decodes on another replica: its tokens' pace is not
  // this replica's to judge.
  if (c.tpot_ms > 0 && p.kv_to.empty()) {
    const auto decoding = static_cast<int32_t>(std::min<size_t>(running_.size() + 1, cfg_.max_running));
    if (auto t = slo_.tpot_ms(decoding); t && *t > c.tpot_ms)
      return "class '" + c.name + "': with " + std::to_string(decoding) + " requests decoding, a token would take about " +
             fmt(*t) + ", past its target of " + fmt(c.tpot_ms);
  }
  return std::nullopt;
}

void scheduler::insert_waiting(request* r) {
  auto at = std::upper_bound(waiting_.begin(), waiting_.end(), r,
                             [this](const request* x, const request* y) { return before(*x, *y); });
  waiting_.insert(at, r);
}

status scheduler::add(request_id id, request_params p) {
  // Errors are for the request's client, in its words: its id is the runtime's own.
  if (requests_.count(id)) return error{"request " + std::to_string(id.value) + ": the id is already in use"};
  if (p.prompt.empty()) return error{"the prompt is empty"};
  if (static_cast<int64_t>(p.prompt.size()) >= cfg_.context)
    return error{"the prompt has " + std::to_string(p.prompt.size()) +
                 " tokens; the model's context is " + std::to_string(cfg_.context)};
  for (int32_t t : p.prompt)
    if (t < 0 || t >= cfg_.vocab)
      return error{"token id " + std::to_string(t) + " is outside the vocabulary (" +
                   std::to_string(cfg_.vocab) + ")"};
  for (int32_t t : p.stop_tokens)
    if (t < 0 || t >= cfg_.vocab) return error{"stop token " + std::to_string(t) + " is outside the vocabulary"};
  for (const auto& b : p.sampling.logit_bias)
    if (b.token >= cfg_.vocab)
      return error{"logit bias: token " + std::to_string(b.token) + " is outside the vocabulary"};
  if (p.max_tokens < 1) return error{"max_tokens must be at least 1"};
  if (auto e = validate(p.sampling)) return error{*e};
  for (const scheduler_part* part : parts_)
    if (auto st = part->check(p); !st) return st;
  // Its prompt and the next token, or the most its cache holds.
  int64_t slots = static_cast<int64_t>(p.prompt.size()) + 1;
  for (const scheduler_part* part : parts_)
    if (auto bound = part->cache_bound(p)) slots = std::min(slots, *bound);
  const int64_t blocks = (slots + cfg_.kv.block_size - 1) / cfg_.kv.block_size;
  if (blocks > cfg_.kv.num_blocks)
    return error{"the prompt needs " + std::to_string(blocks) + " KV blocks; the pool has " +
                 std::to_string(cfg_.kv.num_blocks)};
  // A resubmission whose earlier attempt delivered its whole output (its client saw the
  // last token but not the end) ends at once, with nothing new.
  const bool delivered_all =
      static_cast<int64_t>(p.delivered.size()) >= p.max_tokens ||
      (static_cast<int64_t>(p.prompt.size() + p.delivered.size()) >= cfg_.context && !past_context(p));
  if (static_cast<int64_t>(p.delivered.size()) > p.max_tokens)
    return error{"more tokens delivered (" + std::to_string(p.delivered.size()) + ") than max_tokens (" +
                 std::to_string(p.max_tokens) + ")"};
  for (int32_t t : p.delivered)
    if (t < 0 || t >= cfg_.vocab) return error{"delivered token id " + std::to_string(t) + " is outside the vocabulary"};
  auto r = std::make_unique<request>(id, std::move(p), next_arrival_++);
  // Replay what was delivered: the same sampler, detokenizer and stop-string state as the
  // attempt that streamed it, and no text from it again.
  for (int32_t t : r->params.delivered) {
    const int32_t prev = r->tokens.back();
    r->tokens.push_back(t);
    r->smp.replay(t);
    (void)r->stops.push(r->utf8.push(tok_.decode(prev, t)));
  }
  if (r->stops.stopped() || delivered_all) {
    // The chunk that carried the last token was the final one, and carried the text held
    // back then: the end says nothing more.
    const finish_reason why = r->stops.stopped() ? finish_reason::stop : finish_reason::length;
    request& done = *r;
    requests_.emplace(id, std::move(r));
    step_output out = finish(done, why);
    out.text.clear();
    pending_.push_back(std::move(out));
    return ok();
  }
  for (scheduler_part* part : parts_) part->added(*r);
  insert_waiting(r.get());
  requests_.emplace(id, std::move(r));
  return ok();
}

size_t scheduler::reset_kv() {
  const size_t n = running_.size();
  for (request* r : running_) {
    if (r->in_flight) ++r->lost_steps;
    requeue(*r);
  }
  running_.clear();
  const kv_usage before = kv_ ? kv_->usage() : remote_usage_;
  queried_before_reset_ += before.queried_tokens;
  hits_before_reset_ += before.hit_tokens;
  if (kv_) kv_.emplace(cfg_.kv.num_blocks, cfg_.kv.block_size, cfg_.kv.prefix_caching);
  releases_.clear();  // the remote block manager starts empty too
  remote_usage_ = kv_usage{};
  remote_usage_.num_blocks = remote_usage_.free = cfg_.kv.num_blocks;
  return n;
}

std::vector<request_id> scheduler::doomed() const {
  std::vector<request_id> ids;
  for (const request* r : waiting_)
    if (r->lost_steps >= max_lost_steps) ids.push_back(r->id);
  return ids;
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
  release(r);
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
  r.blocks.clear();
  r.state = request_state::waiting;
  r.in_flight = false;
  for (scheduler_part* part : parts_) part->requeued(r);
  ++r.num_preemptions;
  insert_waiting(&r);
}

void scheduler::release(request& r) {
  if (kv_)
    kv_->free(r.id);
  else
    releases_.push_back(r.id);
  r.blocks.clear();
}

void scheduler::preempt(step_draft& d, request& r) {
  for (scheduler_part* part : parts_) part->dropped(d, r);
  release(r);
  std::erase(running_, &r);
  requeue(r);
  d.plan.preempted.push_back(r.id);
}

step_plan scheduler::schedule() {
  TROUPE_ASSERT(kv_.has_value(), "schedule() needs the block manager here; remote_kv plans with next_claims");
  step_draft d = begin_step();
  while (auto claims = next_claims(d)) {
    auto grants = kv_->grant(*claims);
    TROUPE_ASSERT(grants.has_value(), grants ? "" : grants.err().message);
    apply(d, std::move(grants).value());
  }
  return end_step(d);
}

step_draft scheduler::begin_step() {
  step_draft d;
  d.budget = cfg_.max_step_tokens;
  // With micro-batches, one plan takes its share of the requests, not all of them.
  d.share = cfg_.micro_batches > 1
                ? std::max<size_t>(1, (running_.size() + waiting_.size() + cfg_.micro_batches - 1) /
                                          static_cast<size_t>(cfg_.micro_batches))
                : SIZE_MAX;
  for (scheduler_part* part : parts_) part->begin_step(d);
  return d;
}

// The positions r's next step must compute at once, if a part says (its claim is sent only
// where the step's budget has them).
int32_t scheduler::whole_chunk(const request& r, bool admit) const {
  int32_t n = 0;
  for (const scheduler_part* part : parts_) n = std::max(n, part->whole_chunk(r, admit));
  return n;
}

std::optional<kv_step_request> scheduler::next_claims(step_draft& d) {
  if (d.done || d.budget <= 0) {
    d.done = true;
    return std::nullopt;
  }
  kv_step_request q;
  q.budget = d.budget;
  d.sent.clear();
  // Claims stop where the budget would be spent if each got all it wants; prefix hits
  // may leave some over, claimed in another round.
  int64_t left = d.budget;
  size_t slots = d.share - std::min(d.share, d.plan.chunks.size());
  auto claim = [&](request& r, bool admit) {
    // A request given output before (handed over by a prefill replica, or moved off a
    // failed replica) computes what it has but its last token, then that token alone, a
    // decode step with its drafts, as where its output started: a seed spends its draws
    // the same way.
    std::span<const int32_t> tokens = r.tokens;
    if (!r.params.delivered.empty() && (admit ? 0 : r.num_computed_tokens) < r.num_tokens() - 1)
      tokens = tokens.first(tokens.size() - 1);
    kv_claim c{.id = r.id,
               .admit = admit,
               .computed = admit ? 0 : r.num_computed_tokens,
               .held = admit ? 0 : static_cast<int32_t>(r.blocks.size()),
               .ns = r.params.cache_namespace,
               .tokens = tokens};
    for (scheduler_part* part : parts_) part->claim(d, r, c);
    d.sent.emplace_back(r.id, admit);
    left -= r.num_tokens() + c.speculative - c.computed;
    --slots;
    q.claims.push_back(c);
  };
  // Running requests first, in scheduling order. A chunk a part wants whole is computed
  // whole or waits for a step with room for it.
  for (request* r : running_) {
    if (left <= 0 || slots == 0) break;
    if (!r->in_flight && !d.blocked.count(r->id) && whole_chunk(*r, false) <= left) claim(*r, false);
  }
  // Then waiting ones, unless memory ran short this step.
  if (d.admitting && d.plan.preempted.empty()) {
    size_t room = running_.size() < static_cast<size_t>(cfg_.max_running) ? cfg_.max_running - running_.size() : 0;
    for (request* r : waiting_) {
      if (left <= 0 || slots == 0 || room == 0 || whole_chunk(*r, true) > left) break;
      claim(*r, true);
      --room;
    }
  }
  if (q.claims.empty()) {
    d.done = true;
    return std::nullopt;
  }
  if (!kv_ && releases_.empty() && grant_here(d, q)) return next_claims(d);
  q.releases = std::exchange(releases_, {});
  return q;
}

// Claims of running requests that stay inside the last block they hold, without filling
// it, change nothing at the block manager (no block taken, none cached), which would grant
// them as asked: they are granted here and no message goes out. Most decode steps of a
// few sequences are such (15 of 16 with 16-token blocks).
bool scheduler::grant_here(step_draft& d, const kv_step_request& q) {
  const int32_t bs = cfg_.kv.block_size;
  for (const kv_claim& c : q.claims) {
    if (c.admit || c.kv_budget > 0 || c.loads_landed) return false;
    const request* r = find(c.id);
    const int32_t end = static_cast<int32_t>(c.tokens.size()) + c.speculative;
    const int32_t held = r ? static_cast<int32_t>(r->blocks.size()) : 0;
    // (Holding more blocks than the end needs: drafts' blocks go back, at the manager.)
    if (!r || end > held * bs || end / bs != c.computed / bs || (end + bs - 1) / bs < held) return false;
  }
  kv_step_grants g;
  int32_t budget = q.budget;
  for (const kv_claim& c : q.claims) {
    if (budget <= 0) break;
    const int32_t count = std::min(static_cast<int32_t>(c.tokens.size()) + c.speculative - c.computed, budget);
    g.grants.push_back(kv_grant{c.id, c.computed, count, {}});
    budget -= count;
  }
  apply(d, std::move(g));
  return true;
}

void scheduler::add_chunk(step_draft& d, request& r, int32_t first, int32_t count) {
  scheduled_chunk c;
  c.id = r.id;
  c.first = first;
  c.count = count;
  const int32_t known = std::min(count, r.num_tokens() - first);
  c.num_draft = count - known;
  c.tokens = std::span<const int32_t>(r.tokens).subspan(first, known);
  c.block_table = r.blocks;
  c.sample = first + known == r.num_tokens();
  r.in_flight = true;
  for (scheduler_part* part : parts_) part->planned(d, r, c, first + known);
  d.plan.chunks.push_back(c);
  d.plan.num_tokens += count;
  d.budget -= count;
}

step_plan scheduler::end_step(step_draft& d) {
  for (scheduler_part* part : parts_) part->end_step(d, waiting_);
  return std::move(d.plan);
}

void scheduler::apply(step_draft& d, kv_step_grants g) {
  TROUPE_ASSERT(g.grants.size() + g.short_of_blocks <= d.sent.size(), g.grants.size(), d.sent.size());
  for (size_t k = 0; k < g.grants.size(); ++k) {
    kv_grant& grant = g.grants[k];
    request* r = find(grant.id);
    // Gone since the claims went out (aborted): its release is already on its way.
    if (!r || grant.id != d.sent[k].first) continue;
    if (d.sent[k].second) {
      r->blocks = std::move(grant.added);
      std::erase(waiting_, r);
      r->num_computed_tokens = grant.first;
      if (r->num_preemptions == 0) r->num_cached_prompt_tokens = grant.first;
      r->state = request_state::running;
      running_.push_back(r);
    } else {
      TROUPE_ASSERT(grant.dropped <= static_cast<int32_t>(r->blocks.size()), grant.dropped, r->blocks.size());
      r->blocks.resize(r->blocks.size() - grant.dropped);
      r->blocks.insert(r->blocks.end(), grant.added.begin(), grant.added.end());
    }
    for (scheduler_part* part : parts_) part->granted(d, *r, grant, d.sent[k].second);
    add_chunk(d, *r, grant.first, grant.count);
  }
  if (!g.short_of_blocks) {
    // Every claim granted: more may fit if prefix hits left budget over. Otherwise the
    // budget is spent.
    if (g.grants.size() < d.sent.size()) d.done = true;
    return;
  }
  const auto [id, admit] = d.sent[g.grants.size()];
  request* r = find(id);
  if (!r) return;
  if (!admit) return out_of_blocks(d, *r);
  if (running_.empty() && d.plan.chunks.empty()) {
    // Nothing runs that could free blocks: it can never fit.
    for (scheduler_part* part : parts_) part->dropped(d, *r);
    pending_.push_back(finish(*r, finish_reason::length));
  } else {
    d.admitting = false;
  }
}

// Running request r did not fit: a part may ask for less (its drafts go first: they are
// optional, and it claims again without them); then the lowest-priority request not in
// flight gives way.
void scheduler::out_of_blocks(step_draft& d, request& r) {
  for (scheduler_part* part : parts_)
    if (part->shrink(r)) return;
  request* victim = nullptr;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (!(*it)->in_flight) {
      victim = *it;
      break;
    }
  if (victim == nullptr) {
    d.blocked.insert(r.id);  // only requests in flight hold blocks: wait for them
  } else if (victim != &r) {
    preempt(d, *victim);  // then r claims again
  } else if (running_.size() == 1) {
    // Alone and still out of blocks: the pool cannot hold this sequence.
    for (scheduler_part* part : parts_) part->dropped(d, r);
    pending_.push_back(finish(r, finish_reason::length));
  } else {
    preempt(d, r);
  }
}

std::vector<step_output> scheduler::update_from_output(const step_plan& plan, std::span<sample_result> samples,
                                                      std::span<const int32_t> emitted) {
  std::vector<step_output> outs = std::move(pending_);
  pending_.clear();
  size_t k = 0, row = 0;
  for (const scheduled_chunk& c : plan.chunks) {
    request* rp = find(c.id);
    std::span<sample_result> got;
    if (c.sample) {
      const size_t n = emitted.empty() ? 1 : static_cast<size_t>(emitted[row]);
      TROUPE_ASSERT(n >= 1 && n <= static_cast<size_t>(c.num_draft) + 1 && k + n <= samples.size(), n, c.num_draft);
      got = samples.subspan(k, n);
      k += n;
      ++row;
    }
    if (rp) {
      rp->in_flight = false;
      rp->lost_steps = 0;  // a step of it came back
    }
    if (!rp || rp->state != request_state::running || rp->num_computed_tokens != c.first) continue;
    request& r = *rp;
    // The known tokens' KV, and the accepted drafts' (every emitted token but the last).
    r.num_computed_tokens += c.count - c.num_draft + (got.empty() ? 0 : static_cast<int32_t>(got.size()) - 1);
    for (scheduler_part* part : parts_) part->applied(r);
    if (got.empty()) continue;
    const auto& p = r.params;
    step_output out;
    out.id = r.id;
    out.num_cached_prompt_tokens = r.num_cached_prompt_tokens;
    finish_reason why = finish_reason::none;
    for (sample_result& s : got) {
      const int32_t tok = s.token;
      const bool stop_token = (!p.ignore_eos && (tok == tok_.eos_id() || tok == tok_.bos_id())) ||
                              std::find(p.stop_tokens.begin(), p.stop_tokens.end(), tok) != p.stop_tokens.end();
      if (stop_token) {
        why = finish_reason::stop;
        break;
      }
      const int32_t prev = r.tokens.back();
      r.tokens.push_back(tok);
      out.new_tokens.push_back(tok);
      if (p.sampling.logprobs >= 0) out.logprobs.push_back(std::move(s));
      out.text += r.stops.push(r.utf8.push(tok_.decode(prev, tok)));
      if (r.stops.stopped())
        why = finish_reason::stop;
      else if (r.num_output_tokens() >= p.max_tokens || (r.num_tokens() >= cfg_.context && !past_context(p)))
        why = finish_reason::length;
      for (scheduler_part* part : parts_)
        if (why == finish_reason::none) why = part->ends_after(r, out);
      if (why != finish_reason::none) break;  // later tokens of an accepted run are dropped
    }
    out.num_prompt_tokens = r.num_prompt_tokens;
    out.num_output_tokens = r.num_output_tokens();
    if (why != finish_reason::none) {
      step_output fin = finish(r, why);
      // Text held back (half a character, a possible stop string) stays unsaid: the decode
      // replica replays the tokens and says it once it is final.
      if (!out.handed_off) out.text += fin.text;
      out.finished = true;
      out.reason = why;
    }
    outs.push_back(std::move(out));
  }
  return outs;
}

void scheduler::settle_tier_loads(const step_plan& plan, std::span<const request_id> failed) {
  for (request* r : tiers_.settle(plan, failed, [this](request_id id) { return find(id); })) {
    release(*r);
    std::erase(running_, r);
    requeue(*r);
    --r->num_preemptions;  // (not a preemption)
  }
}

void scheduler::observe_attention(const step_plan& plan, std::span<const float> sums, int32_t heads) {
  TROUPE_ASSERT(static_cast<int64_t>(sums.size()) == plan.attention_sums(), sums.size(), plan.attention_sums());
  eviction_.observe(plan, sums, heads, [this](request_id id) { return find(id); });
}

}  // namespace troupe

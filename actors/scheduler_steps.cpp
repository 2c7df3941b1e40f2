// The step path of the scheduler actor: claims to the kv manager, plans through the
// stages, samples back (scheduler_state.hpp).
#include <cmath>

#include "actors/caf/errors.hpp"
#include "actors/scheduler_state.hpp"
#include "actors/wire/activations_codec.hpp"
#include "engine/serve/step_choices.hpp"

namespace troupe::scheduler_actor_impl {

// Runs `plan` through stages i.. and calls `done` with the last stage's output: over the
// stage's step link when it has one, else as an actor request.
void run_from(self_ptr self, uint64_t epoch, size_t i, wire_message plan, wire_message act,
              std::function<void(const wire_message&)> done) {
  auto& st = self->state;
  if (epoch != st.epoch()) return;
  if (!st.stages[i]) return lose(self, i, "stage " + std::to_string(i) + " is gone");
  auto next = [self, epoch, i, plan, done](const wire_message& out) {
    auto& st = self->state;
    if (epoch != st.epoch()) return;
    if (i + 1 < st.stages.size()) return run_from(self, epoch, i + 1, plan, out, done);
    done(out);
  };
  if (stage_link& l = st.links[i]; l.client) {
    if (auto sent = l.client->send(plan, act); !sent)
      return lose(self, i, "stage " + std::to_string(i) + ": " + sent.err().message);
    l.pending.push_back(link_step{self->clock().now(), std::move(next)});
    return;
  }
  self->request(st.stages[i], st.setup.step_timeout, step_atom_v, plan, act)
      .then(std::move(next), [self, epoch, i](caf::error& e) {
        if (epoch != self->state.epoch()) return;
        lose(self, i, "stage " + std::to_string(i) + ": " + reason_of(e));
      });
}

namespace {

stage_link* find_link(scheduler_state& st, uint64_t id, size_t& stage) {
  for (size_t i = 0; i < st.links.size(); ++i)
    if (st.links[i].client && st.links[i].id == id) {
      stage = i;
      return &st.links[i];
    }
  return nullptr;
}

}  // namespace

void link_answer(self_ptr self, uint64_t link, const wire_message& out) {
  size_t i = 0;
  stage_link* l = find_link(self->state, link, i);
  if (!l) return;  // closed since
  if (l->pending.empty()) return lose(self, i, "stage " + std::to_string(i) + ": an answer to no step");
  auto then = std::move(l->pending.front().then);
  l->pending.pop_front();
  then(out);
}

void link_failed(self_ptr self, uint64_t link, const std::string& why) {
  size_t i = 0;
  if (find_link(self->state, link, i)) lose(self, i, "stage " + std::to_string(i) + ": " + why);
}

// Sends `q` to the kv manager; `then` gets its grants. Exchanges are answered in the
// order they were sent, and each is checked against the latest claims sent (a release
// alone has no grants to check).
void claim(self_ptr self, const kv_step_request& q, std::function<void(kv_step_grants)> then) {
  auto& st = self->state;
  if (!st.kv) return lose_kv(self, "the kv manager is gone");
  const uint64_t epoch = st.epoch();
  const wire_message msg(wire_kind::kv_step, st.kv_sender->encode(q));
  self->request(st.kv, st.setup.step_timeout, claim_atom_v, msg)
      .then(
          [self, epoch, then](const wire_message& reply) {
            auto& st = self->state;
            if (epoch != st.epoch()) return;
            auto g = reply.bytes ? st.kv_sender->decode(*reply.bytes) : expected<kv_step_grants>(error{"an empty answer"});
            if (!g) return lose_kv(self, g.err().message);
            st.sched->set_kv_usage(g->usage);
            then(std::move(g).value());
          },
          [self, epoch](caf::error& e) {
            if (epoch == self->state.epoch()) lose_kv(self, "kv manager: " + reason_of(e));
          });
}

namespace {

// Blocks released while no step follows go back at once, so the kv manager's figures are
// current.
void hand_back(self_ptr self) {
  auto& st = self->state;
  if (!remote_kv(st) || st.planning || !st.ready() || !st.kv) return;
  kv_step_request q;
  q.releases = st.sched->take_releases();
  if (!q.releases.empty()) claim(self, q, [](kv_step_grants) {});
}

// The feature values a step returns: the rows each chunk asked for, a model's width each.
int64_t feature_values(const scheduler_state& st, std::span<const int32_t> wanted) {
  int64_t rows = 0;
  for (int32_t n : wanted) rows += n;
  return rows * st.setup.m->config.dim;
}

// A step's tokens are in: the step path records them (trees, features, figures, the
// scheduler, eviction), and each request's news goes to its client.
void finish_step(self_ptr self, const step_plan& plan, step_tokens& got, std::span<const float> attention,
                 std::span<const int32_t> wanted, std::span<const float> features) {
  auto& st = self->state;
  dispatch(self, st.steps->finish(plan, got, attention, st.steps->spread_features(plan, wanted, features)));
  maybe_step(self);
}

// The tokens the last stage chose for every logit row of `plan` (a sampled chunk's, and
// one per draft): each request records its tokens as its sampler would have drawn them.
void take_tokens(self_ptr self, const step_plan& plan, const wire_message& out, std::span<const int32_t> wanted) {
  auto& st = self->state;
  const int32_t vocab = st.setup.m->config.vocab_size;
  auto res = out.bytes ? wire::decode_step_result(*out.bytes, vocab, st.setup.config.max_step_tokens, plan.attention_sums(),
                                                  feature_values(st, wanted))
                       : expected<wire::step_result>(error{"no tokens"});
  if (!res || static_cast<int32_t>(res->tokens.size()) != plan.num_logit_rows())
    return lose(self, st.stages.size() - 1, res ? "chosen tokens do not match the step" : res.err().message);
  st.steps->settle_loads(plan, res->failed_loads);
  const auto& toks = res->tokens;
  std::vector<int32_t> chosen;
  size_t k = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    for (int32_t j = 0; j <= c.num_draft; ++j) {
      const wire::chosen_token& t = toks[k++];
      if (t.id != c.id) return lose(self, st.stages.size() - 1, "chosen tokens are not in the step's order");
      chosen.push_back(t.token);
    }
  }
  step_tokens got = st.steps->tokens_chosen(plan, chosen);
  finish_step(self, plan, got, res->attention, wanted, res->features);
}

// Sends `plan` (its drafts filled in) through the pipeline; an empty plan (requests in
// flight, or ended for lack of memory) only delivers.
void send_plan(self_ptr self, const std::shared_ptr<step_plan>& plan) {
  auto& st = self->state;
  if (plan->chunks.empty()) {
    step_tokens none;
    dispatch(self, st.steps->finish(*plan, none, {}, {}));
    return;
  }
  // Who chooses the tokens (engine/serve/step_choices.hpp): the last stage, where the
  // logits are, when every row allows it; else the samplers here, from the logits.
  const auto choices = shard_choices_by_chunk(*plan, *st.sched);
  std::vector<int32_t> wanted = st.steps->ready(*plan);
  const wire_message msg(wire_kind::step_plan, st.encoder.encode(*plan, st.released, choices, wanted));
  st.released.clear();
  ++st.in_flight;
  const auto sent = self->clock().now();
  run_from(self, st.epoch(), 0, msg, wire_message{}, [self, plan, sent, wanted = std::move(wanted)](const wire_message& out) {
    auto& st = self->state;
    --st.in_flight;
    // The time this step held the pipeline's end: from when it went out, or from the step
    // before it came back (several in flight), for SLO admission's estimates.
    const auto now = self->clock().now();
    st.sched->observe_step(plan->num_tokens,
                           std::chrono::duration<double, std::milli>(now - std::max(sent, st.last_step_done)).count());
    st.last_step_done = now;
    const int32_t vocab = st.setup.m->config.vocab_size;
    if (out.kind == wire_kind::step_result) return take_tokens(self, *plan, out, wanted);
    auto lg = out.bytes ? wire::decode_activations(*out.bytes, vocab, st.setup.config.max_step_tokens, plan->attention_sums(),
                                                   feature_values(st, wanted))
                        : expected<wire::decoded_activations>(error{"no logits"});
    if (!lg || lg->num_tokens != plan->num_logit_rows())
      return lose(self, st.stages.size() - 1, lg ? "logits do not match the step" : lg.err().message);
    st.steps->settle_loads(*plan, lg->failed_loads);
    step_tokens got = st.steps->tokens_from_logits(*plan, lg->data.data(), vocab);
    finish_step(self, *plan, got, lg->attention, wanted, lg->features);
  });
}

// Fills the plan's draft slots, then sends it; while this one runs, the next is planned
// (when it went out).
void run_plan(self_ptr self, step_plan p) {
  with_drafts(self, std::move(p), [self](std::shared_ptr<step_plan> plan) {
    auto& st = self->state;
    const int32_t before = st.in_flight;
    send_plan(self, plan);
    end_deferred(self);  // (the plan is out: its requests' blocks are computed whatever happens to them)
    if (st.ready() && st.in_flight > before)
      maybe_step(self);
    else
      hand_back(self);
  });
}

// One round of a step's claims; the last round sends the plan.
void claim_round(self_ptr self, std::shared_ptr<step_draft> d) {
  auto& st = self->state;
  if (auto q = st.sched->next_claims(*d))
    return claim(self, *q, [self, d](kv_step_grants g) {
      self->state.sched->apply(*d, std::move(g));
      claim_round(self, d);
    });
  st.planning = false;
  run_plan(self, st.sched->end_step(*d));
}

}  // namespace

void maybe_step(self_ptr self) {
  auto& st = self->state;
  if (!st.ready()) return;
  while (!st.planning && st.in_flight < std::max(1, st.setup.max_in_flight) && st.sched->has_unfinished()) {
    // Draft slots for the requests that decode next, claimed with the step's blocks.
    st.steps->plan_drafts(can_draft(st));
    if (remote_kv(st)) {
      st.planning = true;
      return claim_round(self, std::make_shared<step_draft>(st.sched->begin_step()));
    }
    return run_plan(self, st.sched->schedule());
  }
  hand_back(self);
}

}  // namespace troupe::scheduler_actor_impl

// The scheduler actor's drafts: n-gram and trained heads' made here, or a draft model's
// and early exit's from the replica's draft actor, one exchange per step
// (scheduler_state.hpp, engine/speculative/draft_exchange.hpp); token trees' accepted paths, and
// the features heads draft from.
#include <cstdio>

#include "actors/agent_link.hpp"
#include "actors/caf/errors.hpp"
#include "actors/scheduler_state.hpp"

namespace troupe::scheduler_actor_impl {

void forget_drafts(scheduler_state& st, request_id id) {
  st.tree_moves.erase(id);  // (its KV is gone)
  if (st.drafts) st.drafts->forget(id);
  if (remote_drafts(st)) st.orders.forget(id);
}

void restart_drafts(scheduler_state& st) {
  if (st.drafts) st.drafts->forget_all();
  // Sessions are the scheduler's own: its random base, then a count.
  if (remote_drafts(st)) st.orders.restart(st.session_base + (uint64_t{1} << 31) + ++st.draft_sessions);
}

bool can_draft(const scheduler_state& st) { return st.drafts || (remote_drafts(st) && st.draft); }

namespace {

// Steps go without drafts until the draft actor is found again, and it starts afresh.
void lose_draft(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.draft) {
    self->demonitor(st.draft);
    st.draft = caf::actor{};
    std::fprintf(stderr, "troupe: replica %s: no drafts from its draft actor (%s); decoding without them until it is back\n",
                 st.setup.replica.c_str(), why.c_str());
  }
  restart_drafts(st);
}

// A plan that owns its chunks' tokens and block tables while it waits for its drafts: a
// request may end meanwhile.
struct held_plan {
  step_plan plan;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<block_id>> tables;

  explicit held_plan(step_plan p) : plan(std::move(p)) {
    tokens.reserve(plan.chunks.size());
    tables.reserve(plan.chunks.size());
    for (auto& c : plan.chunks) {
      c.tokens = tokens.emplace_back(c.tokens.begin(), c.tokens.end());
      c.block_table = tables.emplace_back(c.block_table.begin(), c.block_table.end());
    }
  }
};

// Chunks of requests that ended while the plan waited are not sent.
void drop_ended(step_plan& plan, scheduler& sched) {
  std::erase_if(plan.chunks, [&](const scheduled_chunk& c) {
    if (sched.find(c.id)) return false;
    plan.num_tokens -= c.count;
    return true;
  });
}

}  // namespace

void find_draft(self_ptr self) {
  auto& st = self->state;
  if (!remote_drafts(st) || st.draft || st.finding_draft) return;
  st.finding_draft = true;
  const stage_address& a = st.setup.draft;
  const std::string key = a.host + ":" + std::to_string(a.port);
  const auto known = st.peers.find(key);
  auto done = [self] { self->state.finding_draft = false; };
  with_agent(
      self, st.setup.agent, known == st.peers.end() ? caf::actor{} : known->second, a.host, a.port,
      [self, done, key, remote = a.port != 0, name = a.name](caf::actor agent, bool fresh) {
        if (fresh) {
          self->state.peers[key] = agent;
          self->monitor(agent);
        }
        self->request(agent, std::chrono::seconds(2), lookup_atom_v, name)
            .then(
                [self, done](const caf::actor& draft) {
                  auto& st = self->state;
                  done();
                  if (!draft || st.draft) return;
                  st.draft = draft;
                  self->monitor(draft);
                  restart_drafts(st);  // a new one knows no request
                },
                [self, done, key, remote](caf::error&) {
                  if (remote) self->state.peers.erase(key);
                  done();
                });
      },
      [done](caf::error&) { done(); });
}

void with_drafts(self_ptr self, step_plan p, std::function<void(std::shared_ptr<step_plan>)> then) {
  auto& st = self->state;
  for (request_id id : p.preempted) forget_drafts(st, id);
  const std::span<const int32_t> tree = st.trees ? std::span<const int32_t>(st.trees->live().tree) : std::span<const int32_t>{};
  if (st.drafts) fill_drafts(p, *st.sched, *st.drafts, st.slots, tree);
  std::optional<draft_order> order;
  if (remote_drafts(st)) {
    if (st.draft) order = st.orders.make(p, *st.sched, tree);
    if (!order) draft_orders::give_up(p);
  }
  if (!order) return then(std::make_shared<step_plan>(std::move(p)));
  const auto held = std::make_shared<held_plan>(std::move(p));
  const uint64_t epoch = st.epoch();
  st.planning = true;
  auto go = [self, held, then](const std::string& failed) {
    auto& st = self->state;
    st.planning = false;
    if (!failed.empty()) {
      draft_orders::give_up(held->plan);
      lose_draft(self, failed);
    }
    drop_ended(held->plan, *st.sched);
    then(std::shared_ptr<step_plan>(held, &held->plan));
  };
  const wire_message msg(wire_kind::draft_order, wire::encode_draft_order(*order));
  self->request(st.draft, st.setup.step_timeout, draft_atom_v, msg)
      .then(
          [self, epoch, held, go](const wire_message& reply) {
            auto& st = self->state;
            if (epoch != st.epoch()) return;  // a loss dropped the plan
            auto a = reply.bytes ? wire::decode_drafts(*reply.bytes, *st.draft_limits)
                                 : expected<draft_answer>(error{"an empty answer"});
            if (!a) return go(a.err().message);
            if (auto taken = st.orders.take(held->plan, *st.sched, std::move(a).value(), st.setup.m->config.vocab_size); !taken)
              return go(taken.err().message);
            go("");
          },
          [self, epoch, go](caf::error& e) {
            if (epoch == self->state.epoch()) go(reason_of(e));
          });
}

std::vector<int32_t> ready_plan(scheduler_state& st, step_plan& plan) {
  std::vector<int32_t> wanted;
  if (!st.tree_moves.empty())
    for (const auto& c : plan.chunks)
      if (auto it = st.tree_moves.find(c.id); it != st.tree_moves.end()) {
        plan.compactions.push_back(std::move(it->second));
        st.tree_moves.erase(it);
      }
  if (!st.drafts || !st.drafts->wants_features()) return wanted;
  for (const auto& c : plan.chunks) wanted.push_back(feature_rows(c, *st.drafts));
  return wanted;
}

void after_tokens(scheduler_state& st, const step_plan& plan, const step_tokens& got, std::span<const int32_t> wanted,
                  std::span<const float> features) {
  if (st.trees)
    st.trees->keep(plan, *st.sched, got.paths, [&st](const scheduled_chunk& c, std::span<const int32_t> kept) {
      planned_compaction& m = st.tree_moves[c.id];
      m.id = c.id;
      m.block_table.assign(c.block_table.begin(), c.block_table.end());
      m.kept.assign(kept.begin(), kept.end());
    });
  if (wanted.empty()) return;
  // The rows the last stage returned, in their places in the step's batch.
  const auto dim = static_cast<size_t>(st.setup.m->config.dim);
  st.features.resize(static_cast<size_t>(plan.num_tokens) * dim);
  size_t row = 0, from = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const auto count = static_cast<size_t>(plan.chunks[i].count), n = static_cast<size_t>(wanted[i]);
    std::copy_n(features.begin() + static_cast<ptrdiff_t>(from * dim), n * dim,
                st.features.begin() + static_cast<ptrdiff_t>((row + count - n) * dim));
    from += n;
    row += count;
  }
  observe_features(plan, *st.sched, got.emitted, got.paths, st.features.data(), st.setup.m->config.dim, *st.drafts);
}

}  // namespace troupe::scheduler_actor_impl

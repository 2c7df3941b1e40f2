// The scheduler actor's drafts from the replica's draft actor (a draft model's, early
// exit's): one exchange per step, the order and its answer step_path's
// (engine/serve/step_path.hpp, engine/speculative/draft_exchange.hpp); finding the
// draft actor again after a loss.
#include <cstdio>

#include "actors/agent_link.hpp"
#include "actors/caf/errors.hpp"
#include "actors/scheduler_state.hpp"

namespace troupe::scheduler_actor_impl {

namespace {

uint64_t next_session(scheduler_state& st) {
  // Sessions are the scheduler's own: its random base, then a count.
  return st.session_base + (uint64_t{1} << 31) + ++st.draft_sessions;
}

// `plan` goes without drafts, and steps after it until the draft actor is found again,
// which starts afresh.
void lose_draft(self_ptr self, step_plan& plan, const std::string& why) {
  auto& st = self->state;
  if (st.draft) {
    self->demonitor(st.draft);
    st.draft = caf::actor{};
    std::fprintf(stderr, "troupe: replica %s: no drafts from its draft actor (%s); decoding without them until it is back\n",
                 st.setup.replica.c_str(), why.c_str());
  }
  st.steps->give_up(plan, next_session(st));
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

void restart_drafts(scheduler_state& st) { st.steps->restart_drafts(next_session(st)); }

void reset_drafts(scheduler_state& st) { st.steps->reset(next_session(st)); }

bool can_draft(const scheduler_state& st) { return !remote_drafts(st) || st.draft; }

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
  std::optional<draft_order> order = st.steps->draft(p, static_cast<bool>(st.draft));
  if (!order) return then(std::make_shared<step_plan>(std::move(p)));
  const auto held = std::make_shared<held_plan>(std::move(p));
  const uint64_t epoch = st.epoch();
  st.planning = true;
  auto go = [self, held, then](const std::string& failed) {
    auto& st = self->state;
    st.planning = false;
    if (!failed.empty()) lose_draft(self, held->plan, failed);
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
            if (auto taken = st.steps->take_drafts(held->plan, std::move(a).value()); !taken) return go(taken.err().message);
            go("");
          },
          [self, epoch, go](caf::error& e) {
            if (epoch == self->state.epoch()) go(reason_of(e));
          });
}

}  // namespace troupe::scheduler_actor_impl

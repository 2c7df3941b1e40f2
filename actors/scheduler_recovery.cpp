// Losses and recovery of the scheduler actor: what replica_recovery asks for, done with
// actors (stages and the kv manager looked up, links made, the kv manager reset, the
// canary step), and each outcome told back to it (scheduler_state.hpp).
#include <cmath>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "actors/agent_link.hpp"
#include "actors/caf/errors.hpp"
#include "actors/scheduler_state.hpp"
#include "actors/wire/activations_codec.hpp"

namespace troupe::scheduler_actor_impl {

namespace {

// The kv manager starts a new session empty (a scheduler that keeps its blocks itself has
// nothing to reset).
void reset_kv_manager(self_ptr self) {
  auto& st = self->state;
  const uint64_t epoch = st.epoch();
  if (!remote_kv(st)) return follow(self, st.recovery->kv_reset(epoch));
  st.kv_sender->restart(st.session_base + epoch);
  claim(self, kv_step_request{}, [self, epoch](kv_step_grants) { follow(self, self->state.recovery->kv_reset(epoch)); });
}

// One token through every stage, into block 0 (free: nothing runs while not ready, and
// the kv manager was just reset).
void canary(self_ptr self) {
  auto& st = self->state;
  st.encoder.restart(st.session_base + st.epoch());
  st.released.clear();
  step_plan plan;
  const std::vector<int32_t> token{st.setup.tok->bos_id() >= 0 ? st.setup.tok->bos_id() : 0};
  static const std::vector<block_id> table{block_id{0}};
  scheduled_chunk c;
  c.id = request_id{canary_id};
  c.first = 0;
  c.count = 1;
  c.tokens = token;
  c.block_table = table;
  c.sample = true;
  plan.chunks.push_back(c);
  plan.num_tokens = 1;
  const wire_message msg(wire_kind::step_plan, st.encoder.encode(plan, {}));
  st.released.push_back(request_id{canary_id});
  const uint64_t epoch = st.epoch();
  run_from(self, epoch, 0, msg, wire_message{}, [self, epoch](const wire_message& logits) {
    auto& st = self->state;
    const int32_t vocab = st.setup.m->config.vocab_size;
    auto lg = logits.bytes ? wire::decode_activations(*logits.bytes, vocab, 1) : expected<wire::decoded_activations>(error{"no logits"});
    bool finite = lg && lg->num_tokens == 1;
    if (finite)
      for (float x : lg->data) finite = finite && std::isfinite(x);
    if (!finite) return lose(self, st.stages.size() - 1, "the canary step gave no usable logits");
    follow(self, st.recovery->canary_passed(epoch, self->clock().now()));
  });
}

// One dial, on a helper actor's own thread: stage i's step link at host:port, connected
// (over a secured link, its handshake done) or not, left in `dials`; then the scheduler is
// told (link_atom, id). The link's thread hands answers to the scheduler as
// (link_atom, id, answer) and failures as (link_atom, id, why).
struct dial_order {
  caf::actor_addr scheduler;
  uint64_t id = 0;
  std::string host;
  uint16_t port = 0;
  std::shared_ptr<link_dials> dials;
};

void dial(caf::event_based_actor*, const dial_order& o) {
  const caf::actor_addr me = o.scheduler;
  const uint64_t id = o.id;
  auto tell = [me, id](auto&& what) {
    if (auto h = caf::actor_cast<caf::actor>(me)) caf::anon_send(h, link_atom_v, id, std::forward<decltype(what)>(what));
  };
  auto client = step_link_client::connect(
      o.host, o.port,
      [tell](expected<wire_message> answer) {
        if (answer)
          tell(std::move(answer).value());
        else
          tell(answer.err().message);
      },
      [tell](const std::string& why) { tell(why); });
  {
    std::lock_guard<std::mutex> lock(o.dials->mutex);
    o.dials->made.emplace(id, std::move(client));
  }
  if (auto h = caf::actor_cast<caf::actor>(me)) caf::anon_send(h, link_atom_v, id);
}

// Dials stage i's step link, listening at `port` on the stage's host; `done` once the
// dial is over, whatever became of it (the link is the stage's from then on, if made
// within the same session). The scheduler goes on meanwhile: a stage host that hangs
// while a link is dialled is noticed as any other.
void connect_link(self_ptr self, size_t i, uint16_t port, std::function<void()> done) {
  auto& st = self->state;
  const std::string& host = st.setup.stages[i].host;
  if (host.empty()) return done();
  const uint64_t id = st.next_link_id++;
  st.dialing[id] = link_dial{st.epoch(), i, std::move(done)};
  self->spawn<caf::detached>(dial, dial_order{self->address(), id, host, port, st.dials});
}

// Setting up the device link from stage i to stage i + 1 (GPU stages of one node: the
// hidden states go over NCCL): stage i + 1 draws it, stage i joins as its sender, then
// stage i + 1's shards join as receivers; each side's shards connect on their own threads
// (and say so if they cannot). Where a stage refuses (a CPU stage or another node,
// quietly, as ordinary; NCCL missing or failing, with the reason) the activations keep to
// the host. `done` is called either way.
struct device_link_setup {
  uint64_t epoch = 0;
  size_t i = 0;
  caf::actor from, to;
  std::function<void()> done;
};
using link_setup_ptr = std::shared_ptr<const device_link_setup>;

constexpr auto link_setup_timeout = std::chrono::seconds(10);

// (A set-up overtaken by a loss ends here too, without a word: the loss ended every link,
// and an unlink now could end the next set-up's.)
void link_refused(self_ptr self, const link_setup_ptr& a, const caf::error& e) {
  if (a->epoch == self->state.epoch()) {
    if (code_of(e) != error_code::disabled)
      std::fprintf(stderr, "troupe: replica %s, stages %zu and %zu: no device link (%s); activations go through the host\n",
                   self->state.setup.replica.c_str(), a->i, a->i + 1, reason_of(e).c_str());
    self->send(a->from, unlink_atom_v);
    self->send(a->to, unlink_atom_v);
  }
  a->done();
}

void link_receivers(self_ptr self, const link_setup_ptr& a, const wire_message& invite) {
  if (a->epoch != self->state.epoch()) return a->done();
  self->request(a->to, link_setup_timeout, link_in_atom_v, invite)
      .then(
          [self, a] {
            if (a->epoch == self->state.epoch())
              std::fprintf(stderr, "troupe: replica %s: stages %zu and %zu joined by a device link (NCCL)\n",
                           self->state.setup.replica.c_str(), a->i, a->i + 1);
            a->done();
          },
          [self, a](caf::error& e) { link_refused(self, a, e); });
}

void link_sender(self_ptr self, const link_setup_ptr& a, const wire_message& invite) {
  if (a->epoch != self->state.epoch()) return a->done();
  self->request(a->from, link_setup_timeout, link_out_atom_v, invite)
      .then([self, a, invite] { link_receivers(self, a, invite); }, [self, a](caf::error& e) { link_refused(self, a, e); });
}

void open_device_link(self_ptr self, uint64_t epoch, size_t i, std::function<void()> done) {
  auto& st = self->state;
  auto a = std::make_shared<const device_link_setup>(device_link_setup{epoch, i, st.stages[i], st.stages[i + 1], std::move(done)});
  self->request(a->to, link_setup_timeout, link_in_atom_v)
      .then([self, a](const wire_message& invite) { link_sender(self, a, invite); },
            [self, a](caf::error& e) { link_refused(self, a, e); });
}

// Stages in other processes are asked for their step links; a stage without one, or one
// that cannot be reached, takes its steps as actor messages. Neighbouring GPU stages are
// joined by device links. Then the kv manager's reset and the canary, which is the first
// step over the links.
void open_links(self_ptr self, uint64_t epoch) {
  auto& st = self->state;
  auto pending = std::make_shared<size_t>(1);
  auto finish_one = [self, epoch, pending] {
    if (--*pending == 0) follow(self, self->state.recovery->links_made(epoch));
  };
  for (size_t i = 0; i + 1 < st.stages.size(); ++i) {
    ++*pending;
    open_device_link(self, epoch, i, finish_one);
  }
  for (size_t i = 0; i < st.stages.size(); ++i) {
    if (st.links[i].client || st.stages[i].node() == self->node()) continue;
    ++*pending;
    self->request(st.stages[i], std::chrono::seconds(2), link_atom_v)
        .then(
            [self, epoch, i, finish_one](uint16_t port) {
              if (epoch != self->state.epoch()) return finish_one();
              connect_link(self, i, port, finish_one);
            },
            [finish_one](caf::error&) { finish_one(); });
  }
  finish_one();
}

// Plans in flight are dropped and the KV is forgotten: running requests recompute.
void drop_in_flight(self_ptr self, bool was_ready) {
  auto& st = self->state;
  for (auto& l : st.links) {  // their steps are dropped with the others; found again
    l.client.reset();
    l.pending.clear();
  }
  // Device links too: a step in flight on one is lost, and the links are drawn anew.
  for (const auto& s : st.stages)
    if (s) self->send(s, unlink_atom_v);
  st.in_flight = 0;
  st.planning = false;
  st.released.clear();
  const size_t requeued = st.sched->reset_kv();
  reset_drafts(st);  // the drafts' caches are in block ids given out anew, the stages' start anew
  // A request lost with every step of it lately would take the replica down with it again.
  const std::vector<request_id> doomed = st.sched->doomed();
  if (was_ready)
    spdlog::warn("replica {} degraded: {}; {} running request(s) will recompute", st.setup.replica, st.recovery->why(),
                 requeued - doomed.size());
  for (request_id id : doomed) {
    const std::string why = "its last " + std::to_string(scheduler::max_lost_steps) + " steps failed on replica " +
                            st.setup.replica + " (the latest: " + st.recovery->why() +
                            "); it is ended rather than computed into the same failure again";
    // The log names the request by its id; its client knows it by its own.
    std::fprintf(stderr, "troupe: request %llu: %s\n", static_cast<unsigned long long>(id.value), why.c_str());
    fail_request(self, id, why, error_code::internal);
  }
  end_deferred(self);  // (planning stopped with the loss: the caches start anew)
}

}  // namespace

void follow(self_ptr self, const recovery_step& step) {
  auto& st = self->state;
  using next = recovery_step::next;
  if (step.drop_in_flight) drop_in_flight(self, step.announce);
  if (step.announce) {
    if (st.ready())
      spdlog::info("replica {} ready (canary step passed; not ready for {} ms: {})", st.setup.replica,
                   static_cast<long long>(st.recovery->last_outage().count()), st.recovery->why());
    announce(self);
  }
  switch (step.what) {
    case next::nothing: break;
    case next::look_up: {
      const auto wait = step.at - self->clock().now();
      if (wait <= recovery_clock::duration::zero())
        self->send(self, resolve_atom_v, step.epoch);
      else
        self->delayed_send(self, std::chrono::ceil<std::chrono::milliseconds>(wait), resolve_atom_v, step.epoch);
      break;
    }
    case next::open_links: return open_links(self, step.epoch);
    case next::reset_kv: return reset_kv_manager(self);
    case next::run_canary: return canary(self);
  }
  if (st.ready()) maybe_step(self);
}

void lose(self_ptr self, size_t stage, const std::string& why) {
  auto& st = self->state;
  if (stage < st.stages.size() && st.stages[stage]) {
    self->demonitor(st.stages[stage]);
    st.stages[stage] = caf::actor{};
  }
  follow(self, st.recovery->lost(why, self->clock().now()));
}

// The kv manager is looked up again (a live one is reset like a new one).
void lose_kv(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.kv) {
    self->demonitor(st.kv);
    st.kv = caf::actor{};
  }
  follow(self, st.recovery->lost(why, self->clock().now()));
}

// Looks up every missing stage; when all are there, runs the canary.
void resolve(self_ptr self) {
  auto& st = self->state;
  const uint64_t epoch = st.epoch();
  auto pending = std::make_shared<size_t>(0);
  auto finish_one = [self, epoch, pending] {
    auto& st = self->state;
    if (--*pending != 0 || epoch != st.epoch()) return;
    bool all = !remote_kv(st) || static_cast<bool>(st.kv);
    for (auto& s : st.stages) all = all && static_cast<bool>(s);
    follow(self, st.recovery->looked_up(epoch, all, self->clock().now()));
  };
  const bool find_kv = remote_kv(st) && !st.kv;
  *pending = find_kv ? 1 : 0;
  for (size_t i = 0; i < st.stages.size(); ++i)
    if (!st.stages[i]) ++*pending;
  if (*pending == 0) {
    ++*pending;
    return finish_one();
  }
  if (find_kv)
    self->request(st.setup.agent, std::chrono::seconds(2), lookup_atom_v, st.setup.kv_manager)
        .then(
            [self, epoch, finish_one](const caf::actor& kv) {
              auto& st = self->state;
              if (epoch == st.epoch() && kv) {
                st.kv = kv;
                self->monitor(kv);
              }
              finish_one();
            },
            [finish_one](caf::error&) { finish_one(); });
  for (size_t i = 0; i < st.stages.size(); ++i) {
    if (st.stages[i]) continue;
    const stage_address& a = st.setup.stages[i];
    const std::string key = a.host + ":" + std::to_string(a.port);
    const auto known = st.peers.find(key);
    with_agent(
        self, st.setup.agent, known == st.peers.end() ? caf::actor{} : known->second, a.host, a.port,
        [self, epoch, i, finish_one, key, remote = a.port != 0, name = a.name](caf::actor agent, bool fresh) {
          if (fresh) {
            self->state.peers[key] = agent;
            self->monitor(agent);
          }
          self->request(agent, std::chrono::seconds(2), lookup_atom_v, name)
              .then(
                  [self, epoch, i, finish_one](const caf::actor& stage) {
                    auto& st = self->state;
                    if (epoch == st.epoch() && stage) {
                      st.stages[i] = stage;
                      self->monitor(stage);
                    }
                    finish_one();
                  },
                  [self, finish_one, key, remote](caf::error&) {
                    if (remote) self->state.peers.erase(key);  // connect again next time
                    finish_one();
                  });
        },
        [finish_one](caf::error&) { finish_one(); });
  }
}

void link_dialled(self_ptr self, uint64_t id) {
  auto& st = self->state;
  std::optional<expected<std::unique_ptr<step_link_client>>> made;
  {
    std::lock_guard<std::mutex> lock(st.dials->mutex);
    auto it = st.dials->made.find(id);
    if (it == st.dials->made.end()) return;
    made.emplace(std::move(it->second));
    st.dials->made.erase(it);
  }
  auto d = st.dialing.find(id);
  if (d == st.dialing.end()) return;
  link_dial dialled = std::move(d->second);
  st.dialing.erase(d);
  const size_t i = dialled.stage;
  // A link dialled for a session since lost closes here (its stage may be another now).
  if (dialled.epoch == st.epoch()) {
    if (*made) {
      st.links[i].id = id;
      st.links[i].client = std::move(*made).value();
    } else {
      std::fprintf(stderr, "troupe: replica %s, stage %zu: %s; its steps go through the middleman\n",
                   st.setup.replica.c_str(), i, made->err().message.c_str());
    }
  }
  dialled.done();
}

// A step link whose oldest step has waited past the step timeout loses its stage (an actor
// request times out by itself).
void check_links(self_ptr self) {
  auto& st = self->state;
  const auto now = self->clock().now();
  for (size_t i = 0; i < st.links.size(); ++i) {
    const stage_link& l = st.links[i];
    if (l.client && !l.pending.empty() && now - l.pending.front().sent > st.setup.step_timeout)
      return lose(self, i, "stage " + std::to_string(i) + ": no answer over the step link within " +
                               std::to_string(st.setup.step_timeout.count()) + " ms");
  }
}

// Requests that waited past the recovery timeout end with an error.
void check_deadline(self_ptr self) {
  auto& st = self->state;
  const auto why = st.recovery->overdue(self->clock().now(), st.setup.replica);
  if (!why) return;
  std::vector<uint64_t> ids;
  for (auto& [id, s] : st.sinks) ids.push_back(id);
  for (uint64_t id : ids) fail_request(self, request_id{id}, *why);
}

}  // namespace troupe::scheduler_actor_impl

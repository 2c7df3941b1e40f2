// Losses and recovery of the scheduler actor: stages and the kv manager looked up again,
// the kv manager reset, the canary step (scheduler_state.hpp).
#include <cmath>
#include <cstdio>

#include "actors/agent_link.hpp"
#include "actors/scheduler_state.hpp"
#include "actors/wire/activations_codec.hpp"

namespace troupe::sched {

namespace {

void canary(self_ptr self);

// The kv manager starts a new session empty, then the canary runs.
void reset_kv_manager(self_ptr self) {
  auto& st = self->state;
  if (!remote_kv(st)) return canary(self);
  st.kv_sender->restart(st.session_base + st.epoch);
  claim(self, kv_step_request{}, [self](kv_step_grants) { canary(self); });
}

// One token through every stage, into block 0 (free: nothing runs while not ready, and
// the kv manager was just reset).
void canary(self_ptr self) {
  auto& st = self->state;
  st.encoder.restart(st.session_base + st.epoch);
  st.released.clear();
  step_plan plan;
  const std::vector<int32_t> token{st.setup.tok->bos_id() >= 0 ? st.setup.tok->bos_id() : 0};
  static const std::vector<uint32_t> table{0};
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
  const uint64_t epoch = st.epoch;
  run_from(self, epoch, 0, msg, wire_message{}, [self](const wire_message& logits) {
    auto& st = self->state;
    const int32_t vocab = st.setup.m->config.vocab_size;
    auto lg = logits.bytes ? wire::decode_activations(*logits.bytes, vocab, 1) : expected<wire::decoded_activations>(error{"no logits"});
    bool finite = lg && lg->num_tokens == 1;
    if (finite)
      for (float x : lg->data) finite = finite && std::isfinite(x);
    if (!finite) return lose(self, st.stages.size() - 1, "the canary step gave no usable logits");
    const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - st.degraded_since).count();
    std::fprintf(stderr, "troupe: replica %s ready (canary step passed; not ready for %.0f ms: %s)\n",
                 st.setup.replica.c_str(), ms, st.why.c_str());
    st.ready = true;
    st.resolve_round = 0;
    st.losses = 0;
    announce(self);
    maybe_step(self);
  });
}

// Plans in flight are dropped and the KV is forgotten: running requests recompute.
void degrade(self_ptr self, const std::string& why) {
  auto& st = self->state;
  ++st.epoch;
  st.in_flight = 0;
  st.planning = false;
  st.released.clear();
  const size_t requeued = st.sched->reset_kv();
  st.why = why;  // health says the latest reason
  if (st.ready) {
    st.ready = false;
    st.degraded_since = clock_type::now();
    std::fprintf(stderr, "troupe: replica %s degraded: %s; %zu running request(s) will recompute\n",
                 st.setup.replica.c_str(), why.c_str(), requeued);
    announce(self);
  }
  // The first loss is repaired at once; repeated ones (a stage that fails every step) wait
  // 50 ms, doubling to 2 s, so a broken stage does not spin the scheduler.
  const int32_t n = ++st.losses;
  if (n <= 1)
    self->send(self, resolve_atom_v, st.epoch);
  else
    self->delayed_send(self, std::chrono::milliseconds(std::min(2000, 25 << std::min(n - 1, 7))), resolve_atom_v, st.epoch);
}

}  // namespace

void lose(self_ptr self, size_t stage, const std::string& why) {
  auto& st = self->state;
  if (stage < st.stages.size() && st.stages[stage]) {
    self->demonitor(st.stages[stage]);
    st.stages[stage] = caf::actor{};
  }
  degrade(self, why);
}

// The kv manager is looked up again (a live one is reset like a new one).
void lose_kv(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.kv) {
    self->demonitor(st.kv);
    st.kv = caf::actor{};
  }
  degrade(self, why);
}

// Looks up every missing stage; when all are there, runs the canary.
void resolve(self_ptr self) {
  auto& st = self->state;
  const uint64_t epoch = st.epoch;
  auto pending = std::make_shared<size_t>(0);
  auto finish_one = [self, epoch, pending] {
    auto& st = self->state;
    if (--*pending != 0 || epoch != st.epoch) return;
    bool all = !remote_kv(st) || static_cast<bool>(st.kv);
    for (auto& s : st.stages) all = all && static_cast<bool>(s);
    if (all) return reset_kv_manager(self);
    const auto backoff = std::chrono::milliseconds(std::min(1000, 25 << std::min(st.resolve_round++, 5)));
    self->delayed_send(self, backoff, resolve_atom_v, epoch);
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
              if (epoch == st.epoch && kv) {
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
                    if (epoch == st.epoch && stage) {
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

// Requests that waited past the recovery timeout end with an error.
void check_deadline(self_ptr self) {
  auto& st = self->state;
  if (st.ready || clock_type::now() - st.degraded_since < st.setup.recovery_timeout) return;
  std::vector<uint64_t> ids;
  for (auto& [id, s] : st.sinks) ids.push_back(id);
  const std::string why = "replica " + st.setup.replica + " did not recover within " +
                          std::to_string(st.setup.recovery_timeout.count() / 1000) + " s (" + st.why + ")";
  for (uint64_t id : ids) fail_request(self, request_id{id}, why);
}

}  // namespace troupe::sched

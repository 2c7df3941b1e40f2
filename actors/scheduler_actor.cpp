#include "actors/scheduler_actor.hpp"

#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include <caf/all.hpp>

#include "actors/agent_link.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/wire/activations_codec.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/kv_codec.hpp"
#include "actors/wire/step_codec.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;

// The canary's request id: clients' ids never come near it.
constexpr uint64_t canary_id = ~uint64_t{0} - 1;

struct sink_entry {
  caf::actor sink;
  uint32_t seq = 0;
};

struct scheduler_state {
  static inline const char* name = "troupe.scheduler";

  scheduler_setup setup;
  std::unique_ptr<scheduler> sched;
  wire::step_encoder encoder;
  std::vector<request_id> released;
  std::unordered_map<uint64_t, sink_entry> sinks;
  std::unordered_set<caf::actor_addr> monitored_sinks;
  std::unordered_set<caf::actor_addr> watchers;  // asked for health (the router): told of
                                                 // every change, requests or not
  uint64_t next_id = 1;
  int32_t in_flight = 0;

  // The kv manager, when the blocks are claimed from one.
  caf::actor kv;                                     // invalid while lost
  std::optional<wire::kv_claim_sender> kv_sender;
  bool planning = false;                             // claims of a step are out

  // The pipeline, and recovery.
  std::vector<caf::actor> stages;                    // invalid while lost
  std::unordered_map<std::string, caf::actor> peers; // other nodes' agents, by host:port
  uint64_t epoch = 0;          // bumped on every loss: replies of older epochs are dropped
  uint64_t session_base = 0;
  bool ready = false;
  int32_t resolve_round = 0;   // for the backoff of stage lookups
  int32_t losses = 0;          // since the last time the replica was ready: a stage that
                               // fails every step is retried with a growing pause
  clock_type::time_point degraded_since = clock_type::now();
  std::string why = "starting";
};

using self_ptr = caf::stateful_actor<scheduler_state>*;

bool remote_kv(const scheduler_state& st) { return !st.setup.kv_manager.empty(); }

void send_result(self_ptr self, uint64_t id, const step_output& out, const std::string& error_text) {
  auto& st = self->state;
  auto it = st.sinks.find(id);
  if (it == st.sinks.end()) return;
  self->send(it->second.sink, done_atom_v,
             wire_message(wire_kind::none, error_text.empty() ? wire::encode_final_result(id, it->second.seq, out)
                                                              : wire::encode_generate_result(id, out, it->second.seq, error_text)));
  st.sinks.erase(it);
}

void dispatch(self_ptr self, std::vector<step_output> outs) {
  auto& st = self->state;
  for (const step_output& o : outs) {
    auto it = st.sinks.find(o.id.value);
    if (it == st.sinks.end()) continue;
    sink_entry& s = it->second;
    if (o.finished) {
      send_result(self, o.id.value, o, "");
      st.released.push_back(o.id);
    } else if (!o.new_tokens.empty() || !o.text.empty()) {
      self->send(s.sink, chunk_atom_v, wire_message(wire_kind::none, wire::encode_token_chunk(o.id.value, s.seq++, o)));
    }
  }
}

void fail_request(self_ptr self, request_id id, const std::string& why) {
  auto& st = self->state;
  if (auto out = st.sched->abort(id)) {
    send_result(self, id.value, *out, why);
    st.released.push_back(id);
  }
}

// Sinks (the router) hear at once when the replica stops or starts being ready.
void announce(self_ptr self) {
  auto& st = self->state;
  std::unordered_set<caf::actor_addr> told;
  for (const auto* set : {&st.watchers, &st.monitored_sinks})
    for (const auto& addr : *set)
      if (told.insert(addr).second)
        if (auto a = caf::actor_cast<caf::actor>(addr)) self->send(a, health_atom_v, st.ready);
}

void maybe_step(self_ptr self);
void lose(self_ptr self, size_t stage, const std::string& why);
void lose_kv(self_ptr self, const std::string& why);
void resolve(self_ptr self);

// Runs `plan` through stages i.. and calls `done` with the last stage's output.
void run_from(self_ptr self, uint64_t epoch, size_t i, wire_message plan, wire_message act,
              std::function<void(const wire_message&)> done) {
  auto& st = self->state;
  if (epoch != st.epoch) return;
  if (!st.stages[i]) return lose(self, i, "stage " + std::to_string(i) + " is gone");
  self->request(st.stages[i], st.setup.step_timeout, step_atom_v, plan, act)
      .then(
          [self, epoch, i, plan, done](const wire_message& out) {
            auto& st = self->state;
            if (epoch != st.epoch) return;
            if (i + 1 < st.stages.size()) return run_from(self, epoch, i + 1, plan, out, done);
            done(out);
          },
          [self, epoch, i](caf::error& e) {
            if (epoch != self->state.epoch) return;
            lose(self, i, "stage " + std::to_string(i) + ": " + self->system().render(e));
          });
}

// Sends `q` to the kv manager; `then` gets its grants. Exchanges are answered in the
// order they were sent, and each is checked against the latest claims sent (a release
// alone has no grants to check).
void claim(self_ptr self, const kv_step_request& q, std::function<void(kv_step_grants)> then) {
  auto& st = self->state;
  if (!st.kv) return lose_kv(self, "the kv manager is gone");
  const uint64_t epoch = st.epoch;
  const wire_message msg(wire_kind::kv_step, st.kv_sender->encode(q));
  self->request(st.kv, st.setup.step_timeout, claim_atom_v, msg)
      .then(
          [self, epoch, then](const wire_message& reply) {
            auto& st = self->state;
            if (epoch != st.epoch) return;
            auto g = reply.bytes ? st.kv_sender->decode(*reply.bytes) : expected<kv_step_grants>(error{"an empty answer"});
            if (!g) return lose_kv(self, g.err().message);
            st.sched->set_kv_usage(g->usage);
            then(std::move(g).value());
          },
          [self, epoch](caf::error& e) {
            if (epoch == self->state.epoch) lose_kv(self, "kv manager: " + self->system().render(e));
          });
}

// Blocks released while no step follows go back at once, so the kv manager's figures are
// current.
void hand_back(self_ptr self) {
  auto& st = self->state;
  if (!remote_kv(st) || st.planning || !st.ready || !st.kv) return;
  kv_step_request q;
  q.releases = st.sched->take_releases();
  if (!q.releases.empty()) claim(self, q, [](kv_step_grants) {});
}

// Sends `p` through the pipeline; an empty plan (requests in flight, or ended for lack
// of memory) only delivers.
void run_plan(self_ptr self, step_plan p) {
  auto& st = self->state;
  const auto plan = std::make_shared<step_plan>(std::move(p));
  if (plan->chunks.empty()) {
    dispatch(self, st.sched->update_from_output(*plan, {}));
    return;
  }
  const wire_message msg(wire_kind::step_plan, st.encoder.encode(*plan, st.released));
  st.released.clear();
  ++st.in_flight;
  run_from(self, st.epoch, 0, msg, wire_message{}, [self, plan](const wire_message& logits) {
    auto& st = self->state;
    --st.in_flight;
    const int32_t vocab = st.setup.m->config.vocab_size;
    auto lg = logits.bytes ? wire::decode_activations(*logits.bytes, vocab, st.setup.config.max_step_tokens)
                           : expected<wire::decoded_activations>(error{"no logits"});
    if (!lg || lg->num_tokens != plan->num_samples())
      return lose(self, st.stages.size() - 1, lg ? "logits do not match the step" : lg.err().message);
    std::vector<sample_result> samples;
    int32_t row = 0;
    for (const auto& c : plan->chunks) {
      if (!c.sample) continue;
      float* l = lg->data.data() + static_cast<size_t>(row++) * vocab;
      request* r = st.sched->find(c.id);
      // A request cancelled while the step ran still takes its row.
      samples.push_back(r ? r->smp.sample(l, vocab) : sample_result{});
    }
    dispatch(self, st.sched->update_from_output(*plan, samples));
    maybe_step(self);
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
  const int32_t before = st.in_flight;
  run_plan(self, st.sched->end_step(*d));
  if (st.ready && st.in_flight > before)
    maybe_step(self);  // the next plan, while this one runs
  else
    hand_back(self);
}

void maybe_step(self_ptr self) {
  auto& st = self->state;
  if (!st.ready) return;
  while (!st.planning && st.in_flight < std::max(1, st.setup.max_in_flight) && st.sched->has_unfinished()) {
    if (remote_kv(st)) {
      st.planning = true;
      return claim_round(self, std::make_shared<step_draft>(st.sched->begin_step()));
    }
    const int32_t before = st.in_flight;
    run_plan(self, st.sched->schedule());
    if (!st.ready || st.in_flight == before) break;  // lost a stage, or nothing could be scheduled
  }
  hand_back(self);
}

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

void watch_sink(self_ptr self, const caf::actor& sink) {
  if (sink && self->state.monitored_sinks.insert(sink.address()).second) self->monitor(sink);
}

caf::behavior scheduler_behavior(self_ptr self, scheduler_setup setup) {
  auto& st = self->state;
  st.setup = setup;
  scheduler_config cfg = setup.config;
  cfg.remote_kv = remote_kv(st);
  st.sched = std::make_unique<scheduler>(cfg, *setup.tok);
  if (cfg.remote_kv) {
    wire::kv_limits lim;
    lim.num_blocks = cfg.num_blocks;
    lim.block_size = cfg.block_size;
    lim.context = cfg.context;
    st.kv_sender.emplace(lim);
  }
  st.stages.resize(setup.stages.size());
  st.session_base = std::random_device{}() * (uint64_t{1} << 32);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    if (st.kv && st.kv.address() == dm.source)
      return lose_kv(self, "the kv manager went down (" + self->system().render(dm.reason) + ")");
    for (size_t i = 0; i < st.stages.size(); ++i)
      if (st.stages[i] && st.stages[i].address() == dm.source)
        return lose(self, i, "stage " + std::to_string(i) + " went down (" + self->system().render(dm.reason) + ")");
    for (auto it = st.peers.begin(); it != st.peers.end(); ++it)
      if (it->second.address() == dm.source) {
        st.peers.erase(it);
        return;
      }
    st.watchers.erase(dm.source);
    if (st.monitored_sinks.erase(dm.source) == 0) return;
    std::vector<uint64_t> gone;
    for (auto& [id, s] : st.sinks)
      if (s.sink.address() == dm.source) gone.push_back(id);
    for (uint64_t id : gone)
      if (auto out = st.sched->abort(request_id{id})) {
        st.sinks.erase(id);
        st.released.push_back(request_id{id});
      }
    maybe_step(self);
  });
  self->send(self, resolve_atom_v, st.epoch);
  self->send(self, tick_atom_v);
  auto add = [self](uint64_t id, const wire_message& req, const caf::actor& sink) -> status {
    auto& st = self->state;
    if (!req.bytes) return error{"empty request"};
    if (st.sinks.count(id)) return error{"request id " + std::to_string(id) + " is in use"};
    wire::request_limits lim;
    lim.context = st.setup.config.context;
    auto params = wire::decode_generate_request(*req.bytes, *st.setup.tok, lim);
    if (!params) return params.err();
    if (auto added = st.sched->add(request_id{id}, std::move(params).value()); !added) return added.err();
    st.sinks[id] = sink_entry{sink, 0};
    watch_sink(self, sink);
    maybe_step(self);
    return ok();
  };
  return {
      [self, add](generate_atom, const wire_message& req, const caf::actor& sink) -> caf::result<uint64_t> {
        const uint64_t id = self->state.next_id++;
        if (auto s = add(id, req, sink); !s) return caf::make_error(caf::sec::invalid_argument, s.err().message);
        return id;
      },
      [self, add](generate_atom, uint64_t id, const wire_message& req, const caf::actor& sink) {
        if (auto s = add(id, req, sink); !s) {
          step_output out;
          out.id = request_id{id};
          out.finished = true;
          self->send(sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(id, out, 0, s.err().message)));
        }
      },
      [self](cancel_atom, uint64_t id) -> bool {
        auto& st = self->state;
        auto out = st.sched->abort(request_id{id});
        if (!out) return false;
        dispatch(self, {*out});
        maybe_step(self);
        return true;
      },
      [self](stats_atom) -> caf::result<uint32_t, uint32_t, uint32_t, uint32_t> {
        auto& st = self->state;
        const kv_usage u = st.sched->usage();
        const auto running = static_cast<uint32_t>(st.sched->num_running());
        const auto waiting = static_cast<uint32_t>(st.sched->num_waiting());
        if (!st.kv || !st.ready) return {u.used, u.free, running, waiting};
        // Asked of the kv manager, after every release sent to it before.
        auto rp = self->make_response_promise<uint32_t, uint32_t, uint32_t, uint32_t>();
        self->request(st.kv, std::chrono::seconds(2), stats_atom_v)
            .then([rp, running, waiting](uint32_t used, uint32_t free, uint32_t, uint32_t) mutable {
                    rp.deliver(used, free, running, waiting);
                  },
                  [rp, u, running, waiting](caf::error&) mutable { rp.deliver(u.used, u.free, running, waiting); });
        return rp;
      },
      [self](health_atom) {
        auto& st = self->state;
        // Whoever asks (the router) hears of later changes at once, not at its next poll.
        if (auto asker = caf::actor_cast<caf::actor>(self->current_sender()))
          if (st.watchers.insert(asker.address()).second && !st.monitored_sinks.count(asker.address())) self->monitor(asker);
        const kv_usage u = st.sched->usage();
        return caf::make_message(st.ready, u.used, u.free, static_cast<uint32_t>(st.sched->num_running()),
                                 static_cast<uint32_t>(st.sched->num_waiting()), st.ready ? std::string{} : st.why);
      },
      [self](metrics_atom) {
        const kv_usage u = self->state.sched->usage();
        return caf::make_message(u.cached, u.hit_tokens, u.queried_tokens);
      },
      [self](resolve_atom, uint64_t epoch) {
        if (epoch == self->state.epoch && !self->state.ready) resolve(self);
      },
      [self](tick_atom) {
        check_deadline(self);
        self->delayed_send(self, std::chrono::milliseconds(250), tick_atom_v);
      },
  };
}

}  // namespace

caf::actor spawn_scheduler(caf::actor_system& sys, const scheduler_setup& setup) {
  return sys.spawn(scheduler_behavior, setup);
}

}  // namespace troupe

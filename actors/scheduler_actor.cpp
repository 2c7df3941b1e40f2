#include "actors/scheduler_actor.hpp"

#include <cstdio>
#include <random>
#include <utility>

#include <caf/all.hpp>

#include "actors/caf/errors.hpp"
#include "actors/scheduler_state.hpp"
#include "actors/wire/client_codec.hpp"
#include "engine/forward/shard_tiers.hpp"

namespace troupe {

namespace scheduler_actor_impl {

void send_result(self_ptr self, uint64_t id, const step_output& out, const std::string& error_text, error_code kind) {
  auto& st = self->state;
  auto it = st.sinks.find(id);
  if (it == st.sinks.end()) return;
  self->send(it->second.sink, done_atom_v,
             wire_message(wire_kind::none, error_text.empty()
                                               ? wire::encode_final_result(id, it->second.seq, out)
                                               : wire::encode_generate_result(id, out, it->second.seq, error_text, kind)));
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

void fail_request(self_ptr self, request_id id, const std::string& why, error_code kind) {
  auto& st = self->state;
  if (auto out = st.sched->abort(id)) {
    st.steps->forget(id);
    send_result(self, id.value, *out, why, kind);
    st.released.push_back(id);
  }
}

bool end_request(self_ptr self, uint64_t id, bool sink_gone) {
  auto& st = self->state;
  if (!st.sched->find(request_id{id})) return false;
  if (st.planning) {
    st.deferred_ends.emplace_back(id, sink_gone);
    return true;
  }
  auto out = st.sched->abort(request_id{id});
  st.steps->forget(request_id{id});
  if (sink_gone) {
    st.sinks.erase(id);
    st.released.push_back(request_id{id});
  } else {
    dispatch(self, {*out});
  }
  return true;
}

void end_deferred(self_ptr self) {
  auto& st = self->state;
  if (st.planning) return;
  for (const auto& [id, sink_gone] : std::exchange(st.deferred_ends, {})) end_request(self, id, sink_gone);
}

// Sinks (the router) hear at once when the replica stops or starts being ready.
void announce(self_ptr self) {
  auto& st = self->state;
  std::unordered_set<caf::actor_addr> told;
  for (const auto* set : {&st.watchers, &st.monitored_sinks})
    for (const auto& addr : *set)
      if (told.insert(addr).second)
        if (auto a = caf::actor_cast<caf::actor>(addr)) self->send(a, health_atom_v, st.ready());
}

namespace {

// The step path: n-gram and trained heads' drafts are made here; a draft model's and
// early exit's come from the draft actor, whose orders are checked against the replica's
// limits.
void setup_steps(scheduler_state& st) {
  const scheduler_setup& s = st.setup;
  if (s.spec.uses_heads()) st.draft_pool = std::make_unique<thread_pool>(1);
  step_path::drafts d{s.spec, nullptr, false, step_path::max_tree_depth(s.spec, s.heads.get())};
  if (s.spec.enabled() && s.spec.method != spec_method::draft && s.spec.method != spec_method::early_exit)
    d.here = step_path::beside_scheduler(s.spec, *s.m, s.heads.get(), st.draft_pool.get());
  d.elsewhere = s.spec.method == spec_method::draft || s.spec.method == spec_method::early_exit;
  st.steps = std::make_unique<step_path>(*st.sched, s.m->config, std::move(d));
  if (!st.steps->drafts_elsewhere()) return;
  wire::draft_limits lim;
  lim.num_blocks = s.config.kv.num_blocks;
  lim.block_size = s.config.kv.block_size;
  lim.context = s.config.context;
  lim.vocab = s.m->config.vocab_size;
  st.draft_limits = lim;
  restart_drafts(st);
}

// A prompt the directory does not cover is looked up in the tiers that outlive the
// scheduler: as many of its blocks as every shard holds.
void setup_tier_probe(scheduler_state& st) {
  const scheduler_setup& s = st.setup;
  if (s.probe_tiers.empty() || s.tier_prefixes.empty() || s.config.tier_blocks == 0) return;
  for (const std::string& prefix : s.tier_prefixes) {
    auto tiers = open_tiers(s.probe_tiers, prefix);
    if (!tiers) {
      std::fprintf(stderr, "troupe: replica %s: KV tiers not looked up: %s\n", s.replica.c_str(), tiers.err().message.c_str());
      st.probes.clear();
      return;
    }
    st.probes.emplace_back(prefix, std::move(tiers).value());
  }
  st.sched->set_tier_probe([&st](std::span<const tier_key> keys) {
    size_t held = keys.size();
    std::vector<std::string> names;
    for (const auto& [prefix, tiers] : st.probes) {
      names.clear();
      for (size_t i = 0; i < held; ++i) names.push_back(prefix + keys[i].hex());
      held = std::min(held, tiers->leading_present(names));
      if (held == 0) break;
    }
    return held;
  });
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
  setup_tier_probe(st);
  if (cfg.remote_kv) {
    wire::kv_limits lim;
    lim.num_blocks = cfg.kv.num_blocks;
    lim.block_size = cfg.kv.block_size;
    lim.context = cfg.context;
    st.kv_sender.emplace(lim);
  }
  st.stages.resize(setup.stages.size());
  st.links.resize(setup.stages.size());
  st.session_base = std::random_device{}() * (uint64_t{1} << 32);
  setup_steps(st);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    if (st.kv && st.kv.address() == dm.source)
      return lose_kv(self, "the kv manager went down (" + reason_of(dm.reason) + ")");
    if (st.draft && st.draft.address() == dm.source) {
      st.draft = caf::actor{};
      std::fprintf(stderr, "troupe: replica %s: its draft actor went down (%s); decoding without drafts until it is back\n",
                   st.setup.replica.c_str(), reason_of(dm.reason).c_str());
      restart_drafts(st);
      return find_draft(self);
    }
    for (size_t i = 0; i < st.stages.size(); ++i)
      if (st.stages[i] && st.stages[i].address() == dm.source)
        return lose(self, i, "stage " + std::to_string(i) + " went down (" + reason_of(dm.reason) + ")");
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
    for (uint64_t id : gone) end_request(self, id, true);
    maybe_step(self);
  });
  st.recovery = std::make_unique<replica_recovery>(setup.recovery_timeout, self->clock().now());
  follow(self, st.recovery->start(self->clock().now()));
  self->send(self, tick_atom_v);
  // A request queued, or why not: invalid, or refused by SLO admission (unavailable).
  struct refusal {
    std::string why;
    error_code kind = error_code::invalid;
  };
  auto add = [self](uint64_t id, const wire_message& req, const caf::actor& sink) -> std::optional<refusal> {
    auto& st = self->state;
    if (!req.bytes) return refusal{"empty request"};
    if (st.sinks.count(id)) return refusal{"request id " + std::to_string(id) + " is in use"};
    wire::request_limits lim;
    lim.context = st.setup.config.context;
    auto params = wire::decode_generate_request(*req.bytes, *st.setup.tok, lim);
    if (!params) return refusal{params.err().message};
    params->arrival_ms = std::chrono::duration<double, std::milli>(self->clock().now().time_since_epoch()).count();
    if (auto why = st.sched->slo_refusal(*params)) return refusal{*why, error_code::unavailable};
    if (auto added = st.sched->add(request_id{id}, std::move(params).value()); !added) return refusal{added.err().message};
    st.sinks[id] = sink_entry{sink, 0};
    watch_sink(self, sink);
    maybe_step(self);
    return std::nullopt;
  };
  return {
      [self, add](generate_atom, const wire_message& req, const caf::actor& sink) -> caf::result<uint64_t> {
        const uint64_t id = self->state.next_id++;
        if (auto r = add(id, req, sink)) return make_error(r->kind, r->why);
        return id;
      },
      [self, add](generate_atom, uint64_t id, const wire_message& req, const caf::actor& sink) {
        if (auto r = add(id, req, sink)) {
          step_output out;
          out.id = request_id{id};
          out.finished = true;
          self->send(sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(id, out, 0, r->why, r->kind)));
        }
      },
      [self](cancel_atom, uint64_t id) -> bool {
        if (!end_request(self, id, false)) return false;
        maybe_step(self);
        return true;
      },
      [self](stats_atom) -> caf::result<uint32_t, uint32_t, uint32_t, uint32_t> {
        auto& st = self->state;
        const kv_usage u = st.sched->usage();
        const auto running = static_cast<uint32_t>(st.sched->num_running());
        const auto waiting = static_cast<uint32_t>(st.sched->num_waiting());
        if (!st.kv || !st.ready()) return {u.used, u.free, running, waiting};
        // Asked of the kv manager, after every release sent to it before.
        auto rp = self->make_response_promise<uint32_t, uint32_t, uint32_t, uint32_t>();
        self->request(st.kv, std::chrono::seconds(2), stats_atom_v)
            .then([rp, running, waiting](uint32_t used, uint32_t free, uint32_t, uint32_t) mutable {
                    rp.deliver(used, free, running, waiting);
                  },
                  [rp, u, running, waiting](caf::error&) mutable { rp.deliver(u.used, u.free, running, waiting); });
        return rp;
      },
      [self](prefix_atom) -> caf::result<std::vector<uint64_t>> {
        auto& st = self->state;
        if (!st.kv || !st.ready()) return std::vector<uint64_t>{};
        auto rp = self->make_response_promise<std::vector<uint64_t>>();
        self->request(st.kv, std::chrono::seconds(2), prefix_atom_v)
            .then([rp](std::vector<uint64_t>& words) mutable { rp.deliver(std::move(words)); },
                  [rp](caf::error&) mutable { rp.deliver(std::vector<uint64_t>{}); });
        return rp;
      },
      [self](health_atom) {
        auto& st = self->state;
        // Whoever asks (the router) hears of later changes at once, not at its next poll.
        if (auto asker = caf::actor_cast<caf::actor>(self->current_sender()))
          if (st.watchers.insert(asker.address()).second && !st.monitored_sinks.count(asker.address())) self->monitor(asker);
        const kv_usage u = st.sched->usage();
        return caf::make_message(st.ready(), u.used, u.free, static_cast<uint32_t>(st.sched->num_running()),
                                 static_cast<uint32_t>(st.sched->num_waiting()), st.ready() ? std::string{} : st.recovery->why());
      },
      [self](metrics_atom) {
        auto& st = self->state;
        const kv_usage u = st.sched->usage();
        scheduler_figures f;
        f.cached = u.cached;
        f.hit_tokens = u.hit_tokens;
        f.queried_tokens = u.queried_tokens;
        f.spec_method = spec_method_name(st.setup.spec.method);
        const spec_tally& spec = st.steps->tally();
        f.spec.verifies = spec.verifies;
        f.spec.proposed = spec.proposed;
        f.spec.accepted = spec.accepted;
        f.spec.by_accepted.assign(spec.by_accepted.begin(), spec.by_accepted.end());
        f.spec.offered_at.assign(spec.offered_at.begin(), spec.offered_at.end());
        f.spec.kept_at.assign(spec.kept_at.begin(), spec.kept_at.end());
        const scheduler::eviction_usage e = st.sched->eviction_now();
        f.eviction = {st.sched->evicted_tokens(), e.requests, e.budget_tokens, e.held_tokens};
        const tier_usage t = st.sched->tiers_now();
        f.tiers = {t.loaded_tokens, t.failed_loads, t.saved_blocks, t.directory};
        return f;
      },
      [self](resolve_atom, uint64_t epoch) {
        if (epoch == self->state.epoch() && self->state.recovery->phase() == recovery_phase::looking_up) resolve(self);
      },
      [self](link_atom, uint64_t link, const wire_message& answer) { link_answer(self, link, answer); },
      [self](link_atom, uint64_t link, const std::string& why) { link_failed(self, link, why); },
      [self](link_atom, uint64_t link) { link_dialled(self, link); },
      [self](tick_atom) {
        check_deadline(self);
        check_links(self);
        find_draft(self);
        self->delayed_send(self, std::chrono::milliseconds(250), tick_atom_v);
      },
  };
}


}  // namespace

}  // namespace scheduler_actor_impl

caf::actor spawn_scheduler(caf::actor_system& sys, const scheduler_setup& setup) {
  return sys.spawn(scheduler_actor_impl::scheduler_behavior, setup);
}

}  // namespace troupe

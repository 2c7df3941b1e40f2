// The router actor: CAF messages and Cap'n Proto frames around request_router
// (engine/serve/request_router.hpp), which makes every routing decision. Here: finding
// the replicas' schedulers and polling them, carrying out the core's actions, and the one
// function that ends a request with its final message.
#include "actors/router_actor.hpp"

#include <algorithm>
#include <unordered_map>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/caf/errors.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/router_state.hpp"
#include "actors/wire/client_codec.hpp"
#include "engine/serve/request_router.hpp"

namespace troupe::router_actor_impl {

namespace {

// What a finished request's scheduler said, for its log line.
struct final_words {
  const wire_message* result = nullptr;  // the scheduler's GenerateResult frame
  const char* outcome = "stop";
  uint32_t tokens_in = 0, tokens_out = 0;
  bool unavailable = false;  // it ended with an error of that kind (SLO admission's refusal)
};

// The end of a request, said to `sink`: the one place a request's final message is made.
// A finished request's result is the scheduler's, split into its last chunk and the
// result proper, both numbered for the client; a cancelled or failed one's is made here.
// One log line per request, never its text.
void end_request(self_ptr self, const caf::actor& sink, const route_end& e, int32_t slo, const final_words& words = {}) {
  const char* outcome = e.outcome == route_outcome::cancelled ? "cancelled" : "error";
  uint32_t tokens_in = 0, tokens_out = e.delivered_tokens;
  wire_message last, result;
  if (e.outcome == route_outcome::finished && words.result && words.result->bytes) {
    if (auto parts = wire::split_final_result(*words.result->bytes, e.request, e.seq)) {
      if (parts->last) last = wire_message(wire_kind::none, std::move(*parts->last));
      result = wire_message(wire_kind::none, std::move(parts->result));
      outcome = words.outcome;
      tokens_in = words.tokens_in;
      tokens_out = words.tokens_out;
    }
  }
  if (!result.bytes) {
    step_output out;
    out.id = request_id{e.request};
    out.finished = true;
    out.reason = e.outcome == route_outcome::cancelled ? finish_reason::aborted : finish_reason::none;
    out.num_output_tokens = static_cast<int32_t>(e.delivered_tokens);
    const bool failed = e.outcome != route_outcome::cancelled;
    const std::string why = e.outcome == route_outcome::failed ? e.why : "the replica's final result could not be read";
    result = wire_message(wire_kind::none, wire::encode_generate_result(e.request, out, e.seq, failed ? why : "",
                                                                        e.outcome == route_outcome::failed ? e.code
                                                                                                           : error_code::internal));
  }
  if (last.bytes) self->send(sink, chunk_atom_v, std::move(last));
  self->send(sink, done_atom_v, std::move(result));
  auto& st = self->state;
  if (slo >= 0) {
    // Its class's attainment: a finished request judged by its times; one its replica or
    // the router could not take in time, refused; the rest (invalid, cancelled, internal
    // errors) are not the targets' to count.
    slo_outcome o = slo_outcome::failed;
    const bool unavailable = e.outcome == route_outcome::failed ? e.code == error_code::unavailable
                                                                 : words.unavailable;
    if (unavailable)
      o = slo_outcome::refused;
    else if (e.outcome == route_outcome::finished && std::string_view(outcome) != "error")
      o = slo_judge(st.setup.classes[slo], e.ttft_ms, e.e2e_ms, tokens_out);
    ++st.slo_counts[slo][static_cast<size_t>(o)];
  }
  spdlog::info("request id={} outcome={} replica={} tokens_in={} tokens_out={} ttft_ms={:.1f} e2e_ms={:.1f} resubmits={}",
               e.request, outcome, e.replica >= 0 ? st.names[e.replica] : "-", tokens_in, tokens_out,
               e.ttft_ms < 0 ? 0.0 : e.ttft_ms, e.e2e_ms, e.resubmits);
}

// A request the router never took (its id in use, no frame): said to its caller alone.
void refuse(self_ptr self, const caf::actor& sink, uint64_t id, const std::string& why) {
  route_end e;
  e.request = id;
  e.outcome = route_outcome::failed;
  e.code = error_code::invalid;
  e.why = why;
  end_request(self, sink, e, -1);
}

void carry_out(self_ptr self, route_actions acts);

// The core gave up on a request it had sent: ended as failed.
void fail(self_ptr self, uint64_t id, error_code code, const std::string& why) {
  if (auto e = self->state.core->fail(id, code, why, self->clock().now())) {
    route_actions acts;
    acts.ends.push_back(std::move(*e));
    carry_out(self, std::move(acts));
  }
}

void carry_out(self_ptr self, route_actions acts) {
  auto& st = self->state;
  for (const route_end& e : acts.ends) {
    auto it = st.clients.find(e.request);
    if (it == st.clients.end()) continue;
    end_request(self, it->second.sink, e, it->second.slo);
    st.clients.erase(it);
  }
  for (const route_send& s : acts.sends) {
    const client& c = st.clients.at(s.request);
    wire_message frame = c.request;
    if (s.resubmission || s.kv_to >= 0 || s.kv_from > 0) {
      wire::route_rewrite w;
      w.delivered = st.core->delivered(s.request);
      if (s.kv_to >= 0) w.kv_to = st.replicas[s.kv_to].addr.name;
      w.kv_from = s.kv_from;
      auto with = wire::with_route(*c.request.bytes, w);
      if (!with) {
        fail(self, s.request, error_code::internal, with.err().message);
        continue;
      }
      frame = wire_message(wire_kind::none, std::move(with).value());
    }
    self->send(st.replicas[s.replica].sched, generate_atom_v, s.attempt, frame, caf::actor_cast<caf::actor>(self));
  }
  // Anonymous: the scheduler's answer (whether it knew the request) has no use here.
  for (const route_cancel& c : acts.cancels) caf::anon_send(st.replicas[c.replica].sched, cancel_atom_v, c.attempt);
}

// What the router reads of a request: its prompt's block chain for kv-aware routing (none
// under least-loaded, or for a frame that cannot be read: the scheduler will say why) and
// its SLO class (-1: none, or one that does not exist: the scheduler refuses it).
route_prompt read_request(const router_state& st, std::span<const uint8_t> frame, int32_t& slo) {
  route_prompt p;
  slo = -1;
  const bool kv_aware = st.core->config().policy == route_policy::kv_aware && st.setup.tok;
  if (!kv_aware && !st.core->disaggregated() && st.setup.classes.empty()) return p;
  wire::request_limits lim;
  lim.context = st.setup.context;
  auto v = wire::peek_route(frame, kv_aware ? st.setup.tok : nullptr, lim);
  if (!v) return p;
  p.delivered = std::move(v->delivered);
  slo = v->slo_class.empty() ? st.setup.default_class : slo_class_index(st.setup.classes, v->slo_class);
  if (!kv_aware || (st.setup.context > 0 && v->prompt.size() >= static_cast<size_t>(st.setup.context))) return p;
  p.block_size = st.setup.block_size;
  p.tokens = static_cast<int32_t>(v->prompt.size());
  p.chain = prefix_chain(v->prompt, v->cache_namespace, p.block_size);
  return p;
}

void lose_replica(self_ptr self, size_t k, const std::string& why) {
  auto& st = self->state;
  replica_slot& rep = st.replicas[k];
  if (rep.sched) self->demonitor(rep.sched);
  rep.sched = caf::actor{};
  st.note("replica " + rep.addr.name + " lost: " + why);
  auto acts = st.core->replica_lost(k, why, self->clock().now());
  spdlog::warn("replica {} lost: {}; {} request(s) resubmitted", rep.addr.name, why, acts.sends.size());
  carry_out(self, std::move(acts));
}


}  // namespace

void health_of(self_ptr self, size_t k, bool ready, const std::string& detail) {
  auto& st = self->state;
  if (st.core->replica(k).ready != ready) {
    const std::string what =
        "replica " + st.replicas[k].addr.name + (ready ? " ready" : " not ready" + (detail.empty() ? "" : ": " + detail));
    if (ready)
      spdlog::info("{}", what);
    else
      spdlog::warn("{}", what);
    st.note(what);
  }
  carry_out(self, st.core->replica_health(k, ready, detail, self->clock().now()));
  const uint32_t now_ready = st.core->num_ready();
  auto& waiters = st.ready_waiters;
  for (auto it = waiters.begin(); it != waiters.end();)
    if (it->first <= now_ready) {
      it->second.deliver(now_ready);
      it = waiters.erase(it);
    } else {
      ++it;
    }
}

namespace {

caf::behavior router_behavior(self_ptr self, router_setup setup) {
  auto& st = self->state;
  st.setup = setup;
  route_config rc = setup.route;
  st.next_client = request_id_base(3, rc.gateway);
  rc.wait_timeout = setup.wait_timeout;
  st.core = std::make_unique<request_router>(setup.replicas.size(), rc);
  for (auto& a : setup.replicas) {
    st.core->set_role(st.replicas.size(), a.role);
    st.replicas.push_back(replica_slot{a});
    st.names.push_back(a.name);
  }
  for (auto& n : setup.nodes) st.nodes.push_back(node_slot{n});
  st.slo_counts.assign(setup.classes.size(), {});
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t k = 0; k < st.replicas.size(); ++k) {
      if (st.replicas[k].sched && st.replicas[k].sched.address() == dm.source)
        return lose_replica(self, k, "scheduler down: " + reason_of(dm.reason));
      if (st.replicas[k].agent && st.replicas[k].agent.address() == dm.source) st.replicas[k].agent = caf::actor{};
    }
  });
  self->send(self, tick_atom_v);
  auto accept = [self](uint64_t id, const wire_message& req, const caf::actor& sink) {
    auto& st = self->state;
    if (st.core->has_request(id)) return refuse(self, sink, id, "request id in use");
    if (!req.bytes) return refuse(self, sink, id, "empty request");
    int32_t slo = -1;
    route_prompt prompt = read_request(st, *req.bytes, slo);
    st.clients[id] = client{sink, req, slo};
    carry_out(self, st.core->accept(id, self->clock().now(), std::move(prompt)));
  };
  return {
      [accept](generate_atom, uint64_t id, const wire_message& req, const caf::actor& sink) { accept(id, req, sink); },
      [self, accept](generate_atom, const wire_message& req, const caf::actor& sink) -> uint64_t {
        const uint64_t id = self->state.next_client++;
        accept(id, req, sink);
        return id;
      },
      [self](cancel_atom, uint64_t id) -> bool {
        route_actions acts;
        const bool found = self->state.core->cancel(id, self->clock().now(), acts);
        carry_out(self, std::move(acts));
        return found;
      },
      [self](chunk_atom, const wire_message& m) {
        auto& st = self->state;
        auto c = m.bytes ? wire::peek_token_chunk(*m.bytes) : expected<wire::chunk_view>(error{"empty"});
        if (!c) return;
        auto to = st.core->chunk(c->request, c->tokens, self->clock().now());
        if (!to) return;  // an attempt the router gave up on
        wire_message forward = m;
        if (c->request != to->request || c->seq != to->seq) {
          auto out = wire::renumber_chunk(*m.bytes, to->request, to->seq);
          if (!out) return fail(self, to->request, error_code::internal, out.err().message);
          forward = wire_message(wire_kind::none, std::move(out).value());
        }
        self->send(st.clients.at(to->request).sink, chunk_atom_v, std::move(forward));
      },
      [self](done_atom, const wire_message& m) {
        auto& st = self->state;
        auto res = m.bytes ? wire::decode_generate_result(*m.bytes) : expected<wire::result_view>(error{"empty"});
        if (!res) return;
        const std::vector<int32_t> last = res->last ? res->last->tokens : std::vector<int32_t>{};
        // Refused before any token (SLO admission, or a replica that could not recover):
        // another replica may take it.
        if (!res->error.empty() && res->error_type == error_code::unavailable && last.empty() &&
            res->output_tokens == 0)
          return carry_out(self, st.core->refused(res->request, res->error, self->clock().now()));
        // A prefill replica's end of a request: its first token goes to the client, and the
        // request on to its decode replica.
        if (res->handed_off && res->error.empty()) {
          if (auto to = res->last ? st.core->chunk(res->request, last, self->clock().now()) : std::nullopt) {
            auto parts = wire::split_final_result(*m.bytes, to->request, to->seq);
            if (!parts) return fail(self, to->request, error_code::internal, parts.err().message);
            if (parts->last) self->send(st.clients.at(to->request).sink, chunk_atom_v, wire_message(wire_kind::none, std::move(*parts->last)));
          }
          return carry_out(self, st.core->handed_off(res->request, res->kv_sent, self->clock().now()));
        }
        auto e = st.core->done(res->request, last, self->clock().now());
        if (!e) return;  // an attempt the router gave up on
        final_words words;
        words.result = &m;
        words.outcome = !res->error.empty()                          ? "error"
                        : res->reason == finish_reason::aborted ? "cancelled"
                        : res->reason == finish_reason::length  ? "length"
                                                                : "stop";
        words.tokens_in = res->prompt_tokens;
        words.tokens_out = res->output_tokens;
        words.unavailable = !res->error.empty() && res->error_type == error_code::unavailable;
        auto it = st.clients.find(e->request);
        if (it == st.clients.end()) return;
        end_request(self, it->second.sink, *e, it->second.slo, words);
        st.clients.erase(it);
      },
      [self](stats_atom) -> caf::result<uint32_t, uint32_t, uint32_t, uint32_t> {
        // Asked afresh of every scheduler that is there (the polls lag by up to 100 ms).
        auto& st = self->state;
        auto rp = self->make_response_promise<uint32_t, uint32_t, uint32_t, uint32_t>();
        struct sum {
          uint32_t used = 0, free = 0, running = 0;
          size_t pending = 0;
        };
        auto total = std::make_shared<sum>();
        auto finish = [self, rp, total]() mutable {
          if (--total->pending != 0) return;
          // Waiting: everything admitted here and not running (exact).
          const auto all = static_cast<uint32_t>(self->state.core->num_requests());
          const uint32_t running = std::min(total->running, all);
          rp.deliver(total->used, total->free, running, all - running);
        };
        total->pending = 1;
        for (auto& rep : st.replicas) {
          if (!rep.sched) continue;
          ++total->pending;
          self->request(rep.sched, std::chrono::seconds(1), stats_atom_v)
              .then(
                  [total, finish](uint32_t used, uint32_t free, uint32_t running, uint32_t) mutable {
                    total->used += used;
                    total->free += free;
                    total->running += running;
                    finish();
                  },
                  [finish](caf::error&) mutable { finish(); });
        }
        finish();
        return rp;
      },
      [self](health_atom) {
        const auto& core = *self->state.core;
        const uint32_t ready = core.num_ready();
        std::string detail = core.not_ready_detail(self->state.names);
        if (const std::string stalls = recent_link_stalls(self->state); !stalls.empty())
          detail += (detail.empty() ? "" : "; ") + stalls;
        // When a replica last stopped being ready, as Unix time (ms; 0: never), so that one who
        // caused a failure can tell when the router saw it, however late its own call is
        // answered.
        uint64_t last_down_ms = 0;
        if (const auto t = core.last_down()) {
          const auto at = std::chrono::system_clock::now() - (self->clock().now() - *t);
          last_down_ms = static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count());
        }
        return caf::make_message(core.can_serve(), static_cast<uint32_t>(core.num_replicas()), ready, detail, core.outages(),
                                 last_down_ms);
      },
      [self](health_atom, uint32_t at_least) -> caf::result<uint32_t> {
        // Answered once at least that many replicas are ready (the caller's own timeout
        // bounds the wait).
        auto& st = self->state;
        if (st.core->num_ready() >= at_least) return st.core->num_ready();
        auto rp = self->make_response_promise<uint32_t>();
        st.ready_waiters.emplace_back(at_least, rp);
        return rp;
      },
      [self](health_atom, bool ready) {
        // A scheduler says it stopped or started being ready.
        auto& st = self->state;
        for (size_t k = 0; k < st.replicas.size(); ++k)
          if (st.replicas[k].sched && st.replicas[k].sched.address() == self->current_sender())
            health_of(self, k, ready, ready ? "" : "recovering");
      },
      [self](metrics_atom) { return render_metrics(self->state); },
      [self](status_atom) { return render_status(self->state); },
      [self](tick_atom) {
        auto& st = self->state;
        for (size_t k = 0; k < st.replicas.size(); ++k) poll_one(self, k);
        if (st.core->config().policy == route_policy::kv_aware && st.ticks % 5 == 0)
          for (size_t k = 0; k < st.replicas.size(); ++k) poll_summary(self, k);
        carry_out(self, st.core->tick(self->clock().now()));
        if (st.ticks++ % 10 == 0) poll_nodes(self);
        self->delayed_send(self, std::chrono::milliseconds(100), tick_atom_v);
      },
  };
}

}  // namespace

}  // namespace troupe::router_actor_impl

namespace troupe {

caf::actor spawn_router(caf::actor_system& sys, const router_setup& setup) {
  return sys.spawn(router_actor_impl::router_behavior, setup);
}

}  // namespace troupe

#include "actors/scheduler_actor.hpp"

#include <unordered_map>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"
#include "actors/wire/activations_codec.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/step_codec.hpp"

namespace troupe {

namespace {

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
  uint64_t next_id = 1;
  int32_t in_flight = 0;
};

using self_ptr = caf::stateful_actor<scheduler_state>*;

void dispatch(self_ptr self, std::vector<step_output> outs) {
  auto& st = self->state;
  for (const step_output& o : outs) {
    auto it = st.sinks.find(o.id.value);
    if (it == st.sinks.end()) continue;
    sink_entry& s = it->second;
    if (!o.new_tokens.empty() || !o.text.empty())
      self->send(s.sink, chunk_atom_v, wire_message(wire_kind::none, wire::encode_token_chunk(o.id.value, s.seq++, o)));
    if (o.finished) {
      self->send(s.sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(o.id.value, o, s.seq)));
      st.sinks.erase(it);
      st.released.push_back(o.id);
    }
  }
}

void send_step(self_ptr self);

void maybe_step(self_ptr self) {
  auto& st = self->state;
  while (st.in_flight < std::max(1, st.setup.max_in_flight) && st.sched->has_unfinished()) {
    const int32_t before = st.in_flight;
    send_step(self);
    if (st.in_flight == before) break;  // nothing could be scheduled
  }
}

void send_step(self_ptr self) {
  auto& st = self->state;
  const auto plan = std::make_shared<step_plan>(st.sched->schedule());
  if (plan->chunks.empty()) {
    // Nothing could run now (requests in flight, or ended for lack of memory): deliver.
    dispatch(self, st.sched->update_from_output(*plan, {}));
    return;
  }
  const wire_message msg(wire_kind::step_plan, st.encoder.encode(*plan, st.released));
  st.released.clear();
  ++st.in_flight;
  self->request(st.setup.entry, caf::infinite, step_atom_v, msg, wire_message{})
      .then(
          [self, plan](const wire_message& logits) {
            auto& st = self->state;
            --st.in_flight;
            const int32_t vocab = st.setup.m->config.vocab_size;
            std::vector<sample_result> samples;
            auto lg = logits.bytes ? wire::decode_activations(*logits.bytes, vocab, st.setup.config.max_step_tokens)
                                   : expected<wire::decoded_activations>(error{"no logits"});
            if (!lg || lg->num_tokens != plan->num_samples()) {
              // The replica returned something unusable: every request of the step ends with an error.
              for (const auto& c : plan->chunks)
                if (auto out = st.sched->abort(c.id)) {
                  auto it = st.sinks.find(c.id.value);
                  if (it == st.sinks.end()) continue;
                  self->send(it->second.sink, done_atom_v,
                             wire_message(wire_kind::none, wire::encode_generate_result(c.id.value, *out, it->second.seq,
                                                                                        lg ? "logits do not match the step" : lg.err().message)));
                  st.sinks.erase(it);
                  st.released.push_back(c.id);
                }
              maybe_step(self);
              return;
            }
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
          },
          [self, plan](caf::error& e) {
            auto& st = self->state;
            --st.in_flight;
            for (const auto& c : plan->chunks)
              if (auto out = st.sched->abort(c.id)) {
                auto it = st.sinks.find(c.id.value);
                if (it == st.sinks.end()) continue;
                self->send(it->second.sink, done_atom_v,
                           wire_message(wire_kind::none, wire::encode_generate_result(c.id.value, *out, it->second.seq,
                                                                                      "step failed: " + self->system().render(e))));
                st.sinks.erase(it);
                st.released.push_back(c.id);
              }
            maybe_step(self);
          });
}

caf::behavior scheduler_behavior(self_ptr self, scheduler_setup setup) {
  auto& st = self->state;
  st.setup = setup;
  st.sched = std::make_unique<scheduler>(setup.config, *setup.tok);
  return {
      [self](generate_atom, const wire_message& req, const caf::actor& sink) -> caf::result<uint64_t> {
        auto& st = self->state;
        if (!req.bytes) return caf::make_error(caf::sec::invalid_argument, "empty request");
        wire::request_limits lim;
        lim.context = st.setup.config.context;
        auto params = wire::decode_generate_request(*req.bytes, *st.setup.tok, lim);
        if (!params) return caf::make_error(caf::sec::invalid_argument, params.err().message);
        const request_id id{st.next_id++};
        if (auto added = st.sched->add(id, std::move(params).value()); !added)
          return caf::make_error(caf::sec::invalid_argument, added.err().message);
        st.sinks[id.value] = sink_entry{sink, 0};
        maybe_step(self);
        return id.value;
      },
      [self](generate_atom, uint64_t id, const wire_message& req, const caf::actor& sink) {
        auto& st = self->state;
        auto refuse = [&](const std::string& why) {
          step_output out;
          out.id = request_id{id};
          out.finished = true;
          self->send(sink, done_atom_v, wire_message(wire_kind::none, wire::encode_generate_result(id, out, 0, why)));
        };
        if (!req.bytes) return refuse("empty request");
        if (st.sinks.count(id)) return refuse("request id " + std::to_string(id) + " is in use");
        wire::request_limits lim;
        lim.context = st.setup.config.context;
        auto params = wire::decode_generate_request(*req.bytes, *st.setup.tok, lim);
        if (!params) return refuse(params.err().message);
        if (auto added = st.sched->add(request_id{id}, std::move(params).value()); !added) return refuse(added.err().message);
        st.sinks[id] = sink_entry{sink, 0};
        maybe_step(self);
      },
      [self](cancel_atom, uint64_t id) -> bool {
        auto& st = self->state;
        auto out = st.sched->abort(request_id{id});
        if (!out) return false;
        dispatch(self, {*out});
        maybe_step(self);
        return true;
      },
      [self](stats_atom) {
        auto& st = self->state;
        const kv_usage u = st.sched->usage();
        return caf::make_message(u.used, u.free, static_cast<uint32_t>(st.sched->num_running()),
                                 static_cast<uint32_t>(st.sched->num_waiting()));
      },
  };
}

}  // namespace

caf::actor spawn_scheduler(caf::actor_system& sys, const scheduler_setup& setup) {
  return sys.spawn(scheduler_behavior, setup);
}

}  // namespace troupe

#include "actors/stage_actor.hpp"

#include <cstdio>
#include <string>

#include <unistd.h>

#include <caf/all.hpp>

#include "actors/caf/errors.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/shard_actor.hpp"

namespace troupe {

namespace {

struct stage_state {
  static inline const char* name = "troupe.stage";
  std::vector<caf::actor> shards;
  bool on_gpus = false;
  std::shared_ptr<local_collective_group> group;
  std::shared_ptr<nccl_group> gpu_group;
  // Device links: from the previous stage (drawn here, its invitation sent back) and to
  // the next (joined from the next stage's invitation).
  std::shared_ptr<nccl_group> link_in, link_out;
};

using stage_ptr = caf::stateful_actor<stage_state>*;

// The host this process runs on: device links join stages of one node only.
std::string this_node() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

wire_message invite_message(const nccl_group& g, int32_t rank, const std::string& node = {}) {
  return wire_message(wire_kind::nccl_invite, wire::encode_nccl_invite({g.id(), g.size(), rank, node}));
}

// Ends a device link: its shards drop it before their next step (or fail the one they are
// in, when it waits on the link).
void unlink(std::shared_ptr<nccl_group>& link) {
  if (link) link->abort();
  link.reset();
}

caf::error no_device_links(stage_ptr self) {
  if (!self->state.on_gpus) return make_error(error_code::disabled, "a CPU stage has no device links");
  return caf::none;
}

// (link_in_atom): a new input link, its invitation for the previous stage's rank 0.
caf::result<wire_message> draw_link_in(stage_ptr self) {
  if (auto e = no_device_links(self)) return e;
  auto& st = self->state;
  auto g = nccl_group::create(1 + static_cast<int32_t>(st.shards.size()));
  if (!g) return make_error(error_code::broken, g.err().message);
  unlink(st.link_in);
  st.link_in = *g;
  return invite_message(*st.link_in, 0, this_node());
}

// (link_out_atom, invite): rank 0 joins the next stage's input link as its sender.
caf::result<void> join_link_out(stage_ptr self, const wire_message& msg) {
  if (auto e = no_device_links(self)) return e;
  auto& st = self->state;
  auto invite = read_nccl_invite(msg);
  if (!invite) return make_error(error_code::invalid, invite.err().message);
  if (invite->rank != 0) return make_error(error_code::invalid, "a device link's sender is its rank 0");
  if (const std::string here = this_node(); invite->node != here)
    return make_error(error_code::disabled, "the next stage runs on " + invite->node + ", this one on " + here);
  auto g = nccl_group::join(invite->size, invite->id);
  if (!g) return make_error(error_code::broken, g.err().message);
  unlink(st.link_out);
  st.link_out = *g;
  self->send(st.shards[0], link_out_atom_v, msg);
  return caf::unit;
}

// (link_in_atom, invite): the input link drawn here, its sender invited: every shard joins
// as a receiver (rank 1 + its own).
caf::result<void> connect_link_in(stage_ptr self, const wire_message& msg) {
  auto& st = self->state;
  auto invite = read_nccl_invite(msg);
  if (!invite) return make_error(error_code::invalid, invite.err().message);
  if (!st.link_in || invite->id.bytes != st.link_in->id().bytes)
    return make_error(error_code::invalid, "not this stage's input link (drawn again, or ended, since)");
  for (size_t r = 0; r < st.shards.size(); ++r)
    self->send(st.shards[r], link_in_atom_v, invite_message(*st.link_in, 1 + static_cast<int32_t>(r)));
  return caf::unit;
}

caf::behavior stage_behavior(stage_ptr self, std::vector<caf::actor> shards, bool on_gpus,
                             std::shared_ptr<local_collective_group> group, std::shared_ptr<nccl_group> gpu_group) {
  self->state.shards = std::move(shards);
  self->state.on_gpus = on_gpus;
  self->state.group = std::move(group);
  self->state.gpu_group = std::move(gpu_group);
  for (auto& s : self->state.shards) self->link_to(s);
  // GPU shards over NCCL connect when the group's id reaches them: before any step, since
  // this actor's messages to a shard arrive in the order sent.
  if (const auto& g = self->state.gpu_group) {
    for (size_t r = 0; r < self->state.shards.size(); ++r) {
      self->send(self->state.shards[r], connect_atom_v, invite_message(*g, static_cast<int32_t>(r)));
    }
  }
  self->set_exit_handler([self](const caf::exit_msg& em) {
    if (em.reason == caf::exit_reason::normal) return;
    // Peers of a dead shard may wait inside the all-reduce for it: release them.
    if (self->state.group) self->state.group->abort();
    if (self->state.gpu_group) self->state.gpu_group->abort();
    unlink(self->state.link_in);
    unlink(self->state.link_out);
    self->quit(em.reason);
  });
  return {
      [self](step_atom, const wire_message& plan, const wire_message& act) -> caf::result<wire_message> {
        const auto& shards = self->state.shards;
        auto rp = self->make_response_promise<wire_message>();
        if (shards.size() == 1) return rp.delegate(shards[0], step_atom_v, plan, act);
        auto pending = std::make_shared<size_t>(shards.size());
        auto first = std::make_shared<wire_message>();
        auto failed = std::make_shared<bool>(false);
        for (size_t i = 0; i < shards.size(); ++i) {
          self->request(shards[i], caf::infinite, step_atom_v, plan, act)
              .then(
                  [=](const wire_message& out) mutable {
                    if (i == 0) *first = out;
                    if (--*pending == 0 && !*failed) rp.deliver(*first);
                  },
                  [=](caf::error& e) mutable {
                    if (!*failed) rp.deliver(std::move(e));
                    *failed = true;
                  });
        }
        return rp;
      },
      // A lone shard's step link (actors/step_link.hpp); a stage of several has none.
      [self](link_atom) -> caf::result<uint16_t> {
        const auto& shards = self->state.shards;
        if (shards.size() != 1) return make_error(error_code::disabled, "a tensor-parallel stage has no step link");
        return self->make_response_promise<uint16_t>().delegate(shards[0], link_atom_v);
      },
      [self](link_in_atom) -> caf::result<wire_message> { return draw_link_in(self); },
      [self](link_in_atom, const wire_message& invite) -> caf::result<void> { return connect_link_in(self, invite); },
      [self](link_out_atom, const wire_message& invite) -> caf::result<void> { return join_link_out(self, invite); },
      [self](unlink_atom) {
        unlink(self->state.link_in);
        unlink(self->state.link_out);
      },
  };
}

}  // namespace

stage_group spawn_stage_group(caf::actor_system& sys, const model& m, const stage_layout& layout) {
  stage_group out;
  const bool on_gpus = !layout.devices.empty() && layout.devices[0] != "cpu";
  if (layout.tp > 1 && !on_gpus) out.group = std::make_shared<local_collective_group>(layout.tp);
  if (layout.tp > 1 && on_gpus) {
    if (auto g = nccl_group::create(layout.tp)) {
      out.gpu_group = *g;
    } else {
      std::fprintf(stderr, "troupe: stage of layers %d-%d: %s; its GPU shards sum through host memory instead (slow)\n",
                   layout.first_layer, layout.end_layer - 1, g.err().message.c_str());
      out.group = std::make_shared<local_collective_group>(layout.tp);
    }
  }
  auto failures = layout.tp > 1 && !layout.kv.tiers.empty() ? std::make_shared<tier_failures>(layout.tp) : nullptr;
  for (int32_t r = 0; r < layout.tp; ++r) {
    shard_setup s;
    s.failures = failures;
    s.m = &m;
    s.spec = shard_spec{layout.first_layer, layout.end_layer, tp_slice{r, layout.tp}};
    s.group = out.group;
    s.kv = layout.kv;
    s.meter = layout.meter;
    s.links = layout.links;
    s.threads = layout.threads_per_shard;
    s.max_step_tokens = layout.max_step_tokens;
    if (static_cast<size_t>(r) < layout.devices.size()) s.device = layout.devices[r];
    s.gpu_weights = layout.gpu_weights;
    s.link_host = layout.link_host;
    s.link_ports = layout.link_ports;
    if (layout.kv_listen_port != 0) {
      s.kv_listen_host = layout.kv_listen_host;
      s.kv_listen_port = static_cast<uint16_t>(layout.kv_listen_port + r);
    }
    for (kv_peer p : layout.kv_peers) {
      p.port = static_cast<uint16_t>(p.port + r);
      s.kv_peers.push_back(std::move(p));
    }
    out.shards.push_back(spawn_shard(sys, s));
  }
  out.stage = sys.spawn(stage_behavior, out.shards, on_gpus, out.group, out.gpu_group);
  return out;
}

}  // namespace troupe

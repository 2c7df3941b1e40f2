#include "actors/stage_actor.hpp"

#include <cstdio>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"
#include "actors/shard_actor.hpp"
#include "actors/wire/control_codec.hpp"

namespace troupe {

namespace {

struct stage_state {
  static inline const char* name = "troupe.stage";
  std::vector<caf::actor> shards;
  std::shared_ptr<local_collective_group> group;
  std::shared_ptr<gpu_tp_group> gpu_group;
};

caf::behavior stage_behavior(caf::stateful_actor<stage_state>* self, std::vector<caf::actor> shards,
                             std::shared_ptr<local_collective_group> group, std::shared_ptr<gpu_tp_group> gpu_group) {
  self->state.shards = std::move(shards);
  self->state.group = std::move(group);
  self->state.gpu_group = std::move(gpu_group);
  for (auto& s : self->state.shards) self->link_to(s);
  // GPU shards over NCCL connect when the group's id reaches them: before any step, since
  // this actor's messages to a shard arrive in the order sent.
  if (const auto& g = self->state.gpu_group) {
    for (size_t r = 0; r < self->state.shards.size(); ++r) {
      wire::tp_group_invite invite{g->id(), g->size(), static_cast<int32_t>(r)};
      self->send(self->state.shards[r], connect_atom_v, wire_message(wire_kind::tp_group, wire::encode_tp_group_invite(invite)));
    }
  }
  self->set_exit_handler([self](const caf::exit_msg& em) {
    if (em.reason == caf::exit_reason::normal) return;
    // Peers of a dead shard may wait inside the all-reduce for it: release them.
    if (self->state.group) self->state.group->abort();
    if (self->state.gpu_group) self->state.gpu_group->abort();
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
        if (shards.size() != 1) return caf::make_error(caf::sec::feature_disabled, "a tensor-parallel stage has no step link");
        return self->make_response_promise<uint16_t>().delegate(shards[0], link_atom_v);
      },
  };
}

}  // namespace

stage_group spawn_stage_group(caf::actor_system& sys, const model& m, const stage_layout& layout, uint32_t num_blocks,
                              int32_t block_size, int32_t max_step_tokens) {
  stage_group out;
  const bool on_gpus = !layout.devices.empty() && layout.devices[0] != "cpu";
  if (layout.tp > 1 && !on_gpus) out.group = std::make_shared<local_collective_group>(layout.tp);
  if (layout.tp > 1 && on_gpus) {
    if (auto g = gpu_tp_group::create(layout.tp)) {
      out.gpu_group = *g;
    } else {
      std::fprintf(stderr, "troupe: stage of layers %d-%d: %s; its GPU shards sum through host memory instead (slow)\n",
                   layout.first_layer, layout.end_layer - 1, g.err().message.c_str());
      out.group = std::make_shared<local_collective_group>(layout.tp);
    }
  }
  for (int32_t r = 0; r < layout.tp; ++r) {
    shard_setup s;
    s.m = &m;
    s.spec = shard_spec{layout.first_layer, layout.end_layer, tp_slice{r, layout.tp}};
    s.group = out.group;
    s.num_blocks = num_blocks;
    s.block_size = block_size;
    s.threads = layout.threads_per_shard;
    s.max_step_tokens = max_step_tokens;
    if (static_cast<size_t>(r) < layout.devices.size()) s.device = layout.devices[r];
    s.gpu_weights = layout.gpu_weights;
    s.link_host = layout.link_host;
    s.kv_type = layout.kv_type;
    out.shards.push_back(spawn_shard(sys, s));
  }
  out.stage = sys.spawn(stage_behavior, out.shards, out.group, out.gpu_group);
  return out;
}

}  // namespace troupe

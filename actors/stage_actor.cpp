#include "actors/stage_actor.hpp"

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"

namespace troupe {

namespace {

struct stage_state {
  static inline const char* name = "troupe.stage";
  std::vector<caf::actor> shards;
  caf::actor next;  // invalid for the last stage
};

caf::behavior stage_behavior(caf::stateful_actor<stage_state>* self, std::vector<caf::actor> shards, caf::actor next) {
  self->state.shards = std::move(shards);
  self->state.next = std::move(next);
  return {
      [self](step_atom, const wire_message& plan, const wire_message& act) -> caf::result<wire_message> {
        const auto& shards = self->state.shards;
        // A lone shard was spawned knowing the next stage: it answers, or passes the step on.
        if (shards.size() == 1) {
          auto rp = self->make_response_promise<wire_message>();
          return rp.delegate(shards[0], step_atom_v, plan, act);
        }
        auto rp = self->make_response_promise<wire_message>();
        auto pending = std::make_shared<size_t>(shards.size());
        auto first = std::make_shared<wire_message>();
        auto failed = std::make_shared<bool>(false);
        for (size_t i = 0; i < shards.size(); ++i) {
          self->request(shards[i], caf::infinite, step_atom_v, plan, act)
              .then(
                  [=](const wire_message& out) mutable {
                    if (i == 0) *first = out;
                    if (--*pending != 0 || *failed) return;
                    if (self->state.next)
                      rp.delegate(self->state.next, step_atom_v, plan, *first);
                    else
                      rp.deliver(*first);
                  },
                  [=](caf::error& e) mutable {
                    if (!*failed) rp.deliver(std::move(e));
                    *failed = true;
                  });
        }
        return rp;
      },
  };
}

}  // namespace

caf::actor spawn_stage(caf::actor_system& sys, std::vector<caf::actor> shards, caf::actor next) {
  return sys.spawn(stage_behavior, std::move(shards), std::move(next));
}

}  // namespace troupe

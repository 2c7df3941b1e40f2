#include "actors/kv_manager_actor.hpp"

#include <optional>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"
#include "actors/wire/kv_codec.hpp"
#include "engine/kv/kv_block_manager.hpp"

namespace troupe {

namespace {

struct kv_state {
  static inline const char* name = "troupe.kv_manager";
  kv_manager_setup setup;
  std::optional<kv_block_manager> blocks;
  std::optional<wire::kv_claim_receiver> receiver;
};

using self_ptr = caf::stateful_actor<kv_state>*;

caf::behavior kv_manager_behavior(self_ptr self, kv_manager_setup setup) {
  auto& st = self->state;
  st.setup = setup;
  st.blocks.emplace(setup.kv.num_blocks, setup.kv.block_size, setup.kv.prefix_caching);
  wire::kv_limits lim;
  lim.num_blocks = setup.kv.num_blocks;
  lim.block_size = setup.kv.block_size;
  lim.context = setup.context;
  st.receiver.emplace(lim);
  return {
      [self](claim_atom, const wire_message& msg) {
        auto& st = self->state;
        if (!msg.bytes) return wire_message(wire_kind::kv_grants, wire::encode_kv_error(0, "an empty message"));
        auto step = st.receiver->decode(*msg.bytes);
        if (!step) return wire_message(wire_kind::kv_grants, wire::encode_kv_error(st.receiver->session(), step.err().message));
        if (step->reset) st.blocks.emplace(st.setup.kv.num_blocks, st.setup.kv.block_size, st.setup.kv.prefix_caching);
        auto grants = st.blocks->grant(step->request);
        if (!grants) return wire_message(wire_kind::kv_grants, wire::encode_kv_error(step->session, grants.err().message));
        return wire_message(wire_kind::kv_grants, wire::encode_kv_grants(step->session, *grants));
      },
      [self](stats_atom) {
        auto& st = self->state;
        const kv_usage u = st.blocks->usage();
        return caf::make_message(u.used, u.free, u.cached, static_cast<uint32_t>(st.receiver->num_known_requests()));
      },
      [self](prefix_atom) { return self->state.blocks->summary().to_words(); },
  };
}

}  // namespace

caf::actor spawn_kv_manager(caf::actor_system& sys, const kv_manager_setup& setup) {
  return sys.spawn(kv_manager_behavior, setup);
}

}  // namespace troupe

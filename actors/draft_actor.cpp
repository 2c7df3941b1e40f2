#include "actors/draft_actor.hpp"

#include <memory>
#include <optional>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"
#include "actors/wire/draft_codec.hpp"
#include "engine/forward/kv_cache_type.hpp"
#include "engine/speculative/draft_exchange.hpp"
#include "engine/speculative/model_proposer.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

namespace {

struct draft_state {
  static inline const char* name = "troupe.draft";
  wire::draft_limits limits;
  int32_t vocab = 0;
  std::unique_ptr<thread_pool> pool;
  std::optional<draft_server> server;
};

using self_ptr = caf::stateful_actor<draft_state>*;

std::unique_ptr<proposer> make_proposer(const draft_setup& s, thread_pool& pool) {
  const auto blocks = static_cast<int32_t>(s.kv.num_blocks);
  if (s.spec.method == spec_method::early_exit)
    return std::make_unique<model_proposer>(*s.m, s.spec.exit_layer_for(s.m->config.num_layers), blocks, s.kv.block_size,
                                            s.kv.cache_type.value_or(kv_cache_type_for(*s.m)), pool);
  return std::make_unique<model_proposer>(*s.m, blocks, s.kv.block_size, kv_cache_type_for(*s.m), pool);
}

caf::behavior draft_behavior(self_ptr self, draft_setup setup) {
  auto& st = self->state;
  st.vocab = setup.m->config.vocab_size;
  st.limits.num_blocks = setup.kv.num_blocks;
  st.limits.block_size = setup.kv.block_size;
  st.limits.context = setup.context;
  st.limits.vocab = st.vocab;
  st.pool = std::make_unique<thread_pool>(std::max(1, setup.threads));
  st.server.emplace(make_proposer(setup, *st.pool));
  return {
      [self](draft_atom, const wire_message& msg) {
        auto& st = self->state;
        if (!msg.bytes) return wire_message(wire_kind::drafts, wire::encode_draft_refusal("an empty order"));
        auto order = wire::decode_draft_order(*msg.bytes, st.limits);
        if (!order) return wire_message(wire_kind::drafts, wire::encode_draft_refusal(order.err().message));
        return wire_message(wire_kind::drafts, wire::encode_drafts(st.server->serve(*order), st.vocab));
      },
  };
}

}  // namespace

caf::actor spawn_draft(caf::actor_system& sys, const draft_setup& setup) {
  // It computes for as long as a step's drafts take: on a thread of its own.
  return sys.spawn<caf::detached>(draft_behavior, setup);
}

}  // namespace troupe

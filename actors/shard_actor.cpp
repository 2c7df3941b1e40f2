#include "actors/shard_actor.hpp"

#include <cstdio>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"
#include "actors/wire/activations_codec.hpp"

namespace troupe {

namespace {

struct shard_state {
  static inline const char* name = "troupe.shard";

  shard_setup setup;
  std::unique_ptr<thread_pool> pool;
  std::unique_ptr<kv_cache> cache;
  no_collective solo;
  std::unique_ptr<forward_shard> shard;
  std::unique_ptr<wire::step_decoder> decoder;
  aligned_vector<float> hidden, logits;
};

caf::behavior shard_behavior(caf::stateful_actor<shard_state>* self, shard_setup setup) {
  auto& st = self->state;
  st.setup = setup;
  const model_config& c = setup.m->config;
  if (setup.device == "cpu") {
    st.pool = std::make_unique<thread_pool>(setup.threads);
    st.cache = std::make_unique<kv_cache>(transformer_shard::cache_shape(c, setup.spec, static_cast<int32_t>(setup.num_blocks),
                                                                         setup.block_size, transformer_shard::kv_type_for(*setup.m)));
    collective& comm = setup.group ? setup.group->member(setup.spec.tp.rank) : static_cast<collective&>(st.solo);
    st.shard = std::make_unique<transformer_shard>(*setup.m, setup.spec, *st.cache, *st.pool, comm);
  } else {
    // The node checked the device before spawning; a failure here ends the actor (and its
    // stage), and the node agent tries again later.
    cuda_shard_options o;
    auto index = cuda_device_index(setup.device);
    o.device = index ? *index : -1;
    o.weights = setup.gpu_weights;
    o.num_blocks = static_cast<int32_t>(setup.num_blocks);
    o.block_size = setup.block_size;
    o.max_step_tokens = setup.max_step_tokens;
    auto made = make_cuda_shard(*setup.m, setup.spec, o);
    if (!made) {
      std::fprintf(stderr, "troupe: shard on %s: %s\n", setup.device.c_str(), made.err().message.c_str());
      self->quit(caf::exit_reason::user_shutdown);
      return {};
    }
    st.shard = std::move(made).value();
  }
  wire::step_limits lim;
  lim.vocab = c.vocab_size;
  lim.context = c.max_seq_len;
  lim.num_blocks = setup.num_blocks;
  lim.block_size = setup.block_size;
  lim.max_step_tokens = setup.max_step_tokens;
  st.decoder = std::make_unique<wire::step_decoder>(lim);
  return {
      [self](step_atom, const wire_message& plan, const wire_message& act) -> caf::result<wire_message> {
        auto& st = self->state;
        const model_config& c = st.setup.m->config;
        if (plan.kind != wire_kind::step_plan || !plan.bytes)
          return caf::make_error(caf::sec::invalid_argument, "shard: expected a step plan");
        auto step = st.decoder->decode(*plan.bytes);
        if (!step) return caf::make_error(caf::sec::invalid_argument, "shard: " + step.err().message);
        const int32_t n = step->batch.num_tokens();
        st.hidden.resize(static_cast<size_t>(n) * c.dim);
        if (!st.shard->is_first_stage()) {
          if (act.kind != wire_kind::activations || !act.bytes)
            return caf::make_error(caf::sec::invalid_argument, "shard: expected activations");
          auto in = wire::decode_activations(*act.bytes, c.dim, st.setup.max_step_tokens);
          if (!in) return caf::make_error(caf::sec::invalid_argument, "shard: " + in.err().message);
          if (in->num_tokens != n) return caf::make_error(caf::sec::invalid_argument, "shard: activations do not match the plan");
          std::copy(in->data.begin(), in->data.end(), st.hidden.begin());
        }
        const bool head = st.shard->is_last_stage() && st.shard->spec().tp.rank == 0;
        const int32_t rows = step->batch.num_logits();
        st.logits.resize(static_cast<size_t>(rows) * c.vocab_size);
        try {
          st.shard->forward(step->batch, st.hidden.data(), head ? st.logits.data() : nullptr);
        } catch (const collective_aborted& e) {
          // A peer died mid-step: this shard's stage is gone too; end quietly.
          self->quit(caf::exit_reason::user_shutdown);
          return caf::make_error(caf::sec::runtime_error, e.what());
        }
        if (head) return wire_message(wire_kind::activations, wire::encode_activations(step->step_id, rows, c.vocab_size, st.logits.data()));
        if (st.shard->is_last_stage()) return wire_message{};
        return wire_message(wire_kind::activations, wire::encode_activations(step->step_id, n, c.dim, st.hidden.data()));
      },
  };
}

}  // namespace

caf::actor spawn_shard(caf::actor_system& sys, const shard_setup& setup) {
  // Shards of a TP group wait for each other inside all_reduce, and a GPU shard waits for
  // its device: each needs a thread of its own. A lone CPU shard runs on CAF's workers (no
  // thread wake-up per step).
  if (setup.group || setup.device != "cpu") return sys.spawn<caf::detached>(shard_behavior, setup);
  return sys.spawn(shard_behavior, setup);
}

}  // namespace troupe

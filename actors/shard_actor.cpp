#include "actors/shard_actor.hpp"

#include <cstdio>
#include <mutex>

#include <caf/all.hpp>

#include "actors/caf/errors.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/step_link.hpp"
#include "actors/wire/activations_codec.hpp"
#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/kv_cache_type.hpp"
#include "engine/forward/shard_tiers.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {

namespace {

// What a step needs, shared by the actor and its step link (whose thread runs steps while
// the scheduler sends them that way): one step at a time, under `mutex`.
struct shard_core {
  shard_setup setup;
  std::unique_ptr<thread_pool> pool;
  std::unique_ptr<kv_cache> cache;
  no_collective solo;
  std::unique_ptr<forward_shard> shard;
  std::unique_ptr<shard_tiers> tiers;  // KV tiers, when the replica has some
  std::unique_ptr<shard_push> push;    // a prefill replica's: blocks to decode replicas
  std::unique_ptr<kv_landing> landing; // a decode replica's: blocks from prefill replicas
  std::unique_ptr<wire::step_decoder> decoder;
  aligned_vector<float> hidden, logits;
  std::vector<float> features;  // the rows of `hidden` the plan asked for
  std::vector<int32_t> chosen;
  std::vector<wire::chosen_token> tokens;
  sample_scratch scratch;
  std::mutex mutex;

  // This stage's output for one step; collective_aborted escapes (a TP peer died).
  expected<wire_message> step(const wire_message& plan, const wire_message& act) {
    std::lock_guard<std::mutex> lock(mutex);
    const model_config& c = setup.m->config;
    if (plan.kind != wire_kind::step_plan || !plan.bytes) return error{"shard: expected a step plan"};
    auto decoded = decoder->decode(*plan.bytes);
    if (!decoded) return error{"shard: " + decoded.err().message};
    const int32_t n = decoded->batch.num_tokens();
    hidden.resize(static_cast<size_t>(n) * c.dim);
    std::vector<request_id> failed;  // KV tiers: loads that failed, here or before
    if (!shard->is_first_stage() && act.kind == wire_kind::linked_activations) {
      auto sent = act.bytes ? wire::decode_linked_activations(*act.bytes, c.dim, setup.max_step_tokens,
                                                              static_cast<int64_t>(decoded->attention.size()))
                            : expected<wire::decoded_activations>(error{"an empty frame"});
      if (!sent) return error{"shard: " + sent.err().message};
      if (sent->num_tokens != n || sent->step_id != decoded->step_id) return error{"shard: linked activations do not match the plan"};
      if (!shard->take_next_input_from_link())
        return error{"shard: activations came over a device link this shard does not have"};
      std::copy(sent->attention.begin(), sent->attention.end(), decoded->attention.begin());
      failed = std::move(sent->failed_loads);
    } else if (!shard->is_first_stage()) {
      if (act.kind != wire_kind::activations || !act.bytes) return error{"shard: expected activations"};
      auto sent = wire::decode_activations(*act.bytes, c.dim, setup.max_step_tokens,
                                           static_cast<int64_t>(decoded->attention.size()));
      if (!sent) return error{"shard: " + sent.err().message};
      if (sent->num_tokens != n) return error{"shard: activations do not match the plan"};
      std::copy(sent->data.begin(), sent->data.end(), hidden.begin());
      // The earlier stages' attention sums: this stage's layers add theirs.
      std::copy(sent->attention.begin(), sent->attention.end(), decoded->attention.begin());
      failed = std::move(sent->failed_loads);
    }
    load_blocks(*decoded, failed);
    const bool head = shard->is_last_stage() && shard->spec().tp.rank == 0;
    const int32_t rows = decoded->batch.num_logits();
    if (head && rows > 0 && static_cast<int32_t>(decoded->choices.size()) == rows) return choose(*decoded, failed);
    logits.resize(static_cast<size_t>(rows) * c.vocab_size);
    shard->forward(decoded->batch, hidden.data(), head ? logits.data() : nullptr);
    save_blocks(*decoded, failed);
    const auto& attention = decoded->attention;
    if (head)
      return wire_message(wire_kind::activations, wire::encode_activations(decoded->step_id, rows, c.vocab_size, logits.data(),
                                                                           attention, failed, gather_features(*decoded)));
    if (shard->is_last_stage()) return wire_message{};
    if (shard->has_link(link_side::output))
      return wire_message(wire_kind::linked_activations,
                          wire::encode_linked_activations(decoded->step_id, n, c.dim, attention));
    return wire_message(wire_kind::activations,
                        wire::encode_activations(decoded->step_id, n, c.dim, hidden.data(), attention, failed));
  }

  // The last layer's output (before the final norm) of the rows the plan asked for, which
  // a CPU shard's forward pass leaves in `hidden`.
  std::span<const float> gather_features(const wire::decoded_step& d) {
    const auto dim = static_cast<size_t>(setup.m->config.dim);
    features.clear();
    for (int32_t r : d.feature_rows)
      features.insert(features.end(), hidden.begin() + static_cast<ptrdiff_t>(r * dim),
                      hidden.begin() + static_cast<ptrdiff_t>((r + 1) * dim));
    return features;
  }

  // KV tiers, before the forward pass: the plan's loads of requests whose loads have not
  // failed already join `failed` if they fail here (every one, without tiers here). With
  // tensor parallelism the stage's shards pool theirs.
  void load_blocks(const wire::decoded_step& d, std::vector<request_id>& failed) {
    if (tiers) tiers->prefetch(d.tier_prefetch);
    if (d.tier_loads.empty()) return;
    std::vector<tier_move> loads;
    for (const tier_move& m : d.tier_loads)
      if (std::find(failed.begin(), failed.end(), m.id) == failed.end()) loads.push_back(m);
    std::vector<request_id> here;
    if (tiers) {
      here = tiers->load(loads);
    } else {
      for (const tier_move& m : loads)
        if (std::find(here.begin(), here.end(), m.id) == here.end()) here.push_back(m.id);
    }
    failed.insert(failed.end(), here.begin(), here.end());
    if (setup.failures) setup.failures->add(d.step_id, failed);
  }

  // KV tiers, after the forward pass: the plan's saves, but for requests whose loads
  // failed (in any shard of the stage).
  void save_blocks(const wire::decoded_step& d, std::vector<request_id>& failed) {
    if (setup.failures && !d.tier_loads.empty()) failed = setup.failures->take(d.step_id);
    if (tiers && !d.tier_saves.empty()) tiers->save(d.tier_saves, failed);
    if (push && !d.kv_pushes.empty()) push->push(d.kv_pushes, failed);
  }

  // Joins the device link `msg` invites this shard into (as the sender, or a receiver),
  // waiting until every rank has connected.
  status join_link(link_side side, const wire_message& msg) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!shard) return error{"not yet connected to its tensor-parallel group"};
    auto invite = read_nccl_invite(msg);
    if (!invite) return invite.err();
    auto group = nccl_group::join(invite->size, invite->id);
    if (!group) return group.err();
    return shard->connect_link(side, *group, invite->rank);
  }

  // The last stage's head, when every sampled row asks it to choose: the shard chooses
  // where its logits are (a GPU shard on the device), else they come here and the same
  // definition picks each token; only the tokens go back.
  wire_message choose(const wire::decoded_step& d, std::vector<request_id>& failed) {
    const int32_t vocab = setup.m->config.vocab_size;
    const auto rows = static_cast<int32_t>(d.choices.size());
    chosen.resize(rows);
    // (Features are read from `hidden`, where a forward pass on the host leaves them.)
    if (!d.feature_rows.empty() || !shard->forward_choose(d.batch, hidden.data(), d.choices.data(), chosen.data())) {
      logits.resize(static_cast<size_t>(rows) * vocab);
      shard->forward(d.batch, hidden.data(), logits.data());
      for (int32_t r = 0; r < rows; ++r)
        chosen[r] = troupe::choose(logits.data() + static_cast<size_t>(r) * vocab, vocab, d.choices[r], scratch);
    }
    save_blocks(d, failed);
    tokens.clear();
    for (int32_t r = 0; r < rows; ++r) tokens.push_back({d.chosen_ids[r], chosen[r]});
    return wire_message(wire_kind::step_result,
                        wire::encode_step_result(d.step_id, tokens, d.attention, failed, gather_features(d)));
  }
};

struct shard_state {
  static inline const char* name = "troupe.shard";
  std::shared_ptr<shard_core> core;
  // Last, so that it goes first: its thread may be running a step on `core`.
  std::unique_ptr<step_link_server> link;
};

using shard_ptr = caf::stateful_actor<shard_state>*;

// A GPU shard of a tensor-parallel stage over NCCL builds when its stage's invitation
// arrives (the group's id, in a message); any other shard builds at once.
bool awaits_invite(const shard_setup& s) { return s.device != "cpu" && s.spec.tp.size > 1 && !s.group; }

// Builds a GPU shard into the actor's core. A failure ends the actor (and its stage: the
// node agent tries again later) after aborting `group`, whose other ranks would wait for
// this one.
bool build_gpu_shard(shard_ptr self, std::shared_ptr<nccl_group> group) {
  shard_core& st = *self->state.core;
  const shard_setup& setup = st.setup;
  cuda_shard_options o;
  auto index = cuda_device_index(setup.device);
  o.device = index ? *index : -1;
  o.weights = setup.gpu_weights;
  o.num_blocks = static_cast<int32_t>(setup.kv.num_blocks);
  o.block_size = setup.kv.block_size;
  o.max_step_tokens = setup.max_step_tokens;
  o.tp_group = group;
  o.host_group = setup.group;
  auto made = make_cuda_shard(*setup.m, setup.spec, o);
  if (!made) {
    if (group) group->abort();
    std::fprintf(stderr, "troupe: shard on %s: %s\n", setup.device.c_str(), made.err().message.c_str());
    self->quit(caf::exit_reason::user_shutdown);
    return false;
  }
  st.shard = std::move(made).value();
  return true;
}

// The stage's invitation into its NCCL group: checked against this shard's place, joined,
// and the shard built (connecting to its peers).
caf::result<void> accept_invite(shard_ptr self, const wire_message& msg) {
  shard_core& st = *self->state.core;
  if (!awaits_invite(st.setup)) return make_error(error_code::invalid, "this shard joins no NCCL group");
  if (st.shard) return make_error(error_code::invalid, "this shard has joined its group already");
  auto invite = read_nccl_invite(msg);
  if (!invite) return make_error(error_code::invalid, "shard: " + invite.err().message);
  const tp_slice& place = st.setup.spec.tp;
  if (invite->size != place.size || invite->rank != place.rank)
    return make_error(error_code::invalid, "shard: invited as rank " + std::to_string(invite->rank) + " of " +
                                                           std::to_string(invite->size) + ", but this shard is rank " +
                                                           std::to_string(place.rank) + " of " + std::to_string(place.size));
  auto group = nccl_group::join(invite->size, invite->id);
  if (!group) return make_error(error_code::broken, "shard: " + group.err().message);
  if (!build_gpu_shard(self, *group)) return make_error(error_code::internal, "shard: could not be built");
  return caf::unit;
}

caf::result<void> link(shard_ptr self, link_side side, const wire_message& invite) {
  const shard_setup& s = self->state.core->setup;
  auto joined = self->state.core->join_link(side, invite);
  if (!joined) {
    std::fprintf(stderr, "troupe: shard on %s, layers %d-%d: no device link %s: %s\n", s.device.c_str(), s.spec.first_layer,
                 s.spec.end_layer - 1,
                 side == link_side::input ? "from the previous stage" : "to the next stage", joined.err().message.c_str());
    return make_error(error_code::broken, joined.err().message);
  }
  return caf::unit;
}

caf::behavior shard_behavior(shard_ptr self, shard_setup setup) {
  self->state.core = std::make_shared<shard_core>();
  shard_core& st = *self->state.core;
  st.setup = setup;
  const model_config& c = setup.m->config;
  if (setup.device == "cpu") {
    st.pool = std::make_unique<thread_pool>(setup.threads);
    st.cache = std::make_unique<kv_cache>(transformer_shard::cache_shape(c, setup.spec, static_cast<int32_t>(setup.kv.num_blocks),
                                                                         setup.kv.block_size,
                                                                         setup.kv.cache_type.value_or(kv_cache_type_for(*setup.m))));
    collective& comm = setup.group ? setup.group->member(setup.spec.tp.rank) : static_cast<collective&>(st.solo);
    st.shard = std::make_unique<transformer_shard>(*setup.m, setup.spec, *st.cache, *st.pool, comm);
    if (!setup.kv.tiers.empty()) {
      // A tier that cannot be opened leaves this shard without tiers: its loads fail, and
      // their requests are computed instead.
      auto t = shard_tiers::open(setup.kv.tiers, *setup.m, setup.spec, *st.cache, setup.meter);
      if (t)
        st.tiers = std::move(t).value();
      else
        std::fprintf(stderr, "troupe: shard of layers %d-%d: no KV tiers: %s\n", setup.spec.first_layer,
                     setup.spec.end_layer - 1, t.err().message.c_str());
    }
    // Disaggregation. Without a landing, handed-over requests compute their prompts here.
    if (setup.kv_listen_port != 0 && st.tiers) {
      auto l = kv_landing::start(setup.kv_listen_host, setup.kv_listen_port, st.tiers->prefix(), st.tiers->shared_tiers(),
                                 setup.links);
      if (l)
        st.landing = std::move(l).value();
      else
        std::fprintf(stderr, "troupe: shard of layers %d-%d: takes no KV from prefill replicas: %s\n",
                     setup.spec.first_layer, setup.spec.end_layer - 1, l.err().message.c_str());
    }
    if (!setup.kv_peers.empty())
      st.push = std::make_unique<shard_push>(tier_prefix(*setup.m, setup.spec, st.cache->shape()), *st.cache, setup.kv_peers);
  } else if (!awaits_invite(setup)) {
    if (!build_gpu_shard(self, nullptr)) return {};
  }
  wire::step_limits lim;
  lim.vocab = c.vocab_size;
  lim.context = c.max_seq_len;
  lim.num_blocks = setup.kv.num_blocks;
  lim.block_size = setup.kv.block_size;
  lim.max_step_tokens = setup.max_step_tokens;
  st.decoder = std::make_unique<wire::step_decoder>(lim);
  return {
      [self](step_atom, const wire_message& plan, const wire_message& act) -> caf::result<wire_message> {
        if (!self->state.core->shard)
          return make_error(error_code::unavailable, "shard: not yet connected to its tensor-parallel group");
        try {
          auto out = self->state.core->step(plan, act);
          if (!out) return make_error(error_code::invalid, out.err().message);
          return std::move(out).value();
        } catch (const collective_aborted& e) {
          // A peer died mid-step: this shard's stage is gone too; end quietly.
          self->quit(caf::exit_reason::user_shutdown);
          return make_error(error_code::broken, e.what());
        } catch (const device_link_broken& e) {
          // The step is lost (the scheduler recovers), the shard is not; its link is gone.
          return make_error(error_code::broken, e.what());
        }
      },
      // Device links to the neighbouring stages (stage_actor.hpp): joined on this thread,
      // which waits for the other ranks. A link that cannot be made leaves the activations
      // on the host path.
      [self](link_out_atom, const wire_message& invite) -> caf::result<void> { return link(self, link_side::output, invite); },
      [self](link_in_atom, const wire_message& invite) -> caf::result<void> { return link(self, link_side::input, invite); },
      [self](connect_atom, const wire_message& invite) -> caf::result<void> { return accept_invite(self, invite); },
      // The port of this shard's step link, opened on first asking. Only a lone CPU shard
      // of a node that names its host has one (a TP shard steps with its peers, a GPU
      // shard on its own thread).
      [self](link_atom) -> caf::result<uint16_t> {
        auto& st = self->state;
        const shard_setup& s = st.core->setup;
        if (s.link_host.empty() || s.group || s.device != "cpu")
          return make_error(error_code::disabled, "this shard has no step link");
        if (!st.link) {
          auto server = step_link_server::start(
              s.link_host, [core = st.core](const wire_message& plan, const wire_message& act) { return core->step(plan, act); },
              s.link_ports, process_link_guard(), s.links);
          if (!server) return make_error(error_code::internal, server.err().message);
          st.link = std::move(server).value();
          std::fprintf(stderr, "troupe: step link for layers %d-%d on %s:%u\n", s.spec.first_layer, s.spec.end_layer - 1,
                       s.link_host.c_str(), static_cast<unsigned>(st.link->port()));
        }
        return st.link->port();
      },
  };
}

}  // namespace

expected<wire::nccl_invite> read_nccl_invite(const wire_message& msg) {
  if (msg.kind != wire_kind::nccl_invite || !msg.bytes) return error{"expected an NCCL invitation"};
  return wire::decode_nccl_invite(*msg.bytes);
}

caf::actor spawn_shard(caf::actor_system& sys, const shard_setup& setup) {
  // Shards of a TP group wait for each other inside all_reduce, and a GPU shard waits for
  // its device: each needs a thread of its own. A lone CPU shard runs on CAF's workers (no
  // thread wake-up per step).
  if (setup.group || setup.device != "cpu") return sys.spawn<caf::detached>(shard_behavior, setup);
  return sys.spawn(shard_behavior, setup);
}

}  // namespace troupe

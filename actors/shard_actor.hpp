// shard_actor: one tensor-parallel slice of one pipeline stage's layers, as an actor. Its
// state owns the engine objects (transformer_shard, kv_cache, thread pool) and a
// step_decoder that rebuilds each step's batch from the scheduler's plan.
//
//   (step_atom, plan, activations) -> activations out
//
//   (link_atom) -> port of a step link (actors/step_link.hpp) serving the same steps
//
//   (connect_atom, invite) -> () once this GPU shard has joined its stage's NCCL group
//
//   (link_out_atom, invite), (link_in_atom, invite) -> () once this GPU shard has joined a
//   device link to the next stage (as its sender, rank 0) or from the previous one (as a
//   receiver)
//
// invite is an NcclInvite frame (actors/wire/control_codec.hpp): the group's id, size and
// this shard's rank, which for its stage's group must be the shard's own. A GPU shard of a
// stage split over NCCL builds only then (connecting to its peers); until then it refuses
// steps. A shard that cannot be built ends, after aborting the group so that its peers
// stop waiting for it. A link that cannot be joined leaves the shard on the host path.
//
// With KV tiers (kv.tiers, CPU shards only), a step first fills the blocks its plan loads
// (engine/forward/shard_tiers.hpp), and after its forward pass copies down those it saves;
// the requests whose loads failed, here or in an earlier stage, travel on with the output.
//
// plan is a StepPlan frame; activations is the previous stage's hidden states (ignored by
// the first stage), or a linked_activations frame when they came over the device link.
// The reply is this stage's hidden states (linked_activations when sent over a link), or,
// from rank 0 of the last
// stage, the tokens it chose (a StepResult, when the plan asks it to choose every sampled
// row) or the logits of the sampled rows ([num_samples][vocab]); other ranks of the last
// stage reply with an empty message. Shards of a stage all-reduce through the stage's
// local collective, so they are spawned detached (each on its own thread).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/caf/wire_message.hpp"
#include "actors/wire/control_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "engine/forward/nccl_group.hpp"
#include "engine/forward/shard_push.hpp"
#include "engine/forward/tier_failures.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "engine/kv/kv_config.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

struct shard_setup {
  const model* m = nullptr;
  shard_spec spec;
  // The stage's all-reduce when TP > 1: CPU shards use `group`, and so do GPU shards
  // (through host memory) where NCCL cannot be loaded; otherwise GPU shards wait for their
  // stage's invitation into its NCCL group (connect_atom).
  std::shared_ptr<local_collective_group> group;
  kv_config kv;                     // its cache: blocks, their size, and (on the CPU) type
  int32_t threads = 1;
  int32_t max_step_tokens = 512;
  std::string device = "cpu";       // or "cuda:N"
  dtype gpu_weights = dtype::bf16;  // what a GPU shard keeps its weights as
  std::string link_host;            // where a step link listens (empty: no link)
  tcp::port_range link_ports;       // on which port (any, by default)
  // KV tiers (kv.tiers) on a tensor-parallel stage: where its shards' failed loads meet.
  std::shared_ptr<tier_failures> failures;
  std::shared_ptr<tier_meter> meter;  // where its tiers' figures are counted (the node's)
  std::shared_ptr<link_meter> links;  // where its step link and KV landing count their peers' faults (the node's)
  // Disaggregation (engine/forward/shard_push.hpp), CPU shards: a decode replica's shard
  // takes blocks on kv_listen (port 0: it does not) into its first tier; a prefill
  // replica's sends them to its counterparts in kv_peers.
  std::string kv_listen_host;
  uint16_t kv_listen_port = 0;
  std::vector<kv_peer> kv_peers;
};

caf::actor spawn_shard(caf::actor_system& sys, const shard_setup& setup);

// An NcclInvite message's contents, or why the message is not one (the shards' and the
// stages' handlers read invitations with it).
expected<wire::nccl_invite> read_nccl_invite(const wire_message& msg);

}  // namespace troupe

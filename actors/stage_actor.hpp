// stage_actor: one pipeline stage: a layer range run by its tensor-parallel shards. It
// fans each step out to its shards and answers with rank 0's output (after the all-reduce
// every rank holds the same hidden states; from the last stage, the chosen tokens or the
// logits of the sampled rows). The scheduler carries each step from stage to stage, so a
// restarted stage only has to be found again, never re-linked to its neighbours.
//
//   (step_atom, plan, activations) -> this stage's output
//   (link_atom) -> the port of its lone shard's step link (actors/step_link.hpp)
//
// Device links between neighbouring GPU stages of one node (hidden states over NCCL; the
// scheduler sets them up, in this order):
//
//   (link_in_atom) -> invite      draws an input link; the invitation is for the sender
//   (link_out_atom, invite) -> () joins it: rank 0 sends its output there (same host only)
//   (link_in_atom, invite) -> ()  its shards join as the receivers
//   (unlink_atom)                 ends both links (shards drop them before their next step)
//
// A CPU stage refuses the first two with error_code::disabled, as does a stage on another
// host than the invitation's.
//
// A stage and its shards are one failure unit: they are linked, and a shard that dies
// takes the stage with it (after releasing its peers from the all-reduce). Shards on the
// CPU all-reduce through a local collective, shards on GPUs through an NCCL group
// (engine/forward/nccl_group.hpp) that the stage creates and invites each shard into
// with a message carrying its id, or, where NCCL cannot be loaded, through the local
// collective in host memory (with a warning: it is slow).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/forward/collective.hpp"
#include "engine/kv/kv_config.hpp"
#include "engine/kv/kv_tiers.hpp"
#include "engine/util/link_meter.hpp"
#include "engine/forward/nccl_group.hpp"
#include "engine/forward/shard_push.hpp"
#include "engine/model/model.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

struct stage_layout {
  int32_t first_layer = 0;
  int32_t end_layer = 0;  // exclusive
  int32_t tp = 1;
  int32_t threads_per_shard = 1;
  std::vector<std::string> devices = {};  // per shard: "cpu" (the default) or "cuda:N"
  dtype gpu_weights = dtype::bf16;
  std::string link_host = {};  // the node's host, where a lone CPU shard offers a step link
  tcp::port_range link_ports = {};  // the node's ports for links (any, by default)
  kv_config kv = {};           // each shard's cache (the replica's, carried whole)
  std::shared_ptr<tier_meter> meter = {};  // KV tiers: the node's figures, if counted
  std::shared_ptr<link_meter> links = {};  // its step links' and KV landings' peers, if counted
  int32_t max_step_tokens = 512;
  // Disaggregation: shard r of a decode replica's stage takes KV blocks on
  // kv_listen_port + r (0: none); shard r of a prefill replica's sends them to each
  // peer's port + r (the peers' stages have the same layers and tensor-parallel size).
  std::string kv_listen_host = {};
  uint16_t kv_listen_port = 0;
  std::vector<kv_peer> kv_peers = {};
};

struct stage_group {
  caf::actor stage;
  std::vector<caf::actor> shards;
  std::shared_ptr<local_collective_group> group;  // when tp > 1 on the CPU, or on GPUs without NCCL
  std::shared_ptr<nccl_group> gpu_group;        // when tp > 1 on GPUs, over NCCL
};

stage_group spawn_stage_group(caf::actor_system& sys, const model& m, const stage_layout& layout);

}  // namespace troupe

// control_codec: node agents' health reports (schema/control.capnp NodeHealth: every
// supervised actor of a node process, alive or not, and how often it was restarted), and
// the NCCL group a stage's GPU shards connect to (NcclInvite).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/forward/nccl_group.hpp"
#include "engine/kv/kv_tiers.hpp"
#include "engine/util/expected.hpp"
#include "engine/util/link_meter.hpp"

namespace troupe::wire {

enum class actor_kind : uint8_t { gateway, scheduler, kv_manager, stage, shard, node_agent, draft };
const char* actor_kind_name(actor_kind k);

struct actor_status {
  std::string name;
  actor_kind kind = actor_kind::stage;
  bool alive = false;
  uint32_t restarts = 0;
};

struct tier_figures {
  std::string kind;
  tier_stats stats;
};

struct link_figures {
  link_kind kind = link_kind::step;
  link_counts counts;
};

struct node_health {
  std::string node;
  uint32_t pid = 0;
  std::vector<actor_status> actors;
  bool ready = false;  // every supervised actor is alive
  std::vector<tier_figures> tiers;  // the process's KV tiers, by kind
  std::vector<link_figures> links;  // what its own listeners saw of their peers, by kind
};

std::vector<uint8_t> encode_node_health(const node_health& h);
expected<node_health> decode_node_health(std::span<const uint8_t> bytes);

// One rank's invitation into an NCCL group of GPU shards (a tensor-parallel stage, or a
// device link between stages).
struct nccl_invite {
  nccl_unique_id id;
  int32_t size = 0;
  int32_t rank = 0;
  std::string node;  // device links: the host the group was drawn on (at most 255 bytes)
};

inline constexpr int32_t max_nccl_group_size = 256;

std::vector<uint8_t> encode_nccl_invite(const nccl_invite& g);
// Refuses an id that is not exactly 128 bytes, a size outside [1, max_nccl_group_size], a
// rank outside the group and a node name over 255 bytes.
expected<nccl_invite> decode_nccl_invite(std::span<const uint8_t> bytes);

}  // namespace troupe::wire

// control_codec: node agents' health reports (schema/control.capnp NodeHealth): every
// supervised actor of a node process, alive or not, and how often it was restarted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/util/expected.hpp"

namespace troupe::wire {

enum class actor_kind : uint8_t { gateway, scheduler, kv_manager, stage, shard, node_agent };
const char* actor_kind_name(actor_kind k);

struct actor_status {
  std::string name;
  actor_kind kind = actor_kind::stage;
  bool alive = false;
  uint32_t restarts = 0;
};

struct node_health {
  std::string node;
  uint32_t pid = 0;
  std::vector<actor_status> actors;
  bool ready = false;  // every supervised actor is alive
};

std::vector<uint8_t> encode_node_health(const node_health& h);
expected<node_health> decode_node_health(std::span<const uint8_t> bytes);

}  // namespace troupe::wire

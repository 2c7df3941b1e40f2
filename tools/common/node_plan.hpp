// node_plan: what one node process of a topology runs, worked out before anything starts,
// from the topology, the model and the node's name alone: the stages placed on it (each
// shard's layout), the replicas whose scheduler and kv manager it keeps, and on the
// gateway's node the router's view of every replica and node and both client endpoints'
// settings. troupe-node only wires these together; tests check the plan of every
// topology in deploy/ without starting anything.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/caf/system_config.hpp"
#include "actors/draft_actor.hpp"
#include "actors/gateway/http_gateway.hpp"
#include "actors/gateway/rpc_gateway.hpp"
#include "actors/kv_manager_actor.hpp"
#include "actors/router_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/stage_actor.hpp"
#include "engine/util/expected.hpp"
#include "tools/common/topology.hpp"

namespace troupe::tools {

struct stage_placement {
  std::string replica;
  size_t index = 0;     // in the replica's pipeline
  stage_layout layout;  // its shards: layers, devices, threads, cache
};

// A replica whose scheduler and kv manager run on this node. The setup's agent is the
// node's, filled in when the scheduler is spawned.
struct scheduler_placement {
  std::string replica;
  scheduler_setup setup;
  kv_manager_setup kv;
};

// A replica's draft actor on this node (speculative decoding by a draft model or early
// exit). Its setup's model is the draft passed to plan_node, or the target.
struct draft_placement {
  std::string replica;
  draft_setup setup;
};

struct gateway_plan {
  endpoint capnp_endpoint, http_endpoint;
  bool serve_http = false;
  // max_connections not set in the topology: each endpoint's from the open-file limit
  // (fit_connections_to_descriptors), 1024 until then.
  bool auto_connections = false;
  int index = 0;  // which of the deployment's gateways ([gateway] 0, [[gateway.also]] 1 on)
  rpc_limits rpc;
  http_config http;     // without keys, tokenizer or metrics, which the node adds
  router_setup router;  // its agent is the node's, filled in when it is spawned
};

struct node_plan {
  node_spec node;
  failure_detection failure;  // the middleman's heartbeats
  std::vector<stage_placement> stages;
  std::vector<scheduler_placement> schedulers;
  std::vector<draft_placement> drafts;
  std::optional<gateway_plan> gateway;  // on the gateway's node
  // The node of the next stage in the first pipeline whose next hop leaves this node: the
  // node reports its round trip there.
  std::optional<node_spec> next_hop;
};

// Where the node's flags put the client endpoints instead of the topology's.
struct endpoint_overrides {
  std::optional<endpoint> capnp, http;
};

// The plan of node `node` (an error when the topology has none by that name). draft: the
// model [speculative] draft names, loaded and checked (speculative_from), where the node
// runs a replica's draft actor and the method is draft; heads: the head file
// [speculative] heads names, loaded and checked, where the node runs a replica's scheduler
// and the method is medusa or eagle.
expected<node_plan> plan_node(const topology& t, const model& m, const tokenizer& tok, const std::string& node,
                              const endpoint_overrides& overrides = {}, const model* draft = nullptr,
                              std::shared_ptr<const speculative_heads> heads = nullptr);

}  // namespace troupe::tools

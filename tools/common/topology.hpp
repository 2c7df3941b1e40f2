// topology: one deployment, as an operator writes it in a TOML file under deploy/: the
// model, the client endpoints, the node processes, and the replicas, each a chain of
// pipeline stages whose devices are its tensor-parallel shards. Each table parses into the
// configuration of the component it sets (the format, every key with its default, is in
// docs/operations.md):
//
//   [model]       model_section     the checkpoint, its tokenizer, name and chat template
//   [gateway]     gateway_section   where clients connect, keys, connection limits
//   [kv]          kv_config         the KV cache, carried whole to scheduler, kv manager
//                                   and shards (engine/kv/kv_config.hpp); its eviction
//                                   keys (policy, budget, sinks, window, history) set
//                                   scheduler.eviction (engine/kv/kv_eviction.hpp)
//   [scheduler]   scheduler_config  step budget and batch size (engine/sched/scheduler.hpp)
//   [failure]     failure_config    heartbeats, recovery timeout, restarts
//   [gpu]         gpu_config        what GPU shards keep their weights in
//   [speculative] speculative_options  speculative decoding: method, k, draft, exit_layer
//   [tls]         tls_section       the cluster's CA and each node's certificate and key:
//                                   links between nodes mutually authenticated and encrypted
//   [[node]]      node_spec         one process
//   [[replica]]   replica_spec      one copy of the model: its stages
//
// Parsed and checked once, before anything starts. Every mistake, an unknown table or key
// included, is reported with the file and the line it is on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/kv/kv_config.hpp"
#include "engine/model/config.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/serve/request_router.hpp"
#include "engine/util/expected.hpp"
#include "engine/util/tcp.hpp"
#include "kernels/common/dtype.hpp"
#include "tools/common/speculative_options.hpp"

namespace troupe::tools {

struct endpoint {
  std::string host;
  uint16_t port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

struct model_section {
  std::string path;                   // the checkpoint (relative: to the topology's folder)
  std::string tokenizer;              // a llama2.c tokenizer.bin, for llama2.c checkpoints
  std::string name;                   // what HTTP clients pass as "model" (default: the file's stem)
  std::string chat_template = "auto";  // auto (the model's own) | raw | llama2 | chatml
};

// One of a deployment's gateway nodes: where it serves the client APIs.
struct gateway_place {
  std::string node;
  endpoint capnp;  // the Cap'n Proto endpoint
  endpoint http;   // the OpenAI-compatible HTTP endpoint (port 0: none)
};

struct gateway_section {
  std::string node;                       // the node process that serves clients
  endpoint capnp;                         // the Cap'n Proto endpoint
  endpoint http;                          // the OpenAI-compatible HTTP endpoint (port 0: none)
  std::string api_keys_file;              // one key a line; required off loopback
  std::vector<std::string> cors_origins;  // browser origins the HTTP API answers ("*": any)
  int32_t max_connections = 0;            // open at once, on each endpoint (0: as the open-file
                                          // limit allows, up to 65536 HTTP and 4096 Cap'n Proto)
  int32_t read_timeout_s = 30;            // for an HTTP request to arrive whole, a Cap'n Proto client to greet
  int32_t idle_timeout_s = 60;            // an HTTP keep-alive connection unused this long is closed
  std::string tls_cert, tls_key;          // the Cap'n Proto endpoint over TLS (PEM files; empty: plain)
  std::vector<gateway_place> also;        // more gateway nodes ([[gateway.also]]), each with
                                          // a router and both APIs, the settings above theirs

  // Every gateway node: the one above first, then those `also` names.
  std::vector<gateway_place> places() const {
    std::vector<gateway_place> all{{node, capnp, http}};
    all.insert(all.end(), also.begin(), also.end());
    return all;
  }
  // Which gateway `name` is (-1: none).
  int index_of(const std::string& name) const {
    const auto all = places();
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].node == name) return static_cast<int>(i);
    return -1;
  }
};

struct router_section {
  route_policy policy = route_policy::kv_aware;  // kv-aware | least-loaded
  double stream_tokens = 64;                     // kv-aware: a request's load beyond its
                                                 // prompt, in prompt tokens
};

struct failure_config {
  int32_t heartbeat_ms = 200;        // between nodes
  int32_t timeout_ms = 400;          // a silent peer is dropped after this
  int32_t recovery_timeout_s = 30;   // requests wait this long for a replica to recover
  bool restart = true;               // troupe-launch restarts a node process that dies
};

struct gpu_config {
  dtype weights = dtype::bf16;  // what shards on cuda:N keep their weights in: bf16, f16 or f32
};

// Links between nodes over TLS, each side showing a certificate that the cluster's CA
// signed (`troupe-launch certs TOPOLOGY` makes them all). Unset: plain TCP, for loopback
// and trusted networks.
struct tls_section {
  std::string ca;    // the cluster CA's certificate (PEM); its key (ca.key beside it) stays off the nodes
  std::string cert;  // each node's certificate (PEM), "{node}" standing for the node's name
  std::string key;   // each node's private key (PEM), likewise
  bool on() const { return !ca.empty(); }
  // The certificate troupe-launch shows when it reaches node agents (status --actors, chaos).
  static constexpr const char* operator_name = "troupe-launch";
  std::string cert_of(const std::string& node) const { return with_node(cert, node); }
  std::string key_of(const std::string& node) const { return with_node(key, node); }
  // ca.pem -> ca.key: where troupe-launch certs keeps the CA's key.
  std::string ca_key() const;

 private:
  static std::string with_node(std::string pattern, const std::string& node);
};

struct node_spec {
  std::string name;
  std::string host;
  uint16_t port = 0;    // its agent's, where the other nodes find it
  int32_t threads = 1;  // CPU threads for the shards it runs
  tcp::port_range link_ports;  // where its step links listen (link_ports = "A-B"; any port if unset)
  bool insecure_internal_ports = false;  // off loopback without [tls]: allowed (and warned of at every start)
};


struct stage_spec {
  std::string node;
  int32_t first_layer = 0;
  int32_t last_layer = 0;            // inclusive, as written; -1: through the model's last layer
                                     // (layers = "N-end" or "all")
  std::vector<std::string> devices;  // "cpu" or "cuda:N"; one per tensor-parallel shard
  uint16_t kv_port = 0;              // a decode replica's: shard r takes KV blocks from
                                     // prefill replicas on kv_port + r of its node's host
};

struct replica_spec {
  std::string name;
  std::vector<stage_spec> stages;
  std::string scheduler_node;  // where the replica's scheduler runs (default: its first stage's node)
  std::string draft_node;      // where its draft actor runs, with [speculative] method draft or
                               // early-exit (default: the scheduler's node, where orders and
                               // drafts cross no link)
  replica_role role = replica_role::both;  // prefill | decode | both
  int64_t num_blocks = 0;      // its KV pool (0: [kv] num_blocks)
  int64_t landing_mb = 1024;   // a decode replica's host memory for KV that prefill replicas
                               // sent (per shard; the first tier, added if [[tier]] has none)
};


struct topology {
  std::string path;  // the file it came from
  model_section model;
  gateway_section gateway;
  kv_config kv;
  scheduler_config scheduler;  // max_step_tokens, max_running and [kv]'s eviction; the rest is
                               // filled per replica
  failure_config failure;
  router_section router;
  gpu_config gpu;
  speculative_options speculative;  // the draft path is taken from the file's directory
  tls_section tls;
  std::vector<node_spec> nodes;
  std::vector<replica_spec> replicas;

  const node_spec* node_named(const std::string& name) const;
};

// A host only this machine reaches: localhost or 127.x.x.x.
bool loopback_host(const std::string& host);
// What a node says at every start when its internal ports are open to the network
// without [tls] (insecure_internal_ports); empty when they are not.
std::string insecure_ports_warning(const topology& t, const node_spec& n);

// A replica's KV settings: [kv] with its own pool size, and a decode replica's landing.
kv_config kv_of(const topology& t, const replica_spec& r);

// Reads and checks a topology file's structure (types, required fields, names, hosts,
// ports, layer syntax). Relative model paths are taken from the file's directory.
expected<topology> parse_topology(const std::string& path);
expected<topology> parse_topology_text(const std::string& text, const std::string& name,
                                       const std::string& base_dir);

// The exclusive end layer of a stage for a model of num_layers layers.
inline int32_t end_layer(const stage_spec& s, int32_t num_layers) {
  return s.last_layer < 0 ? num_layers : s.last_layer + 1;
}

// Checks the topology against the model it serves: layer ranges cover every layer once,
// in order, in each replica; tensor-parallel sizes divide the heads and FFN columns;
// [speculative] fits the model (its draft file is checked where it is loaded).
status validate_topology(const topology& t, const model_config& model, int32_t q8_group_size);

// What an operator should hear about a topology that is valid but limits its model: a KV
// cache that holds fewer tokens than the model's context (requests that outgrow it end
// early). Empty when there is nothing to say.
std::string topology_warnings(const topology& t, const model_config& model);

}  // namespace troupe::tools

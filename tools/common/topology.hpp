// topology: one deployment, as an operator writes it in a TOML file under deploy/: the
// model, the client endpoints, the node processes, and the replicas, each a chain of
// pipeline stages whose devices are its tensor-parallel shards.
//
//   [model]     path, tokenizer (for llama2.c files), name (what HTTP clients pass as
//               "model"; default: the file's stem), chat_template = auto (the
//               model's own, from GGUF metadata; raw without one) | raw | llama2 | chatml
//   [gateway]   node, capnp = "HOST:PORT", http = "HOST:PORT", api_keys_file (one key a
//               line; required when an endpoint is not on loopback), max_connections
//               (1024, on each endpoint: HTTP connections served at once, a thread each,
//               more wait; Cap'n Proto connections open at once, more are closed),
//               read_timeout_s (30: an HTTP request, head and body, must arrive within
//               it, or is answered 408 and its connection closed; a Cap'n Proto
//               connection must ask for the gateway within it, or is closed),
//               cors_origins (browser origins allowed to call the HTTP API, as
//               ["https://app.example"], or ["*"]; none by default)
//   [kv]        block_size, num_blocks, prefix_caching (true), prefix_cache_scope =
//               "key" (the default: cached prompt blocks serve only requests of the same
//               API key) | "all" (every request's), cache_type = "f32" |
//               "f16" | "q8_0" (what the shards keep K and V in; default: F32 for F32
//               weights, else F16, or TROUPE_KV_TYPE; q8_0 is int8 with a scale per
//               token and KV head, lossy)   (optional; a cache of fewer tokens than
//               the model's context is warned of when a node or troupe-launch starts)
//   [scheduler] max_step_tokens, max_running  (optional)
//   [[node]]    name, host, port, threads (optional)
//   [[replica]] name, stages = [ { node, layers = "FIRST-LAST", devices = ["cpu", ...] }, ... ],
//               scheduler = NODE (optional; default: the first stage's node)
//               (layers may also be "FIRST-end", or "all" for the whole model; a
//               stage's devices are all "cpu" or all distinct GPUs "cuda:N", one
//               tensor-parallel shard each: GPU shards all-reduce over NCCL, or through
//               host memory where libnccl.so.2 cannot be loaded; neighbouring GPU stages
//               on nodes of one host pass hidden states over NCCL too, a device link)
//   [gpu]       weights = "bf16" | "f16" | "f32": what shards on cuda:N devices keep
//               their weights as (bf16 by default; f32 for exact GEMMs)
//   [failure]   heartbeat_ms (200), timeout_ms (400: a silent peer is dropped after this,
//               so a hung node is noticed within timeout + heartbeat), recovery_timeout_s
//               (30: requests wait this long for a replica to recover), restart =
//               "always" | "never" (whether troupe-launch restarts a node that dies)
//
// Parsed and validated once, before anything starts: every mistake is reported with the
// file and the place it is in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/config.hpp"
#include "kernels/common/dtype.hpp"
#include "engine/util/expected.hpp"

namespace troupe::tools {

struct endpoint {
  std::string host;
  uint16_t port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

struct node_spec {
  std::string name;
  std::string host;
  uint16_t port = 0;
  int32_t threads = 1;
};

struct stage_spec {
  std::string node;
  int32_t first_layer = 0;
  int32_t last_layer = 0;            // inclusive, as written; -1: through the model's last layer
                                     // (layers = "N-end" or "all")
  std::vector<std::string> devices;  // "cpu" or "cuda:N"; one per tensor-parallel shard
};

struct replica_spec {
  std::string name;
  std::vector<stage_spec> stages;
  std::string scheduler_node;  // where the replica's scheduler runs
};
struct failure_spec {
  int32_t heartbeat_ms = 200;
  int32_t timeout_ms = 400;
  int32_t recovery_timeout_s = 30;
  bool restart = true;
};

struct topology {
  std::string path;  // the file it came from
  std::string model_path;
  std::string tokenizer_path;
  std::string model_name;
  std::string chat_template = "auto";
  std::string api_keys_file;
  std::string gateway_node;
  endpoint capnp;
  endpoint http;
  std::vector<std::string> cors_origins;  // browser origins the HTTP API answers ("*": any)
  int32_t max_connections = 1024;  // on each client endpoint, at once
  int32_t read_timeout_s = 30;     // for an HTTP request to arrive whole, a Cap'n Proto client to greet
  int32_t block_size = 16;
  int32_t num_blocks = 1024;
  bool prefix_caching = true;
  bool prefix_cache_per_key = true;  // cached prompts shared only among one API key's requests
  std::optional<dtype> kv_cache_type;  // none: the model's default
  int32_t max_step_tokens = 512;
  int32_t max_running = 64;
  std::vector<node_spec> nodes;
  std::vector<replica_spec> replicas;
  failure_spec failure;
  std::string gpu_weights = "bf16";
};

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
// in order, in each replica; tensor-parallel sizes divide the heads and FFN columns.
status validate_topology(const topology& t, const model_config& model, int32_t q8_group_size);

// What an operator should hear about a topology that is valid but limits its model: a KV
// cache that holds fewer tokens than the model's context (requests that outgrow it end
// early). Empty when there is nothing to say.
std::string topology_warnings(const topology& t, const model_config& model);

}  // namespace troupe::tools

// export: a topology as the deployment units of the tools operators already run, instead
// of processes troupe-launch starts itself.
//
//   systemd  one service per node (troupe-STEM-NODE.service: troupe-node on the topology,
//            restarted as [failure] restart says, stopped with time to drain, an
//            open-file limit above both endpoints' connections), the gateway's ordered
//            after the other nodes of its host, and troupe-STEM.target to start a host's
//            nodes together.
//   k8s      one StatefulSet per node with a headless Service that is its address (the
//            topology's hosts become those names), a Service for the gateway's client
//            endpoints, the topology in a ConfigMap (model paths under the models
//            volume, API keys from a Secret), readiness from the gateway's /health (503
//            while no replica can serve) and each node's agent port, liveness from the
//            agent port, and resource requests from the model's size and the KV cache.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.hpp"
#include "tools/common/topology.hpp"

namespace troupe::tools {

struct export_options {
  std::string topology_file;              // the topology as the units read it (systemd: its
                                          // absolute path)
  std::string topology_text;              // its text (k8s: rewritten into the ConfigMap)
  std::string bin_dir = "/usr/local/bin";  // where troupe-node is installed (systemd)
  std::string user;                       // systemd User= (empty: none)
  std::string image = "troupe:latest";    // the container image with troupe-node (k8s)
  std::string models_claim = "troupe-models";  // k8s: the PersistentVolumeClaim with the
                                               // model files, mounted at /models
};

struct exported_file {
  std::string name;
  std::string text;
};

// Host memory a node needs: its stages' share of the weights (model_bytes, the file) and
// their KV caches, plus the process's own.
uint64_t node_memory_bytes(const topology& t, const model_config& c, uint64_t model_bytes, const std::string& node);

// DNS-1123 name of the deployment: "troupe-" and the topology file's stem.
std::string deployment_name(const std::string& topology_path);

std::vector<exported_file> systemd_units(const topology& t, const export_options& o);
expected<std::vector<exported_file>> k8s_manifests(const topology& t, const model_config& c, uint64_t model_bytes,
                                                   const export_options& o);

// troupe-launch export KIND: the files into out_dir, each path printed; 1 with a message on
// stderr when the model cannot be read or a file cannot be written.
int run_export(const topology& t, const std::string& topology_path, const std::string& kind, const std::string& out_dir,
               export_options o);

}  // namespace troupe::tools

// troupe-node: one process of a topology. This build serves replicas whose stages all run
// on this node (one process; tensor parallelism inside it) and the gateway's Cap'n Proto
// endpoint; it prints `endpoint: capnp://HOST:PORT` once it answers, and shuts down
// cleanly on SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>

#include <caf/all.hpp>
#include <CLI/CLI.hpp>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/gateway/rpc_gateway.hpp"
#include "actors/replica.hpp"
#include "actors/scheduler_actor.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/common/topology.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  CLI::App app{
      "troupe-node: run one process of a troupe topology.\n\n"
      "Loads the topology's model, spawns the scheduler, stages and shards of every replica\n"
      "placed on this node, and serves the client API (Cap'n Proto RPC) at the gateway's\n"
      "endpoint, printing `endpoint: capnp://HOST:PORT` when ready. Stops on SIGINT/SIGTERM.\n\n"
      "Example:\n  troupe-node deploy/tp2.toml --node n0\n",
      "troupe-node"};
  std::string topo_path, node_name, capnp_override;
  app.add_option("topology", topo_path, "topology file (deploy/*.toml)")->required();
  app.add_option("--node", node_name, "this process's node name (default: the gateway's node)");
  app.add_option("--capnp", capnp_override, "serve the client API here instead (HOST:PORT; port 0 picks a free one)");
  CLI11_PARSE(app, argc, argv);

  auto topo = tools::parse_topology(topo_path);
  if (!topo) {
    std::fprintf(stderr, "troupe-node: %s\n", topo.err().message.c_str());
    return 1;
  }
  if (node_name.empty()) node_name = topo->gateway_node;
  bool known = false;
  for (const auto& n : topo->nodes) known |= n.name == node_name;
  if (!known) {
    std::fprintf(stderr, "troupe-node: %s: no node named '%s'\n", topo_path.c_str(), node_name.c_str());
    return 1;
  }
  std::fprintf(stderr, "troupe-node %s: loading %s\n", node_name.c_str(), topo->model_path.c_str());
  auto loaded = tools::load_model_and_tokenizer(topo->model_path, topo->tokenizer_path);
  if (!loaded) {
    std::fprintf(stderr, "troupe-node: %s\n", loaded.err().message.c_str());
    return 1;
  }
  const model& m = loaded->m;
  const int32_t gs = m.weight_type == dtype::q8_0 ? m.weights.layers[0].wq.group_size : 0;
  if (auto v = tools::validate_topology(*topo, m.config, gs); !v) {
    std::fprintf(stderr, "troupe-node: %s\n", v.err().message.c_str());
    return 1;
  }
  for (const auto& r : topo->replicas)
    for (const auto& s : r.stages)
      if (s.node != node_name || topo->gateway_node != node_name) {
        std::fprintf(stderr,
                     "troupe-node: %s: replica '%s' places a stage on node '%s'; this build serves replicas "
                     "whose stages and gateway all run in one process\n",
                     topo_path.c_str(), r.name.c_str(), s.node.c_str());
        return 1;
      }
  if (topo->replicas.size() != 1) {
    std::fprintf(stderr, "troupe-node: %s: this build serves one replica per process\n", topo_path.c_str());
    return 1;
  }
  tools::endpoint ep = topo->capnp;
  if (!capnp_override.empty()) {
    const size_t colon = capnp_override.rfind(':');
    if (colon == std::string::npos || capnp_override.find_first_not_of("0123456789", colon + 1) != std::string::npos ||
        colon + 1 == capnp_override.size() || capnp_override.size() - colon > 6) {
      std::fprintf(stderr, "troupe-node: --capnp '%s' is not HOST:PORT\n", capnp_override.c_str());
      return 1;
    }
    ep.host = capnp_override.substr(0, colon);
    const long port = std::stol(capnp_override.substr(colon + 1));
    if (port > 65535) {
      std::fprintf(stderr, "troupe-node: --capnp port %ld is not in 0..65535\n", port);
      return 1;
    }
    ep.port = static_cast<uint16_t>(port);
  }

  // Block the stop signals before any thread starts, so only the wait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  int32_t threads = 1;
  for (const auto& n : topo->nodes)
    if (n.name == node_name) threads = n.threads;
  system_config cfg;
  caf::actor_system sys{cfg};
  const auto& rs = topo->replicas[0];
  std::vector<stage_layout> layout;
  for (const auto& s : rs.stages) {
    const int32_t tp = static_cast<int32_t>(s.devices.size());
    layout.push_back({s.first_layer, tools::end_layer(s, m.config.num_layers), tp, std::max(1, threads / tp)});
  }
  scheduler_setup setup;
  setup.m = &m;
  setup.tok = &*loaded->tok;
  setup.config.num_blocks = static_cast<uint32_t>(topo->num_blocks);
  setup.config.block_size = topo->block_size;
  setup.config.max_step_tokens = topo->max_step_tokens;
  setup.config.max_running = topo->max_running;
  setup.config.context = m.config.max_seq_len;
  setup.config.vocab = m.config.vocab_size;
  auto rep = spawn_replica(sys, m, layout, setup.config.num_blocks, setup.config.block_size, setup.config.max_step_tokens);
  setup.entry = rep.entry;
  auto sched = spawn_scheduler(sys, setup);

  int rc = 0;
  {
    rpc_gateway gateway(sys, sched);
    auto port = gateway.start(ep.host, ep.port);
    if (!port) {
      std::fprintf(stderr, "troupe-node: %s\n", port.err().message.c_str());
      rc = 1;
    } else {
      std::fprintf(stderr, "troupe-node %s: serving %s (%s; %s), replica '%s' with %zu stage(s)\n", node_name.c_str(),
                   m.path.c_str(), m.format.c_str(), describe(m.config).c_str(), rs.name.c_str(), rs.stages.size());
      std::printf("endpoint: capnp://%s:%u\n", ep.host.c_str(), static_cast<unsigned>(*port));
      std::fflush(stdout);
      int sig = 0;
      sigwait(&stop_signals, &sig);
      std::fprintf(stderr, "troupe-node %s: stopping (signal %d)\n", node_name.c_str(), sig);
    }
    gateway.stop();
  }
  caf::scoped_actor self{sys};
  self->send_exit(sched, caf::exit_reason::user_shutdown);
  for (auto& a : rep.actors) self->send_exit(a, caf::exit_reason::user_shutdown);
  return rc;
}

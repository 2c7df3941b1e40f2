// troupe-launch: the operator's tool. `up` checks a topology against its model, then starts
// every node process (local processes for 127.0.0.1 and localhost, ssh for other hosts),
// the gateway's node last, waits until the gateway answers health, and prints
// `endpoint: capnp://HOST:PORT`. `status` prints one line per node process,
// `node NAME pid PID STATE`. `down` stops the gateway's node first (it drains requests in
// flight), then the others. Node logs and the process table live in --state-dir.
//
// With `restart = "always"` in [failure] (the default), `up` leaves a supervisor process
// behind that restarts any node process that exits (with a backoff), keeping the process
// table current. `chaos` injects failures into a running cluster: kills named actors
// through node agents, SIGKILLs or SIGSTOPs node processes, at seeded random times, and
// measures how long the gateway takes to see each failure and to be whole again.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "tools/common/cli.hpp"
#include "tools/common/topology.hpp"
#include "tools/troupe-launch/certs.hpp"
#include "tools/troupe-launch/chaos.hpp"
#include "tools/troupe-launch/export.hpp"
#include "tools/troupe-launch/processes.hpp"
#include "tools/troupe-launch/up.hpp"

using namespace troupe;
using namespace troupe::tools;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{
      "troupe-launch: start, inspect and stop the node processes of a topology.\n\n"
      "  troupe-launch up deploy/pp2.toml       check, start every node, wait for health,\n"
      "                                         print `endpoint: capnp://HOST:PORT`\n"
      "  troupe-launch status deploy/pp2.toml   one line per node: node NAME pid PID STATE\n"
      "  troupe-launch down deploy/pp2.toml     drain the gateway, stop every node\n"
      "  troupe-launch chaos deploy/pp2x2.toml --events 20 --seed 7\n"
      "                                         kill actors, SIGKILL and SIGSTOP nodes at random;\n"
      "                                         print how fast each failure is noticed and repaired\n"
      "  troupe-launch export systemd deploy/pp2.toml --out units/\n"
      "  troupe-launch export k8s deploy/pp2.toml --out manifests/ --image registry/troupe:1\n"
      "                                         write systemd units, or Kubernetes manifests, for\n"
      "                                         every node (deploy/README.md walks through both)\n"
      "  troupe-launch certs deploy/pp2-tls.toml\n"
      "                                         make the cluster's CA and a certificate per node, the\n"
      "                                         files [tls] names (links between nodes over TLS)\n",
      "troupe-launch"};
  app.require_subcommand(1);
  std::string topology, state_dir = "/tmp/troupe-launch-" + std::to_string(getuid()), capnp, http, node_bin;
  int timeout_s = 60;
  auto* up = app.add_subcommand("up", "start every node of a topology and wait until every replica is ready");
  auto* status = app.add_subcommand("status", "print the node processes");
  auto* down = app.add_subcommand("down", "stop every node");
  auto* chaos = app.add_subcommand("chaos", "inject failures into a running cluster and time the recovery");
  tools::chaos_options copt;
  std::string kinds = "actor,sigkill,sigstop", gap = "200-1000";
  chaos->add_option("--seed", copt.seed, "random seed: the same seed, the same events")->capture_default_str();
  chaos->add_option("--events", copt.events, "how many failures")->check(CLI::Range(1, 100000))->capture_default_str();
  chaos->add_option("--kinds", kinds, "which failures: actor (kill a stage, shard or scheduler), sigkill, sigstop")
      ->capture_default_str();
  chaos->add_option("--gap-ms", gap, "pause between recovery and the next event, MIN-MAX ms")->capture_default_str();
  chaos->add_option("--stop-ms", copt.stop_ms, "how long a SIGSTOPped node stays stopped")->check(CLI::Range(1, 600000))->capture_default_str();
  chaos->add_option("--recover-timeout", copt.recover_timeout_s, "seconds an event may take to recover")
      ->check(CLI::Range(1, 3600))->capture_default_str();
  chaos->add_option("--json", copt.json_path, "write each event's figures here");
  chaos->add_flag("--overlap", copt.overlap, "fire events on schedule without waiting for recovery (failures pile up)");
  for (auto* sub : {up, status, down, chaos}) {
    sub->add_option("topology", topology, "topology file (deploy/*.toml)")->required();
    sub->add_option("--state-dir", state_dir, "where node logs and the process table live")->capture_default_str();
  }
  auto* exporter = app.add_subcommand("export", "write systemd units or Kubernetes manifests for every node");
  std::string export_kind, export_out;
  tools::export_options xopt;
  exporter->add_option("kind", export_kind, "systemd or k8s")->required()->check(CLI::IsMember({"systemd", "k8s"}));
  exporter->add_option("topology", topology, "topology file (deploy/*.toml)")->required();
  exporter->add_option("--out", export_out, "directory the files go to (made if missing)")->required();
  exporter->add_option("--topology-path", xopt.topology_file,
                       "systemd: where the units read the topology (default: its absolute path here)");
  exporter->add_option("--bin-dir", xopt.bin_dir, "systemd: where troupe-node is installed")->capture_default_str();
  exporter->add_option("--user", xopt.user, "systemd: the user the nodes run as (default: the service manager's)");
  exporter->add_option("--image", xopt.image, "k8s: the container image with troupe-node on its PATH")->capture_default_str();
  exporter->add_option("--models-claim", xopt.models_claim, "k8s: the PersistentVolumeClaim holding the model files")
      ->capture_default_str();
  auto* certs = app.add_subcommand("certs", "make the cluster's CA and every node's certificate and key ([tls])");
  bool renew = false;
  certs->add_option("topology", topology, "topology file with a [tls] table")->required();
  certs->add_flag("--renew", renew, "issue new node certificates even where valid ones exist (the CA is kept)");
  bool with_actors = false;
  status->add_flag("--actors", with_actors, "also list every node's supervised actors (alive, restarts)");
  up->add_option("--capnp", capnp, "serve the client API here instead of the topology's endpoint (port 0: any)")
      ->check(tools::host_port(true));
  up->add_option("--http", http, "serve the OpenAI-compatible HTTP API here (port 0: any)")->check(tools::host_port(true));
  up->add_option("--timeout", timeout_s, "seconds to wait for the cluster to answer and every replica to be ready")->check(CLI::Range(1, 3600))->capture_default_str();
  up->add_option("--node-binary", node_bin, "troupe-node to run (default: beside this tool)");
  CLI11_PARSE(app, argc, argv);

  auto topo = tools::parse_topology(topology);
  if (!topo) {
    std::fprintf(stderr, "troupe-launch: %s\n", topo.err().message.c_str());
    return 1;
  }
  if (exporter->parsed()) return tools::run_export(*topo, topology, export_kind, export_out, xopt);
  if (certs->parsed()) return tools::make_certs(*topo, renew);
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  const std::string table = state_file(state_dir, topology);

  if (status->parsed()) {
    const auto procs = read_state(table);
    if (procs.empty()) {
      std::printf("no nodes of %s are known (not started with troupe-launch up?)\n", topology.c_str());
      return 3;
    }
    for (const proc& p : procs) std::printf("node %s pid %d %s\n", p.node.c_str(), p.pid, state_of(p.pid).c_str());
    if (with_actors) return tools::print_actors(*topo);
    return 0;
  }
  if (chaos->parsed()) {
    copt.kinds.clear();
    for (size_t at = 0; at <= kinds.size();) {
      const size_t comma = std::min(kinds.find(',', at), kinds.size());
      const std::string k = kinds.substr(at, comma - at);
      if (k != "actor" && k != "sigkill" && k != "sigstop") {
        std::fprintf(stderr, "troupe-launch chaos: unknown kind '%s' (actor, sigkill, sigstop)\n", k.c_str());
        return 2;
      }
      copt.kinds.push_back(k);
      at = comma + 1;
    }
    if (std::sscanf(gap.c_str(), "%d-%d", &copt.min_gap_ms, &copt.max_gap_ms) != 2 || copt.min_gap_ms < 0 ||
        copt.max_gap_ms < copt.min_gap_ms) {
      std::fprintf(stderr, "troupe-launch chaos: --gap-ms '%s' is not MIN-MAX\n", gap.c_str());
      return 2;
    }
    // Every gateway's Cap'n Proto endpoint: the harness's client fails over between them.
    std::string endpoint;
    for (const auto& g : topo->gateway.places())
      for (const std::string& e : gateway_endpoints(state_dir, g.node))
        if (e.rfind("capnp", 0) == 0) endpoint += (endpoint.empty() ? "" : ",") + e;
    if (endpoint.empty() || read_state(table).empty()) {
      std::fprintf(stderr, "troupe-launch chaos: %s is not up (start it with troupe-launch up)\n", topology.c_str());
      return 1;
    }
    return tools::run_chaos(*topo, endpoint, table, copt);
  }
  if (down->parsed()) {
    stop_supervisor(supervisor_file(state_dir, topology));
    const std::vector<proc> known = read_state(table);
    if (known.empty()) std::fprintf(stderr, "troupe-launch: no nodes of %s are known; nothing to stop\n", topology.c_str());
    stop_all(known, topo->gateway.node, true);
    fs::remove(table, ec);
    return 0;
  }
  return run_up(*topo, {topology, state_dir, capnp, http, node_bin, timeout_s});
}

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
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>

#include "actors/client/troupe_client.hpp"
#include "actors/tls/tls_files.hpp"
#include "tools/common/cli.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/common/topology.hpp"
#include "tools/troupe-launch/certs.hpp"
#include "tools/troupe-launch/chaos.hpp"
#include "tools/troupe-launch/export.hpp"
#include "tools/troupe-launch/processes.hpp"

using namespace troupe;
using namespace troupe::tools;
namespace fs = std::filesystem;

namespace {

// A stop signal that came while `up` was starting the cluster (0: none).
volatile std::sig_atomic_t interrupted = 0;
void on_interrupt(int sig) { interrupted = sig; }

}  // namespace

// The endpoints a gateway node said it serves ("capnp://...", "https://..."), from its
// output in the state folder.
std::vector<std::string> gateway_endpoints(const std::string& state_dir, const std::string& node) {
  std::vector<std::string> out;
  std::ifstream f(fs::path(state_dir) / (node + ".out"));
  for (std::string line; std::getline(f, line);)
    if (line.rfind("endpoint: ", 0) == 0) out.push_back(line.substr(10));
  return out;
}

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

  // up: everything is checked before anything starts.
  for (const proc& p : read_state(table))
    if (state_of(p.pid) == "running") {
      std::fprintf(stderr, "troupe-launch: %s is already up (node %s, pid %d); run troupe-launch down first\n",
                   topology.c_str(), p.node.c_str(), p.pid);
      return 1;
    }
  auto m = load_model(topo->model.path);
  if (!m) {
    std::fprintf(stderr, "troupe-launch: %s\n", m.err().message.c_str());
    return 1;
  }
  const int32_t gs = m->weight_type == dtype::q8_0 ? m->weights.layers[0].wq.group_size : 0;
  if (auto v = tools::validate_topology(*topo, m->config, gs); !v) {
    std::fprintf(stderr, "troupe-launch: %s\n", v.err().message.c_str());
    return 1;
  }
  if (const std::string w = tools::topology_warnings(*topo, m->config); !w.empty())
    std::fprintf(stderr, "troupe-launch: %s: %s\n", topology.c_str(), w.c_str());
  for (const node_spec& n : topo->nodes)
    if (const std::string w = tools::insecure_ports_warning(*topo, n); !w.empty())
      std::fprintf(stderr, "troupe-launch: %s: %s\n", topology.c_str(), w.c_str());
  // Links over TLS: every local node's files checked here, before any node starts.
  for (const node_spec& n : topo->nodes) {
    if (!topo->tls.on() || !is_local(n.host)) continue;
    if (auto c = tls::check({topo->tls.ca, topo->tls.cert_of(n.name), topo->tls.key_of(n.name)}); !c) {
      std::fprintf(stderr, "troupe-launch: node %s: [tls]: %s (troupe-launch certs %s makes them)\n", n.name.c_str(),
                   c.err().message.c_str(), topology.c_str());
      return 1;
    }
  }
  tools::speculative_models spec_models;  // loaded to be checked; the nodes load their own
  if (auto spec = tools::speculative_from(topo->speculative, *m, m->vocab ? &*m->vocab : nullptr, spec_models, true); !spec) {
    std::fprintf(stderr, "troupe-launch: %s: %s\n", topology.c_str(), spec.err().message.c_str());
    return 1;
  }
  if (node_bin.empty()) node_bin = (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "troupe-node" / "troupe-node").string();
  if (!fs::exists(node_bin)) node_bin = (fs::read_symlink("/proc/self/exe").parent_path() / "troupe-node").string();
  if (!fs::exists(node_bin)) {
    std::fprintf(stderr, "troupe-launch: cannot find troupe-node (looked beside this tool); name it with --node-binary\n");
    return 1;
  }
  const std::string topo_abs = fs::absolute(topology).string();
  // Interrupted (Ctrl-C, SIGTERM) while starting, up stops the nodes it started.
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::vector<proc> procs;
  const tools::node_spec* gateway = nullptr;
  // The stages' nodes first, then the gateways (the first one, which --capnp and --http
  // move, last of all).
  for (const auto& n : topo->nodes) {
    if (topo->gateway.index_of(n.name) >= 0) {
      if (n.name == topo->gateway.node) gateway = &n;
      continue;
    }
    procs.push_back({n.name, start_node(node_bin, topo_abs, n, "", "", state_dir)});
    std::fprintf(stderr, "troupe-launch: started node %s (pid %d) on %s\n", n.name.c_str(), procs.back().pid, n.host.c_str());
  }
  for (const auto& g : topo->gateway.also) {
    const tools::node_spec& n = *topo->node_named(g.node);
    procs.push_back({n.name, start_node(node_bin, topo_abs, n, "", "", state_dir)});
    std::fprintf(stderr, "troupe-launch: started node %s (pid %d), a gateway\n", n.name.c_str(), procs.back().pid);
  }
  procs.push_back({gateway->name, start_node(node_bin, topo_abs, *gateway, capnp, http, state_dir)});
  std::fprintf(stderr, "troupe-launch: started node %s (pid %d), the gateway\n", gateway->name.c_str(), procs.back().pid);
  write_state(table, procs);

  // Wait for the endpoint line, then for health: the gateway serving, and then every
  // replica ready (a disaggregated cluster serves before its prefill replicas are, computing
  // prompts on the decode replicas). A replica still not ready at the deadline is said, and
  // the cluster, serving, is left up.
  const std::string out = (fs::path(state_dir) / (gateway->name + ".out")).string();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  const bool tty = isatty(STDERR_FILENO);
  std::string endpoint, http_endpoint, last_error;
  std::optional<client_health> serving;  // the last health once the gateway serves
  int dots = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(out);
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("endpoint: capnp", 0) == 0) endpoint = line.substr(10);  // capnp:// or capnps://
      if (line.rfind("endpoint: http", 0) == 0) http_endpoint = line.substr(10);  // http:// or https://
    }
    if (!endpoint.empty()) {
      // (A gateway over TLS shows a certificate of the cluster's CA, or one $TROUPE_CA trusts.)
      auto h = troupe_client::connect(endpoint, "", topo->tls.ca)->health();
      if (h && h->ready) {
        serving = *h;
        if (h->replicas_ready >= h->replicas) break;
      }
      if (!h) last_error = h.err().message;
      if (!h && last_error.find("TLS: ") != std::string::npos) {  // waiting will not mend it
        if (tty) std::fprintf(stderr, "\n");
        std::fprintf(stderr, "troupe-launch: %s\n", last_error.c_str());
        stop_all(procs, topo->gateway.node, false);
        fs::remove(table, ec);
        return 1;
      }
    }
    for (const proc& p : procs) {
      waitpid(p.pid, nullptr, WNOHANG);
      const std::string st = state_of(p.pid);
      if (st == "gone" || st == "zombie") {
        if (tty) std::fprintf(stderr, "\n");
        std::fprintf(stderr, "troupe-launch: node %s exited; its log (%s/%s.log) ends:\n", p.node.c_str(), state_dir.c_str(), p.node.c_str());
        std::ifstream log(fs::path(state_dir) / (p.node + ".log"));
        std::string l, all;
        while (std::getline(log, l)) all += "  " + l + "\n";
        std::fprintf(stderr, "%s", all.substr(all.size() > 2000 ? all.size() - 2000 : 0).c_str());
        stop_all(procs, topo->gateway.node, false);
        fs::remove(table, ec);
        return 1;
      }
    }
    if (interrupted) {
      if (tty) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "troupe-launch: interrupted (signal %d); stopping the nodes it started\n", static_cast<int>(interrupted));
      stop_all(procs, topo->gateway.node, false);
      fs::remove(table, ec);
      return 128 + interrupted;
    }
    if (tty && serving)
      std::fprintf(stderr, "\rtroupe-launch: serving; %u of %u replicas ready%.*s   ", serving->replicas_ready,
                   serving->replicas, (dots++ % 4), "...");
    else if (tty)
      std::fprintf(stderr, "\rtroupe-launch: waiting for the cluster to answer%.*s", (dots++ % 4), "...");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (tty) std::fprintf(stderr, "\n");
  if (endpoint.empty() || (!serving && std::chrono::steady_clock::now() >= deadline)) {
    std::fprintf(stderr, "troupe-launch: the cluster did not answer within %d s%s; see the logs in %s\n", timeout_s,
                 last_error.empty() ? "" : (" (last: " + last_error + ")").c_str(), state_dir.c_str());
    stop_all(procs, topo->gateway.node, false);
    fs::remove(table, ec);
    return 1;
  }
  if (serving->replicas_ready < serving->replicas)
    std::fprintf(stderr,
                 "troupe-launch: serving, but only %u of %u replicas were ready within %d s (troupe-launch status "
                 "shows them; the node logs are in %s)\n",
                 serving->replicas_ready, serving->replicas, timeout_s, state_dir.c_str());
  if (topo->failure.restart) {
    std::fflush(nullptr);
    const pid_t sup = fork();
    if (sup == 0) {
      setsid();
      const std::string log = (fs::path(state_dir) / "supervisor.log").string();
      FILE* o = std::freopen("/dev/null", "w", stdout);
      FILE* e = std::freopen(log.c_str(), "a", stderr);
      (void)o;
      (void)e;
      std::setvbuf(stderr, nullptr, _IONBF, 0);  // nothing buffered to be copied into forked nodes
      supervise(procs, table, node_bin, topo_abs, *topo, capnp, http, state_dir);
      _exit(0);
    }
    std::ofstream(supervisor_file(state_dir, topology)) << sup << '\n';
    std::fprintf(stderr, "troupe-launch: supervisor (pid %d) restarts nodes that exit; log in %s/supervisor.log\n", sup,
                 state_dir.c_str());
  }
  std::printf("endpoint: %s\n", endpoint.c_str());
  if (!http_endpoint.empty()) std::printf("endpoint: %s\n", http_endpoint.c_str());
  // The other gateways' endpoints, once each has said them (they are up by now, or soon).
  for (const auto& g : topo->gateway.also) {
    std::vector<std::string> lines;
    for (int i = 0; i < 100 && lines.empty(); ++i) {
      lines = gateway_endpoints(state_dir, g.node);
      if (lines.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (const std::string& e : lines) std::printf("endpoint: %s\n", e.c_str());
  }
  return 0;
}

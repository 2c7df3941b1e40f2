#include "tools/troupe-launch/up.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "actors/client/troupe_client.hpp"
#include "actors/tls/tls_files.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/troupe-launch/processes.hpp"

namespace troupe::tools {
namespace {

namespace fs = std::filesystem;

// A stop signal that came while `up` was starting the cluster (0: none).
volatile std::sig_atomic_t interrupted = 0;
void on_interrupt(int sig) { interrupted = sig; }

}  // namespace

int run_up(const topology& topo, up_options o) {
  const std::string& path = o.topology;
  const std::string& state_dir = o.state_dir;
  const std::string &capnp = o.capnp, &http = o.http;
  std::string& node_bin = o.node_bin;
  const int timeout_s = o.timeout_s;
  std::error_code ec;
  const std::string table = state_file(state_dir, path);

  // Everything is checked before anything starts.
  for (const proc& p : read_state(table))
    if (state_of(p.pid) == "running") {
      std::fprintf(stderr, "troupe-launch: %s is already up (node %s, pid %d); run troupe-launch down first\n",
                   path.c_str(), p.node.c_str(), p.pid);
      return 1;
    }
  auto m = load_model(topo.model.path);
  if (!m) {
    std::fprintf(stderr, "troupe-launch: %s\n", m.err().message.c_str());
    return 1;
  }
  const int32_t gs = m->weight_type == dtype::q8_0 ? m->weights.layers[0].wq.group_size : 0;
  if (auto v = validate_topology(topo, m->config, gs); !v) {
    std::fprintf(stderr, "troupe-launch: %s\n", v.err().message.c_str());
    return 1;
  }
  if (const std::string w = topology_warnings(topo, m->config); !w.empty())
    std::fprintf(stderr, "troupe-launch: %s: %s\n", path.c_str(), w.c_str());
  for (const node_spec& n : topo.nodes)
    if (const std::string w = insecure_ports_warning(topo, n); !w.empty())
      std::fprintf(stderr, "troupe-launch: %s: %s\n", path.c_str(), w.c_str());
  // Links over TLS: every local node's files checked here, before any node starts.
  for (const node_spec& n : topo.nodes) {
    if (!topo.tls.on() || !is_local(n.host)) continue;
    if (auto c = tls::check({topo.tls.ca, topo.tls.cert_of(n.name), topo.tls.key_of(n.name)}); !c) {
      std::fprintf(stderr, "troupe-launch: node %s: [tls]: %s (troupe-launch certs %s makes them)\n", n.name.c_str(),
                   c.err().message.c_str(), path.c_str());
      return 1;
    }
  }
  speculative_models spec_models;  // loaded to be checked; the nodes load their own
  if (auto spec = speculative_from(topo.speculative, *m, m->vocab ? &*m->vocab : nullptr, spec_models, true); !spec) {
    std::fprintf(stderr, "troupe-launch: %s: %s\n", path.c_str(), spec.err().message.c_str());
    return 1;
  }
  if (node_bin.empty()) node_bin = (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "troupe-node" / "troupe-node").string();
  if (!fs::exists(node_bin)) node_bin = (fs::read_symlink("/proc/self/exe").parent_path() / "troupe-node").string();
  if (!fs::exists(node_bin)) {
    std::fprintf(stderr, "troupe-launch: cannot find troupe-node (looked beside this tool); name it with --node-binary\n");
    return 1;
  }
  const std::string topo_abs = fs::absolute(path).string();
  // Interrupted (Ctrl-C, SIGTERM) while starting, up stops the nodes it started.
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::vector<proc> procs;
  const node_spec* gateway = nullptr;
  // The stages' nodes first, then the gateways (the first one, which --capnp and --http
  // move, last of all).
  for (const auto& n : topo.nodes) {
    if (topo.gateway.index_of(n.name) >= 0) {
      if (n.name == topo.gateway.node) gateway = &n;
      continue;
    }
    procs.push_back({n.name, start_node(node_bin, topo_abs, n, "", "", state_dir)});
    std::fprintf(stderr, "troupe-launch: started node %s (pid %d) on %s\n", n.name.c_str(), procs.back().pid, n.host.c_str());
  }
  for (const auto& g : topo.gateway.also) {
    const node_spec& n = *topo.node_named(g.node);
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
      auto h = troupe_client::connect(endpoint, "", topo.tls.ca)->health();
      if (h && h->ready) {
        serving = *h;
        if (h->replicas_ready >= h->replicas) break;
      }
      if (!h) last_error = h.err().message;
      if (!h && last_error.find("TLS: ") != std::string::npos) {  // waiting will not mend it
        if (tty) std::fprintf(stderr, "\n");
        std::fprintf(stderr, "troupe-launch: %s\n", last_error.c_str());
        stop_all(procs, topo.gateway.node, false);
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
        stop_all(procs, topo.gateway.node, false);
        fs::remove(table, ec);
        return 1;
      }
    }
    if (interrupted) {
      if (tty) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "troupe-launch: interrupted (signal %d); stopping the nodes it started\n", static_cast<int>(interrupted));
      stop_all(procs, topo.gateway.node, false);
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
    stop_all(procs, topo.gateway.node, false);
    fs::remove(table, ec);
    return 1;
  }
  if (serving->replicas_ready < serving->replicas)
    std::fprintf(stderr,
                 "troupe-launch: serving, but only %u of %u replicas were ready within %d s (troupe-launch status "
                 "shows them; the node logs are in %s)\n",
                 serving->replicas_ready, serving->replicas, timeout_s, state_dir.c_str());
  if (topo.failure.restart) {
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
      supervise(procs, table, node_bin, topo_abs, topo, capnp, http, state_dir);
      _exit(0);
    }
    std::ofstream(supervisor_file(state_dir, path)) << sup << '\n';
    std::fprintf(stderr, "troupe-launch: supervisor (pid %d) restarts nodes that exit; log in %s/supervisor.log\n", sup,
                 state_dir.c_str());
  }
  std::printf("endpoint: %s\n", endpoint.c_str());
  if (!http_endpoint.empty()) std::printf("endpoint: %s\n", http_endpoint.c_str());
  // The other gateways' endpoints, once each has said them (they are up by now, or soon).
  for (const auto& g : topo.gateway.also) {
    std::vector<std::string> lines;
    for (int i = 0; i < 100 && lines.empty(); ++i) {
      lines = gateway_endpoints(state_dir, g.node);
      if (lines.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (const std::string& e : lines) std::printf("endpoint: %s\n", e.c_str());
  }
  return 0;
}

}  // namespace troupe::tools

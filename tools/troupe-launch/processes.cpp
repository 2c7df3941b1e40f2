#include "tools/troupe-launch/processes.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace troupe::tools {

namespace fs = std::filesystem;

namespace {

volatile sig_atomic_t supervisor_stop = 0;

}  // namespace


bool is_local(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

std::string state_file(const std::string& dir, const std::string& topology) {
  return (fs::path(dir) / (fs::path(topology).stem().string() + ".procs")).string();
}

std::vector<proc> read_state(const std::string& file) {
  std::vector<proc> out;
  std::ifstream f(file);
  std::string node;
  pid_t pid;
  while (f >> node >> pid) out.push_back({node, pid});
  return out;
}

std::string state_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return "gone";
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return "gone";
  switch (line[close + 2]) {
    case 'T': case 't': return "stopped";
    case 'Z': case 'X': return "zombie";
    default: return "running";
  }
}

pid_t start_node(const std::string& node_bin, const std::string& topology, const node_spec& n,
                 const std::string& capnp, const std::string& http, const std::string& dir) {
  const std::string out = (fs::path(dir) / (n.name + ".out")).string();
  const std::string err = (fs::path(dir) / (n.name + ".log")).string();
  std::vector<std::string> args;
  if (is_local(n.host)) {
    args = {node_bin, topology, "--node", n.name};
    if (!capnp.empty()) args.insert(args.end(), {"--capnp", capnp});
    if (!http.empty()) args.insert(args.end(), {"--http", http});
  } else {
    std::string remote = "troupe-node '" + topology + "' --node '" + n.name + "'";
    if (!capnp.empty()) remote += " --capnp '" + capnp + "'";
    if (!http.empty()) remote += " --http '" + http + "'";
    args = {"ssh", "-o", "BatchMode=yes", n.host, remote};
  }
  const pid_t pid = fork();
  if (pid == 0) {
    setsid();
    FILE* o = std::freopen(out.c_str(), "w", stdout);
    FILE* e = std::freopen(err.c_str(), "a", stderr);  // a restarted node's log follows its predecessor's
    (void)o;
    (void)e;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::perror("troupe-launch: exec");
    _exit(127);
  }
  return pid;
}

std::string supervisor_file(const std::string& dir, const std::string& topology) {
  return (fs::path(dir) / (fs::path(topology).stem().string() + ".supervisor")).string();
}

void write_state(const std::string& file, const std::vector<proc>& procs) {
  const std::string tmp = file + ".tmp";
  {
    std::ofstream f(tmp);
    for (const proc& p : procs) f << p.node << ' ' << p.pid << '\n';
  }
  fs::rename(tmp, file);
}

void stop_supervisor(const std::string& file) {
  std::ifstream f(file);
  pid_t pid = 0;
  if (!(f >> pid) || pid <= 0) return;
  if (kill(pid, SIGTERM) != 0) return;
  for (int i = 0; i < 50 && kill(pid, 0) == 0 && state_of(pid) == "running"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::error_code ec;
  fs::remove(file, ec);
}


void supervise(std::vector<proc> procs, const std::string& table, const std::string& node_bin,
               const std::string& topo_abs, const topology& topo, const std::string& capnp,
               const std::string& http, const std::string& dir) {
  std::signal(SIGTERM, [](int) { supervisor_stop = 1; });
  std::signal(SIGINT, [](int) { supervisor_stop = 1; });
  using clock = std::chrono::steady_clock;
  struct backoff {
    int streak = 0;
    clock::time_point last_exit{}, restart_at{};
    bool waiting = false;
  };
  std::map<std::string, backoff> b;
  std::error_code ec;
  while (!supervisor_stop && fs::exists(table, ec)) {
    bool changed = false;
    for (proc& p : procs) {
      waitpid(p.pid, nullptr, WNOHANG);
      const std::string st = state_of(p.pid);
      if (st != "gone" && st != "zombie") continue;
      backoff& k = b[p.node];
      const auto now = clock::now();
      if (!k.waiting) {
        k.streak = now - k.last_exit < std::chrono::seconds(30) ? std::min(k.streak + 1, 6) : 0;
        k.last_exit = now;
        k.restart_at = now + std::min<clock::duration>(std::chrono::milliseconds(100) * (1 << k.streak), std::chrono::seconds(5));
        k.waiting = true;
        std::fprintf(stderr, "troupe-launch supervisor: node %s (pid %d) exited; restarting\n", p.node.c_str(), p.pid);
      }
      if (now < k.restart_at) continue;
      k.waiting = false;
      for (const auto& n : topo.nodes)
        if (n.name == p.node) {
          const bool gw = n.name == topo.gateway.node;
          p.pid = start_node(node_bin, topo_abs, n, gw ? capnp : "", gw ? http : "", dir);
          std::fprintf(stderr, "troupe-launch supervisor: node %s restarted (pid %d)\n", p.node.c_str(), p.pid);
        }
      changed = true;
    }
    if (changed && fs::exists(table, ec)) write_state(table, procs);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void stop_all(std::vector<proc> procs, const std::string& gateway_node, bool verbose) {
  // The gateway's node first, so requests in flight drain while the stages still run.
  std::stable_partition(procs.begin(), procs.end(), [&](const proc& p) { return p.node == gateway_node; });
  for (const proc& p : procs) {
    if (state_of(p.pid) == "gone") continue;
    if (state_of(p.pid) == "stopped") kill(p.pid, SIGCONT);
    kill(p.pid, SIGTERM);
    for (int i = 0; i < 350 && state_of(p.pid) == "running"; ++i) {
      waitpid(p.pid, nullptr, WNOHANG);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (state_of(p.pid) != "gone" && state_of(p.pid) != "zombie") kill(p.pid, SIGKILL);
    waitpid(p.pid, nullptr, WNOHANG);
    if (verbose) std::fprintf(stderr, "troupe-launch: node %s (pid %d) stopped\n", p.node.c_str(), p.pid);
  }
}

std::vector<std::string> gateway_endpoints(const std::string& state_dir, const std::string& node) {
  std::vector<std::string> out;
  std::ifstream f(std::filesystem::path(state_dir) / (node + ".out"));
  for (std::string line; std::getline(f, line);)
    if (line.rfind("endpoint: ", 0) == 0) out.push_back(line.substr(10));
  return out;
}


}  // namespace troupe::tools

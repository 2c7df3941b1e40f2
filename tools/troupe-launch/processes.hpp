// processes: the node processes troupe-launch starts, watches and stops. The process
// table (one `NAME PID` line per node) lives in the state directory beside the nodes'
// logs; a supervisor process, when the topology asks for restarts, keeps it current.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "tools/common/topology.hpp"

namespace troupe::tools {

struct proc {
  std::string node;
  pid_t pid;
};

bool is_local(const std::string& host);
std::string state_file(const std::string& dir, const std::string& topology);
std::string supervisor_file(const std::string& dir, const std::string& topology);
std::vector<proc> read_state(const std::string& file);
// Written whole to a temporary file, then renamed: readers never see half a table.
void write_state(const std::string& file, const std::vector<proc>& procs);
// "running", "stopped" (SIGSTOP), "zombie" or "gone", from /proc.
std::string state_of(pid_t pid);

// Starts a node in its own session, stdout to DIR/NAME.out, stderr appended to
// DIR/NAME.log; returns its pid. capnp/http: the gateway's endpoint overrides, if any.
pid_t start_node(const std::string& node_bin, const std::string& topology, const node_spec& n,
                 const std::string& capnp, const std::string& http, const std::string& dir);

// The supervisor: restarts node processes that exit (not ones that are stopped), with a
// backoff per node (100 ms, doubling to 5 s while it keeps dying within 30 s), until
// SIGTERM or until its process table disappears (the cluster was taken down).
void supervise(std::vector<proc> procs, const std::string& table, const std::string& node_bin,
               const std::string& topo_abs, const topology& topo, const std::string& capnp,
               const std::string& http, const std::string& dir);
// Stops the supervisor named in `file` (so nothing restarts while the nodes stop).
void stop_supervisor(const std::string& file);
// The gateway's node first (it drains), then the others: SIGTERM, SIGKILL after 35 s.
void stop_all(std::vector<proc> procs, const std::string& gateway_node, bool verbose);
// The endpoints a gateway node said it serves ("capnp://...", "https://..."), from its
// output in the state folder.
std::vector<std::string> gateway_endpoints(const std::string& state_dir, const std::string& node);

}  // namespace troupe::tools

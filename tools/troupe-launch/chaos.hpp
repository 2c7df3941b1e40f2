// chaos: failure injection into a running cluster, for tests and operators. Each event
// picks, with a seeded generator, one of the enabled kinds:
//   actor    kill a named stage, shard or scheduler through its node's agent
//   sigkill  SIGKILL a node process (troupe-launch's supervisor restarts it)
//   sigstop  SIGSTOP a node process for stop_ms, then SIGCONT (a hung node)
// on a node other than the gateway's, then measures from the gateway's health how long
// it took to notice (a replica not ready) and to be whole again (every replica ready).
// With overlap, events fire on their schedule whatever state the cluster is in, and only
// the recovery after the last one is checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/common/topology.hpp"

namespace troupe::tools {

struct chaos_options {
  uint64_t seed = 1;
  int events = 10;
  int min_gap_ms = 200, max_gap_ms = 1000;  // between one recovery and the next event
  int stop_ms = 1500;                       // how long a SIGSTOPped node stays stopped
  int recover_timeout_s = 60;               // an event not recovered by then fails the run
  std::vector<std::string> kinds{"actor", "sigkill", "sigstop"};
  std::string json_path;                    // per-event figures, if set
  bool overlap = false;                     // fire on schedule without waiting for recovery
                                            // (failures pile up; only the end is checked)
};

struct chaos_node {
  std::string name;
  int pid = 0;
};

// One line per supervised actor of every node, from the node agents:
// `actor NAME node NODE kind KIND alive|dead restarts N`. Returns 1 if a node does not answer.
int print_actors(const topology& topo);

// Returns the exit status: 0 when the cluster was whole again after every event.
int run_chaos(const topology& topo, const std::string& endpoint, const std::string& table_file,
              const chaos_options& opt);

}  // namespace troupe::tools

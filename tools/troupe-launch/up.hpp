// troupe-launch up: a topology checked against its model, every node process started (the
// gateway's last), the cluster waited for until every replica is ready, a supervisor left
// behind where the topology asks for restarts, and the endpoints printed.
#pragma once

#include <string>

#include "tools/common/topology.hpp"

namespace troupe::tools {

struct up_options {
  std::string topology;   // the file, as named
  std::string state_dir;  // node logs and the process table
  std::string capnp, http;  // the first gateway's endpoints instead of the topology's (empty: its)
  std::string node_bin;   // troupe-node (empty: beside this tool)
  int timeout_s = 60;
};

// The exit status: 0 once serving (a replica not ready by the deadline is said, and the
// cluster left up); else 1 (the reason on stderr, every node it started stopped), or 128
// plus the signal that interrupted it.
int run_up(const topology& topo, up_options o);

}  // namespace troupe::tools

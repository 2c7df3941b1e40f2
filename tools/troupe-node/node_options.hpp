// node_options: troupe-node's command line, and the checks on what it names that need the
// file system (the API keys file, the descriptor limit) before the node starts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/util/expected.hpp"
#include "tools/common/node_plan.hpp"

namespace troupe::tools {

struct node_options {
  std::string topology;
  std::string node;  // empty: the gateway's node
  endpoint_overrides overrides;
};

// The options, or the exit code to end with (help asked for, or a bad flag: said).
std::optional<int> parse_node_options(int argc, char** argv, node_options& out);

// The gateway's API keys (one a line; # comments), and the rule that an endpoint off
// loopback needs them.
expected<std::vector<std::string>> gateway_keys(const topology& t, const gateway_plan& g);

// Raises the soft limit on open descriptors to the hard one, and says (on stderr) when even
// that leaves less room than the gateway's endpoints may hold at once.
void fit_connections_to_descriptors(const std::string& node, gateway_plan& g);

}  // namespace troupe::tools

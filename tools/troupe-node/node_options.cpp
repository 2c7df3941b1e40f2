#include <algorithm>
#include "tools/troupe-node/node_options.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include <CLI/CLI.hpp>

#include "actors/gateway/api_keys.hpp"
#include "tools/common/cli.hpp"

namespace troupe::tools {

namespace {

// HOST:PORT, as CLI11 checked it.
endpoint endpoint_of(const std::string& text) {
  const size_t colon = text.rfind(':');
  return {text.substr(0, colon), static_cast<uint16_t>(std::stol(text.substr(colon + 1)))};
}

bool loopback(const std::string& h) { return h == "::1" || loopback_host(h); }

}  // namespace

std::optional<int> parse_node_options(int argc, char** argv, node_options& out) {
  CLI::App app{
      "troupe-node: run one process of a troupe topology.\n\n"
      "Loads the topology's model, spawns the scheduler, stages and shards of every replica\n"
      "placed on this node, and serves the client API (Cap'n Proto RPC) at the gateway's\n"
      "endpoint, printing `endpoint: capnp://HOST:PORT` when ready. Stops on SIGINT/SIGTERM.\n\n"
      "Example:\n  troupe-node deploy/tp2.toml --node n0\n\n"
      "Environment: TROUPE_KV_TYPE=f32|f16|q8_0 sets the KV cache's type (default: F32 for F32\n"
      "weights, F16 otherwise; q8_0 is int8 with a scale per token and KV head, half of F16's\n"
      "memory and traffic, lossy). troupe-launch passes its environment on to local nodes.\n",
      "troupe-node"};
  std::string capnp, http;
  app.add_option("topology", out.topology, "topology file (deploy/*.toml)")->required();
  app.add_option("--node", out.node, "this process's node name (default: the gateway's node)");
  app.add_option("--capnp", capnp, "serve the client API here instead (HOST:PORT; port 0 picks a free one)")
      ->check(host_port(true));
  app.add_option("--http", http, "serve the OpenAI-compatible HTTP API here (HOST:PORT; port 0 picks a free one)")
      ->check(host_port(true));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!capnp.empty()) out.overrides.capnp = endpoint_of(capnp);
  if (!http.empty()) out.overrides.http = endpoint_of(http);
  return std::nullopt;
}

expected<std::vector<std::string>> gateway_keys(const topology& t, const gateway_plan& g) {
  std::vector<std::string> keys;
  if (!t.gateway.api_keys_file.empty()) {
    std::ifstream f(t.gateway.api_keys_file, std::ios::binary);
    if (!f) return error{"cannot read the API keys file " + t.gateway.api_keys_file};
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (f.bad()) return error{"cannot read the API keys file " + t.gateway.api_keys_file};
    keys = parse_api_keys(text);
    if (keys.empty())
      return error{"the API keys file " + t.gateway.api_keys_file + " holds no key (one a line; blank lines and # comments "
                   "are skipped)"};
    std::fprintf(stderr, "troupe-node: API keys: %zu from %s\n", keys.size(), t.gateway.api_keys_file.c_str());
  }
  if (!loopback(g.capnp_endpoint.host) && keys.empty())
    return error{"the Cap'n Proto endpoint " + g.capnp_endpoint.str() + " is not on loopback: name an api_keys_file in [gateway]"};
  if (g.serve_http && !loopback(g.http_endpoint.host) && keys.empty())
    return error{"the HTTP endpoint " + g.http_endpoint.str() + " is not on loopback: name an api_keys_file in [gateway]"};
  return keys;
}

void fit_connections_to_descriptors(const std::string& node, gateway_plan& g) {
  // Every client connection holds a descriptor: the soft limit goes up to the hard one
  // (often 1024 of 500,000 or more). Short of room, endpoints out of descriptors take
  // them from each other as they are freed, and a flood on one can keep the other's
  // clients waiting until its idle connections time out.
  rlimit r{};
  int64_t limit = 1024;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
    if (r.rlim_cur < r.rlim_max) {
      rlimit want = r;
      want.rlim_cur = r.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
    }
    limit = r.rlim_cur == RLIM_INFINITY ? int64_t{1} << 30 : static_cast<int64_t>(r.rlim_cur);
  }
  const int64_t room = limit - 256;  // the node's own files and peers
  if (g.auto_connections) {
    // Not set in the topology: the Cap'n Proto endpoint a quarter of the room (at most
    // 4096), the HTTP endpoint the rest (at most 65536), each at least 64.
    const auto clamp = [](int64_t v, int64_t hi) { return static_cast<int32_t>(std::clamp<int64_t>(v, 64, hi)); };
    g.rpc.max_connections = clamp(g.serve_http ? room / 4 : room, 4096);
    g.http.max_connections = clamp(room - g.rpc.max_connections, 65536);
    std::fprintf(stderr, "troupe-node %s: connections held at once: %d Cap'n Proto%s (from the open-file limit, %lld)\n",
                 node.c_str(), g.rpc.max_connections,
                 g.serve_http ? (", " + std::to_string(connection_cap(g.http)) + " HTTP").c_str() : "",
                 static_cast<long long>(limit));
    return;
  }
  const int64_t wanted = int64_t{g.rpc.max_connections} + (g.serve_http ? connection_cap(g.http) : 0);
  if (room < wanted)
    std::fprintf(stderr,
                 "troupe-node %s: the open-file limit (ulimit -n) leaves room for about %lld client connections, "
                 "fewer than the %lld the gateway's endpoints may hold at once (max_connections %d%s); raise the "
                 "hard limit or lower max_connections in [gateway]\n",
                 node.c_str(), static_cast<long long>(std::max<int64_t>(room, 0)), static_cast<long long>(wanted),
                 g.rpc.max_connections, g.serve_http ? " on each of two endpoints" : "");
}

}  // namespace troupe::tools

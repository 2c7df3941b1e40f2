// troupe-node: one process of a topology: the stages (and their shards) of the replica
// placed on this node, and, on the gateway's node, the scheduler and the client API. Nodes
// find each other's stages through a directory actor published at each node's port
// (CAF's middleman, heartbeats on). The gateway's node prints
// `endpoint: capnp://HOST:PORT` once it answers; others print `node: NAME`. SIGINT or
// SIGTERM stops a node cleanly.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <CLI/CLI.hpp>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/gateway/http_gateway.hpp"
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
  std::string topo_path, node_name, capnp_override, http_override;
  app.add_option("topology", topo_path, "topology file (deploy/*.toml)")->required();
  app.add_option("--node", node_name, "this process's node name (default: the gateway's node)");
  app.add_option("--capnp", capnp_override, "serve the client API here instead (HOST:PORT; port 0 picks a free one)");
  app.add_option("--http", http_override, "serve the OpenAI-compatible HTTP API here (HOST:PORT; port 0 picks a free one)");
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
  if (topo->replicas.size() != 1) {
    std::fprintf(stderr, "troupe-node: %s: this build serves one replica\n", topo_path.c_str());
    return 1;
  }
  auto override_endpoint = [](const std::string& text, const char* flag, tools::endpoint& ep) {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size() || text.size() - colon > 6 ||
        text.find_first_not_of("0123456789", colon + 1) != std::string::npos || std::stol(text.substr(colon + 1)) > 65535) {
      std::fprintf(stderr, "troupe-node: %s '%s' is not HOST:PORT\n", flag, text.c_str());
      return false;
    }
    ep.host = text.substr(0, colon);
    ep.port = static_cast<uint16_t>(std::stol(text.substr(colon + 1)));
    return true;
  };
  tools::endpoint ep = topo->capnp, http_ep = topo->http;
  if (!capnp_override.empty() && !override_endpoint(capnp_override, "--capnp", ep)) return 1;
  if (!http_override.empty() && !override_endpoint(http_override, "--http", http_ep)) return 1;
  const bool serve_http = !http_override.empty() || topo->http.port != 0;
  auto loopback = [](const std::string& h) { return h == "127.0.0.1" || h == "localhost" || h == "::1"; };
  std::vector<std::string> api_keys;
  if (!topo->api_keys_file.empty()) {
    std::ifstream f(topo->api_keys_file);
    if (!f) {
      std::fprintf(stderr, "troupe-node: cannot read the API keys file %s\n", topo->api_keys_file.c_str());
      return 1;
    }
    for (std::string line; std::getline(f, line);)
      if (!line.empty() && line[0] != '#') api_keys.push_back(line);
  }
  if (!loopback(ep.host)) {
    std::fprintf(stderr, "troupe-node: the Cap'n Proto endpoint %s is not on loopback; it does not check API keys yet\n",
                 ep.str().c_str());
    return 1;
  }
  if (serve_http && !loopback(http_ep.host) && api_keys.empty()) {
    std::fprintf(stderr, "troupe-node: the HTTP endpoint %s is not on loopback: name an api_keys_file in [gateway]\n",
                 http_ep.str().c_str());
    return 1;
  }

  // Block the stop signals before any thread starts, so only the wait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const tools::node_spec* me = nullptr;
  for (const auto& n : topo->nodes)
    if (n.name == node_name) me = &n;
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  const auto& rs = topo->replicas[0];

  // This node's stages, built last to first: each needs the next stage's handle, local or
  // (from another node's directory) remote.
  std::vector<caf::actor> mine;      // every stage and shard spawned here
  std::vector<caf::actor> stage_of(rs.stages.size());
  auto node_of = [&](const std::string& name) -> const tools::node_spec& {
    for (const auto& n : topo->nodes)
      if (n.name == name) return n;
    return *me;
  };
  auto remote_stage = [&](size_t idx) -> expected<caf::actor> {
    const tools::node_spec& peer = node_of(rs.stages[idx].node);
    std::string last_error;
    for (int attempt = 0; attempt < 300; ++attempt) {  // the peer may still be starting: 30 s
      auto dir = sys.middleman().remote_actor(peer.host, peer.port);
      if (dir) {
        caf::actor found;
        self->request(*dir, std::chrono::seconds(5), lookup_atom_v, rs.name, static_cast<int32_t>(idx))
            .receive([&](const caf::actor& a) { found = a; }, [&](caf::error& e) { last_error = sys.render(e); });
        if (found) return found;
      } else {
        last_error = sys.render(dir.error());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return error{"stage " + std::to_string(idx) + " on node '" + peer.name + "' (" + peer.host + ":" +
                 std::to_string(peer.port) + ") cannot be reached: " + last_error};
  };
  // The round trip to another node's directory, measured once so operators see the cost
  // of a pipeline hop (printed; BENCHMARKS.md quotes it).
  auto report_hop = [&](const tools::node_spec& peer) {
    auto dir = sys.middleman().remote_actor(peer.host, peer.port);
    if (!dir) return;
    std::vector<double> us;
    for (uint64_t k = 0; k < 200; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      self->request(*dir, std::chrono::seconds(5), ping_atom_v, k).receive([](uint64_t) {}, [](caf::error&) {});
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::fprintf(stderr, "troupe-node %s: round trip to node %s: median %.0f us, p90 %.0f us (200 pings)\n",
                 node_name.c_str(), peer.name.c_str(), us[us.size() / 2], us[us.size() * 9 / 10]);
  };
  for (size_t i = rs.stages.size(); i-- > 0;) {
    const auto& s = rs.stages[i];
    if (s.node != node_name) continue;
    caf::actor next;
    if (i + 1 < rs.stages.size()) {
      if (rs.stages[i + 1].node == node_name) {
        next = stage_of[i + 1];
      } else {
        auto r = remote_stage(i + 1);
        if (!r) {
          std::fprintf(stderr, "troupe-node %s: %s\n", node_name.c_str(), r.err().message.c_str());
          return 1;
        }
        next = *r;
        report_hop(node_of(rs.stages[i + 1].node));
      }
    }
    const int32_t tp = static_cast<int32_t>(s.devices.size());
    const stage_layout one{s.first_layer, tools::end_layer(s, m.config.num_layers), tp, std::max(1, me->threads / tp)};
    auto rep = spawn_replica_stage(sys, m, one, next, static_cast<uint32_t>(topo->num_blocks), topo->block_size,
                                   topo->max_step_tokens);
    stage_of[i] = rep.entry;
    mine.insert(mine.end(), rep.actors.begin(), rep.actors.end());
  }
  // Other nodes find this node's stages through a directory published at its port.
  caf::actor directory;
  if (topo->nodes.size() > 1) {
    directory = sys.spawn([stages = stage_of, name = rs.name](caf::event_based_actor*) -> caf::behavior {
      return {
          [stages, name](lookup_atom, const std::string& replica, int32_t idx) -> caf::result<caf::actor> {
            if (replica != name || idx < 0 || static_cast<size_t>(idx) >= stages.size() || !stages[idx])
              return caf::make_error(caf::sec::invalid_argument, "no such stage here");
            return stages[idx];
          },
          [](ping_atom, uint64_t x) { return x; },
      };
    });
    auto bound = sys.middleman().publish(directory, me->port, me->host.c_str(), true);
    if (!bound) {
      std::fprintf(stderr, "troupe-node %s: cannot listen on %s:%u: %s\n", node_name.c_str(), me->host.c_str(),
                   static_cast<unsigned>(me->port), sys.render(bound.error()).c_str());
      return 1;
    }
  }

  scheduler_setup setup;
  setup.m = &m;
  setup.tok = &*loaded->tok;
  setup.config.num_blocks = static_cast<uint32_t>(topo->num_blocks);
  setup.config.block_size = topo->block_size;
  setup.config.prefix_caching = topo->prefix_caching;
  setup.config.max_step_tokens = topo->max_step_tokens;
  setup.config.max_running = topo->max_running;
  setup.config.context = m.config.max_seq_len;
  setup.config.vocab = m.config.vocab_size;
  setup.max_in_flight = static_cast<int32_t>(rs.stages.size());
  setup.config.micro_batches = setup.max_in_flight;
  const bool is_gateway = topo->gateway_node == node_name;
  caf::actor sched;
  if (is_gateway) {
    if (rs.stages[0].node == node_name) {
      setup.entry = stage_of[0];
    } else {
      auto r = remote_stage(0);
      if (!r) {
        std::fprintf(stderr, "troupe-node %s: %s\n", node_name.c_str(), r.err().message.c_str());
        return 1;
      }
      setup.entry = *r;
    }
    sched = spawn_scheduler(sys, setup);
  }

  int rc = 0;
  if (!is_gateway) {
    std::fprintf(stderr, "troupe-node %s: serving %zu stage(s) of replica '%s' at %s:%u\n", node_name.c_str(),
                 static_cast<size_t>(std::count_if(rs.stages.begin(), rs.stages.end(), [&](const auto& s) { return s.node == node_name; })),
                 rs.name.c_str(), me->host.c_str(), static_cast<unsigned>(me->port));
    std::printf("node: %s\n", node_name.c_str());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "troupe-node %s: stopping (signal %d)\n", node_name.c_str(), sig);
  } else {
    rpc_gateway gateway(sys, sched);
    http_config hc;
    hc.host = http_ep.host;
    hc.port = http_ep.port;
    hc.model_id = topo->model_name;
    hc.chat = *openai::template_named(topo->chat_template);
    hc.limits.context = m.config.max_seq_len;
    hc.limits.max_tokens = m.config.max_seq_len;
    hc.max_requests = std::max(1, topo->max_running * 4);
    hc.api_keys = api_keys;
    hc.tok = &*loaded->tok;
    http_gateway http(sys, sched, hc);
    if (serve_http) {
      auto hp = http.start();
      if (!hp) {
        std::fprintf(stderr, "troupe-node: %s\n", hp.err().message.c_str());
        return 1;
      }
      std::printf("endpoint: http://%s:%u\n", http_ep.host.c_str(), static_cast<unsigned>(*hp));
    }
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
      // Drain: no new requests; those in flight finish (for up to 30 s).
      gateway.drain();
      http.drain();
      std::fprintf(stderr, "troupe-node %s: draining (signal %d)\n", node_name.c_str(), sig);
      for (int i = 0; i < 300; ++i) {
        uint32_t busy = 0;
        self->request(sched, std::chrono::seconds(1), stats_atom_v)
            .receive([&](uint32_t, uint32_t, uint32_t running, uint32_t waiting) { busy = running + waiting; },
                     [&](caf::error&) {});
        if (busy == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::fprintf(stderr, "troupe-node %s: stopping\n", node_name.c_str());
    }
    gateway.stop();
    http.stop();
  }
  if (sched) self->send_exit(sched, caf::exit_reason::user_shutdown);
  if (directory) self->send_exit(directory, caf::exit_reason::user_shutdown);
  for (auto& a : mine) self->send_exit(a, caf::exit_reason::user_shutdown);
  return rc;
}

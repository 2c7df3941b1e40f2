// troupe-node: one process of a topology. Its node agent spawns and supervises the stages
// (with their shards) and the schedulers placed on this node, and is published at the
// node's port, where schedulers, the router and troupe-launch chaos find actors by name
// (CAF's middleman, heartbeats with the topology's timeouts). The gateway's node also runs
// the router and the client APIs, and prints `endpoint: capnp://HOST:PORT`; others print
// `node: NAME`. SIGINT or SIGTERM stops a node cleanly (the gateway drains first).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/http_gateway.hpp"
#include "actors/gateway/router_calls.hpp"
#include "actors/gateway/rpc_gateway.hpp"
#include "actors/replica.hpp"
#include "actors/router_actor.hpp"
#include "engine/forward/forward_shard.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "actors/scheduler_actor.hpp"
#include "tools/common/cli.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/common/topology.hpp"

using namespace troupe;

// Raises the soft limit on open descriptors to the hard one; returns the limit now.
static int64_t raise_open_file_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur < r.rlim_max) {
    rlimit want = r;
    want.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  return r.rlim_cur == RLIM_INFINITY ? int64_t{1} << 30 : static_cast<int64_t>(r.rlim_cur);
}

int main(int argc, char** argv) {
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
  std::string topo_path, node_name, capnp_override, http_override;
  app.add_option("topology", topo_path, "topology file (deploy/*.toml)")->required();
  app.add_option("--node", node_name, "this process's node name (default: the gateway's node)");
  app.add_option("--capnp", capnp_override, "serve the client API here instead (HOST:PORT; port 0 picks a free one)")
      ->check(tools::host_port(true));
  app.add_option("--http", http_override, "serve the OpenAI-compatible HTTP API here (HOST:PORT; port 0 picks a free one)")
      ->check(tools::host_port(true));
  CLI11_PARSE(app, argc, argv);

  // Logs go to stderr (stdout carries the endpoint lines), one line each, timestamped.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("troupe"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
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
  if (const std::string w = tools::topology_warnings(*topo, m.config); !w.empty())
    std::fprintf(stderr, "troupe-node %s: %s\n", node_name.c_str(), w.c_str());
  // (Checked as HOST:PORT when parsed.)
  auto override_endpoint = [](const std::string& text, tools::endpoint& ep) {
    const size_t colon = text.rfind(':');
    ep.host = text.substr(0, colon);
    ep.port = static_cast<uint16_t>(std::stol(text.substr(colon + 1)));
  };
  tools::endpoint ep = topo->capnp, http_ep = topo->http;
  if (!capnp_override.empty()) override_endpoint(capnp_override, ep);
  if (!http_override.empty()) override_endpoint(http_override, http_ep);
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
  if (!loopback(ep.host) && api_keys.empty()) {
    std::fprintf(stderr, "troupe-node: the Cap'n Proto endpoint %s is not on loopback: name an api_keys_file in [gateway]\n",
                 ep.str().c_str());
    return 1;
  }
  if (serve_http && !loopback(http_ep.host) && api_keys.empty()) {
    std::fprintf(stderr, "troupe-node: the HTTP endpoint %s is not on loopback: name an api_keys_file in [gateway]\n",
                 http_ep.str().c_str());
    return 1;
  }

  // Requests in flight each endpoint admits (more are refused at once).
  const int32_t max_requests = std::max(1, topo->max_running * 4);

  // Every client connection holds a descriptor: the soft limit on them goes up to the
  // hard one (often 1024 of 500,000 or more), and a gateway says when even that leaves
  // less room than its endpoints may hold at once. (Short of that, endpoints out of
  // descriptors take them from each other as they are freed, and a flood on one can keep
  // the other's clients waiting until its idle connections time out.)
  if (node_name == topo->gateway_node) {
    const int64_t room = raise_open_file_limit() - 256;  // the node's own files and peers
    http_config caps;
    caps.max_connections = topo->max_connections;
    caps.max_requests = max_requests;
    const int64_t wanted = int64_t{topo->max_connections} + (serve_http ? connection_cap(caps) : 0);
    if (room < wanted)
      std::fprintf(stderr,
                   "troupe-node %s: the open-file limit (ulimit -n) leaves room for about %lld client connections, "
                   "fewer than the %lld the gateway's endpoints may hold at once (max_connections %d%s); raise the "
                   "hard limit or lower max_connections in [gateway]\n",
                   node_name.c_str(), static_cast<long long>(std::max<int64_t>(room, 0)), static_cast<long long>(wanted),
                   topo->max_connections, serve_http ? " on each of two endpoints" : "");
  }

  // A peer that closes its connection while this node writes to it is an error of that
  // write, never the end of the node (the HTTP library writes without MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  // Block the stop signals before any thread starts, so only the wait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const tools::node_spec* me = nullptr;
  for (const auto& n : topo->nodes)
    if (n.name == node_name) me = &n;
  auto node_of = [&](const std::string& name) -> const tools::node_spec& {
    for (const auto& n : topo->nodes)
      if (n.name == name) return n;
    return *me;
  };
  system_config cfg(failure_detection{std::chrono::milliseconds(topo->failure.heartbeat_ms),
                                       std::chrono::milliseconds(topo->failure.timeout_ms)});
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  // This node's supervised units: its stages, and the schedulers placed here. Stages on
  // other nodes are found by name through those nodes' agents.
  std::vector<unit_spec> units;
  size_t num_stages_here = 0;
  for (const auto& rs : topo->replicas) {
    for (size_t i = 0; i < rs.stages.size(); ++i) {
      const auto& s = rs.stages[i];
      if (s.node != node_name) continue;
      const int32_t tp = static_cast<int32_t>(s.devices.size());
      stage_layout one{s.first_layer, tools::end_layer(s, m.config.num_layers), tp, std::max(1, me->threads / tp)};
      one.devices = s.devices;
      one.link_host = me->host;
      one.kv_type = topo->kv_cache_type;
      one.gpu_weights = dtype_named(topo->gpu_weights).value();  // (checked when the topology was read)
      for (const auto& d : s.devices) {
        if (d == "cpu") continue;
        auto index = cuda_device_index(d);
        status usable = index ? cuda_device_usable(*index) : status(index.err());
        if (!usable) {
          std::fprintf(stderr, "troupe-node %s: replica '%s', stage %zu: %s\n", node_name.c_str(), rs.name.c_str(), i,
                       usable.err().message.c_str());
          return 1;
        }
      }
      units.push_back(stage_unit(m, rs.name, i, one, static_cast<uint32_t>(topo->num_blocks), topo->block_size,
                                 topo->max_step_tokens));
      ++num_stages_here;
    }
    if (rs.scheduler_node != node_name) continue;
    scheduler_setup setup;
    setup.m = &m;
    setup.tok = &*loaded->tok;
    setup.replica = rs.name;
    setup.config.num_blocks = static_cast<uint32_t>(topo->num_blocks);
    setup.config.block_size = topo->block_size;
    setup.config.prefix_caching = topo->prefix_caching;
    setup.config.max_step_tokens = topo->max_step_tokens;
    setup.config.max_running = topo->max_running;
    setup.config.context = m.config.max_seq_len;
    setup.config.vocab = m.config.vocab_size;
    setup.max_in_flight = static_cast<int32_t>(rs.stages.size());
    setup.config.micro_batches = setup.max_in_flight;
    setup.recovery_timeout = std::chrono::seconds(topo->failure.recovery_timeout_s);
    for (size_t i = 0; i < rs.stages.size(); ++i) {
      const auto& peer = node_of(rs.stages[i].node);
      if (peer.name == node_name) setup.stages.push_back({stage_name(rs.name, i), "", 0});
      else setup.stages.push_back({stage_name(rs.name, i), peer.host, peer.port});
    }
    kv_manager_setup kv;
    kv.num_blocks = setup.config.num_blocks;
    kv.block_size = setup.config.block_size;
    kv.prefix_caching = setup.config.prefix_caching;
    kv.context = setup.config.context;
    units.push_back(kv_manager_unit(rs.name, kv));
    setup.kv_manager = kv_manager_name(rs.name);
    units.push_back(scheduler_unit(rs.name, setup));
  }
  caf::actor agent = spawn_node_agent(sys, node_name, std::move(units));
  // Other nodes (and troupe-launch chaos) reach this node's agent at its port.
  auto bound = sys.middleman().publish(agent, me->port, me->host.c_str(), true);
  if (!bound) {
    std::fprintf(stderr, "troupe-node %s: cannot listen on %s:%u: %s\n", node_name.c_str(), me->host.c_str(),
                 static_cast<unsigned>(me->port), sys.render(bound.error()).c_str());
    self->send_exit(agent, caf::exit_reason::user_shutdown);
    return 1;
  }

  // The round trip to the next node of a pipeline, measured once it answers, so operators
  // see the cost of a hop (printed; BENCHMARKS.md quotes it).
  std::atomic<bool> stopping{false};
  std::thread hop_report;
  for (const auto& rs : topo->replicas) {
    for (size_t i = 0; i + 1 < rs.stages.size() && !hop_report.joinable(); ++i) {
      if (rs.stages[i].node != node_name || rs.stages[i + 1].node == node_name) continue;
      const tools::node_spec peer = node_of(rs.stages[i + 1].node);
      hop_report = std::thread([&sys, &stopping, peer, node_name] {
        for (int attempt = 0; attempt < 300 && !stopping; ++attempt) {
          auto dir = sys.middleman().remote_actor(peer.host, peer.port);
          if (!dir) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            continue;
          }
          caf::scoped_actor ping{sys};
          std::vector<double> us;
          for (uint64_t k = 0; k < 200 && !stopping; ++k) {
            const auto t0 = std::chrono::steady_clock::now();
            ping->request(*dir, std::chrono::seconds(5), ping_atom_v, k).receive([](uint64_t) {}, [](caf::error&) {});
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          }
          if (us.size() < 200) return;
          std::sort(us.begin(), us.end());
          std::fprintf(stderr, "troupe-node %s: round trip to node %s: median %.0f us, p90 %.0f us (200 pings)\n",
                       node_name.c_str(), peer.name.c_str(), us[us.size() / 2], us[us.size() * 9 / 10]);
          return;
        }
      });
    }
  }

  const bool is_gateway = topo->gateway_node == node_name;
  caf::actor router;
  if (is_gateway) {
    router_setup rs;
    rs.agent = agent;
    rs.wait_timeout = std::chrono::seconds(topo->failure.recovery_timeout_s);
    for (const auto& n : topo->nodes)
      rs.nodes.push_back({n.name, n.name == node_name ? "" : n.host, n.name == node_name ? uint16_t{0} : n.port});
    for (const auto& r : topo->replicas) {
      const auto& n = node_of(r.scheduler_node);
      rs.replicas.push_back({r.name, scheduler_name(r.name), n.name == node_name ? "" : n.host, n.name == node_name ? uint16_t{0} : n.port});
    }
    router = spawn_router(sys, rs);
  }

  int rc = 0;
  if (!is_gateway) {
    std::fprintf(stderr, "troupe-node %s: serving %zu stage(s) at %s:%u\n", node_name.c_str(), num_stages_here,
                 me->host.c_str(), static_cast<unsigned>(me->port));
    std::printf("node: %s\n", node_name.c_str());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "troupe-node %s: stopping (signal %d)\n", node_name.c_str(), sig);
  } else {
    // Both APIs' requests counted together, for /metrics.
    auto metrics = std::make_shared<gateway_metrics>();
    rpc_gateway gateway(sys, router, api_keys, metrics);
    http_config hc;
    hc.host = http_ep.host;
    hc.port = http_ep.port;
    hc.model_id = topo->model_name;
    hc.chat = topo->chat_template == "auto" ? openai::template_for_model(m.chat_template)
                                            : *openai::template_named(topo->chat_template);
    if (serve_http)
      std::fprintf(stderr, "troupe-node %s: chat template %s (%s)\n", node_name.c_str(), openai::template_name(hc.chat),
                   topo->chat_template == "auto" ? (m.chat_template.empty() ? "the model has none" : "from the model")
                                                 : "from the topology");
    hc.limits.context = m.config.max_seq_len;
    hc.limits.max_tokens = m.config.max_seq_len;
    hc.max_requests = max_requests;
    hc.max_connections = topo->max_connections;
    hc.cors_origins = topo->cors_origins;
    hc.read_timeout_s = topo->read_timeout_s;
    hc.api_keys = api_keys;
    hc.tok = &*loaded->tok;
    hc.metrics = metrics;
    hc.prefix_cache_per_key = topo->prefix_cache_per_key;
    http_gateway http(sys, router, hc);
    if (serve_http) {
      auto hp = http.start();
      if (!hp) {
        std::fprintf(stderr, "troupe-node: %s\n", hp.err().message.c_str());
        return 1;
      }
      std::printf("endpoint: http://%s:%u\n", http_ep.host.c_str(), static_cast<unsigned>(*hp));
    }
    // The endpoint is announced once a replica can serve (a canary step passed), or after
    // the recovery timeout with a warning. A stop signal meanwhile ends the wait, and the
    // node stops without serving.
    const auto ready_by = std::chrono::steady_clock::now() + std::chrono::seconds(topo->failure.recovery_timeout_s);
    int stopped_early = 0;
    for (;;) {
      if (ask_health(sys, router, false).ready) break;
      const timespec no_wait{0, 0};
      if ((stopped_early = sigtimedwait(&stop_signals, nullptr, &no_wait)) > 0) break;
      if (std::chrono::steady_clock::now() > ready_by) {
        std::fprintf(stderr, "troupe-node %s: no replica is ready yet; serving anyway (health says why)\n", node_name.c_str());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (stopped_early > 0) {
      std::fprintf(stderr, "troupe-node %s: stopping (signal %d) before any replica was ready\n", node_name.c_str(),
                   stopped_early);
    } else if (auto port = gateway.start(ep.host, ep.port, {max_requests, topo->max_connections, topo->read_timeout_s, topo->prefix_cache_per_key});
               !port) {
      std::fprintf(stderr, "troupe-node: %s\n", port.err().message.c_str());
      rc = 1;
    } else {
      std::fprintf(stderr, "troupe-node %s: serving %s (%s; %s; on CPUs: %s), %zu replica(s)\n", node_name.c_str(),
                   m.path.c_str(), m.format.c_str(), describe(m.config).c_str(), transformer_shard::cpu_kernels(m, topo->kv_cache_type).c_str(),
                   topo->replicas.size());
      std::printf("endpoint: capnp://%s:%u\n", ep.host.c_str(), static_cast<unsigned>(*port));
      std::fflush(stdout);
      int sig = 0;
      sigwait(&stop_signals, &sig);
      // Drain: no new requests; those in flight finish (for up to 30 s).
      gateway.drain();
      http.drain();
      std::fprintf(stderr, "troupe-node %s: draining (signal %d)\n", node_name.c_str(), sig);
      for (int i = 0; i < 300; ++i) {
        const router_stats busy = ask_stats(sys, router);
        if (busy.running + busy.waiting == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::fprintf(stderr, "troupe-node %s: stopping\n", node_name.c_str());
    }
    gateway.stop();
    http.stop();
  }
  stopping = true;
  if (hop_report.joinable()) hop_report.join();
  if (router) self->send_exit(router, caf::exit_reason::user_shutdown);
  self->send_exit(agent, caf::exit_reason::user_shutdown);
  return rc;
}

// troupe-node: one process of a topology. Its node agent spawns and supervises the stages
// (with their shards) and the schedulers placed on this node, and is published at the
// node's port, where schedulers, the router and troupe-launch chaos find actors by name
// (CAF's middleman, heartbeats with the topology's timeouts). The gateway's node also runs
// the router and the client APIs, and prints `endpoint: capnp://HOST:PORT`; others print
// `node: NAME`. SIGINT or SIGTERM stops a node cleanly (the gateway drains first).
//
// What runs where is tools/common/node_plan.hpp's; this only wires it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "actors/caf/errors.hpp"
#include "actors/caf/system_config.hpp"
#include "actors/tls/node_links.hpp"
#include "actors/tls/tls_links.hpp"
#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/forward_shard.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/troupe-node/node_options.hpp"
#include "tools/troupe-node/node_serving.hpp"

using namespace troupe;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "troupe-node: %s\n", what.c_str());
  return 1;
}

// The actor system's teardown waits for every actor's thread: one blocked on a peer (a
// lookup's connection to a host gone dark, at most seconds through node_links) or a thread
// that does not end would hold a stopped node. It ends within `grace` whatever it waits
// for, and says so.
void exit_within(std::chrono::seconds grace, const std::string& node, int rc) {
  std::thread([grace, node, rc] {
    std::this_thread::sleep_for(grace);
    std::fprintf(stderr, "troupe-node %s: still stopping after %lld s (waiting on a peer or a thread); exiting\n",
                 node.c_str(), static_cast<long long>(grace.count()));
    std::fflush(nullptr);
    std::_Exit(rc);
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  tools::node_options opt;
  if (auto rc = tools::parse_node_options(argc, argv, opt)) return *rc;
  // Logs go to stderr (stdout carries the endpoint lines), one line each, timestamped.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("troupe"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");

  auto topo = tools::parse_topology(opt.topology);
  if (!topo) return fail(topo.err().message);
  if (opt.node.empty()) opt.node = topo->gateway.node;
  if (!topo->node_named(opt.node)) return fail(opt.topology + ": no node named '" + opt.node + "'");
  // Links to other nodes over TLS: this node's files checked before anything loads.
  std::shared_ptr<tls::context> tls_ctx;
  if (topo->tls.on()) {
    auto ctx = tls::context::load({topo->tls.ca, topo->tls.cert_of(opt.node), topo->tls.key_of(opt.node)});
    if (!ctx) return fail(opt.node + ": [tls]: " + ctx.err().message + " (troupe-launch certs " + opt.topology + " makes them)");
    tls_ctx = *ctx;
    set_process_link_guard(tls::link_guard_of(tls_ctx));  // step links and KV channels
  }
  std::fprintf(stderr, "troupe-node %s: loading %s\n", opt.node.c_str(), topo->model.path.c_str());
  auto loaded = tools::load_model_and_tokenizer(topo->model.path, topo->model.tokenizer);
  if (!loaded) return fail(loaded.err().message);
  const model& m = loaded->m;
  const int32_t gs = m.weight_type == dtype::q8_0 ? m.weights.layers[0].wq.group_size : 0;
  if (auto v = tools::validate_topology(*topo, m.config, gs); !v) return fail(v.err().message);
  if (const std::string w = tools::topology_warnings(*topo, m.config); !w.empty())
    std::fprintf(stderr, "troupe-node %s: %s\n", opt.node.c_str(), w.c_str());
  if (const tools::node_spec* me = topo->node_named(opt.node))
    if (const std::string w = tools::insecure_ports_warning(*topo, *me); !w.empty())
      std::fprintf(stderr, "troupe-node %s: %s\n", opt.node.c_str(), w.c_str());
  // The draft model is loaded where a replica's draft actor runs, trained heads where a
  // scheduler runs (it drafts from them).
  const auto method = parse_spec_method(topo->speculative.method);
  const bool heads = method && (*method == spec_method::medusa || *method == spec_method::eagle);
  const bool loads_here = std::any_of(topo->replicas.begin(), topo->replicas.end(), [&](const tools::replica_spec& r) {
    return (heads ? r.scheduler_node : r.draft_node) == opt.node;
  });
  tools::speculative_models spec_models;
  auto spec = loads_here ? tools::speculative_from(topo->speculative, m, &loaded->tok->vocab(), spec_models, true)
                         : tools::speculative_config_of(topo->speculative, m.config, true);
  if (!spec) return fail(opt.topology + ": " + spec.err().message);
  const std::optional<model>& draft = spec_models.draft;
  if (loads_here && spec->enabled()) {
    const std::string with = draft                ? ", draft " + topo->speculative.draft
                             : spec_models.heads ? ", " + spec_models.heads->describe() + " from " + topo->speculative.heads
                                                 : "";
    std::fprintf(stderr, "troupe-node %s: speculative decoding by %s, %s%s\n", opt.node.c_str(),
                 std::string(spec_method_name(spec->method)).c_str(), spec->drafts_text().c_str(), with.c_str());
  }
  const std::shared_ptr<const speculative_heads> loaded_heads = std::move(spec_models.heads);
  auto plan = tools::plan_node(*topo, m, *loaded->tok, opt.node, opt.overrides, draft ? &*draft : nullptr, loaded_heads);
  if (!plan) return fail(plan.err().message);
  for (const auto& s : plan->stages)
    for (const auto& d : s.layout.devices) {
      if (d == "cpu") continue;
      auto index = cuda_device_index(d);
      const status usable = index ? cuda_device_usable(*index) : status(index.err());
      if (!usable)
        return fail(opt.node + ": replica '" + s.replica + "', stage " + std::to_string(s.index) + ": " +
                    usable.err().message);
    }
  std::vector<std::string> api_keys;
  if (plan->gateway) {
    auto keys = tools::gateway_keys(*topo, *plan->gateway);
    if (!keys) return fail(keys.err().message);
    api_keys = std::move(keys).value();
    tools::fit_connections_to_descriptors(opt.node, *plan->gateway);
  }

  // A peer that closes its connection while this node writes to it is an error of that
  // write, never the end of the node (not every library writes with MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  // Block the stop signals before any thread starts, so only the serving waits see them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  system_config cfg(plan->failure);
  caf::actor_system sys{cfg};
  node_links_scope links(sys, tls_ctx);
  // KV tiers: the node's figures, summed over its shards' tiers, for /metrics.
  std::shared_ptr<tier_meter> meter;
  if (!topo->kv.tiers.empty()) {
    meter = std::make_shared<tier_meter>();
    for (auto& s : plan->stages) s.layout.meter = meter;
    std::string kinds;
    for (const tier_config& t : topo->kv.tiers)
      kinds += (kinds.empty() ? "" : ", ") + std::string(tier_kind_name(t.kind)) +
               (t.kind == tier_kind::disk ? " " + t.path : t.kind == tier_kind::redis ? " " + t.address : "");
    std::fprintf(stderr, "troupe-node %s: KV tiers below the pool: %s\n", opt.node.c_str(), kinds.c_str());
  }
  // What strangers and stalled peers did to this node's step links and KV landings.
  auto links_meter = std::make_shared<link_meter>();
  for (auto& s : plan->stages) s.layout.links = links_meter;
  caf::actor agent = spawn_node_agent(sys, opt.node, tools::units_of(*plan, m), meter, links_meter);
  // Other nodes (and troupe-launch chaos) reach this node's agent at its port.
  const tools::node_spec& me = plan->node;
  if (tls_ctx)
    std::fprintf(stderr, "troupe-node %s: links to other nodes (actors, step links, KV) over TLS (%s, trusting %s)\n", opt.node.c_str(),
                 tls_ctx->files().cert.c_str(), tls_ctx->files().ca.c_str());
  if (auto bound = publish_agent(sys, agent, me.port, me.host); !bound) {
    caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
    return fail(opt.node + ": cannot listen on " + me.host + ":" + std::to_string(me.port) + ": " +
                reason_of(bound.error()));
  }
  std::atomic<bool> stopping{false};
  std::thread hop = tools::report_hop(sys, *plan, stopping);
  const int rc = plan->gateway ? tools::serve_gateway(sys, agent, *plan, *topo, *loaded, std::move(api_keys), stop_signals)
                               : tools::serve_stages(*plan, stop_signals);
  stopping = true;
  exit_within(std::chrono::seconds(5), opt.node, rc);
  if (hop.joinable()) hop.join();
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  return rc;  // the actor system stops as it goes out of scope
}

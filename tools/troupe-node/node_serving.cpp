#include "tools/troupe-node/node_serving.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/agent_link.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/router_calls.hpp"
#include "actors/replica.hpp"
#include "actors/tls/kj_tls.hpp"
#include "engine/forward/transformer_shard.hpp"

namespace troupe::tools {

std::vector<unit_spec> units_of(const node_plan& p, const model& m) {
  std::vector<unit_spec> units;
  for (const auto& s : p.stages) units.push_back(stage_unit(m, s.replica, s.index, s.layout));
  for (const auto& s : p.schedulers) {
    units.push_back(kv_manager_unit(s.replica, s.kv));
    units.push_back(scheduler_unit(s.replica, s.setup));
  }
  for (const auto& d : p.drafts) units.push_back(draft_unit(d.replica, d.setup));
  return units;
}

std::thread report_hop(caf::actor_system& sys, const node_plan& p, std::atomic<bool>& stopping) {
  if (!p.next_hop) return {};
  return std::thread([&sys, &stopping, peer = *p.next_hop, node = p.node.name] {
    for (int attempt = 0; attempt < 300 && !stopping; ++attempt) {
      auto dir = connect_agent(sys, peer.host, peer.port);
      if (!dir) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // not up yet: try again
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
      std::fprintf(stderr, "troupe-node %s: round trip to node %s: median %.0f us, p90 %.0f us (200 pings)\n", node.c_str(),
                   peer.name.c_str(), us[us.size() / 2], us[us.size() * 9 / 10]);
      return;
    }
  });
}

int serve_stages(const node_plan& p, const sigset_t& stop_signals) {
  std::fprintf(stderr, "troupe-node %s: serving %zu stage(s) at %s:%u\n", p.node.name.c_str(), p.stages.size(),
               p.node.host.c_str(), static_cast<unsigned>(p.node.port));
  std::printf("node: %s\n", p.node.name.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "troupe-node %s: stopping (signal %d)\n", p.node.name.c_str(), sig);
  return 0;
}

namespace {

// Waits until a replica is ready (the router answers as soon as one is), a stop signal
// comes (its number), or `by` passes (0 either way).
int wait_ready(caf::actor_system& sys, const caf::actor& router, const sigset_t& stop_signals,
               std::chrono::steady_clock::time_point by) {
  caf::scoped_actor self{sys};
  for (bool ready = false; !ready && std::chrono::steady_clock::now() < by;) {
    self->request(router, std::chrono::milliseconds(100), health_atom_v, uint32_t{1})
        .receive([&](uint32_t) { ready = true; }, [](caf::error&) {});
    const timespec no_wait{0, 0};
    if (const int sig = sigtimedwait(&stop_signals, nullptr, &no_wait); sig > 0) return sig;
  }
  return 0;
}

}  // namespace

int serve_gateway(caf::actor_system& sys, const caf::actor& agent, const node_plan& p, const topology& t,
                  const loaded_model& model, std::vector<std::string> api_keys, const sigset_t& stop_signals) {
  const gateway_plan& g = *p.gateway;
  const std::string& node = p.node.name;
  rpc_limits rpc = g.rpc;
  if (!t.gateway.tls_cert.empty()) {
    auto ctx = tls::endpoint_context::server(t.gateway.tls_cert, t.gateway.tls_key);
    if (!ctx) {
      std::fprintf(stderr, "troupe-node %s: [gateway] tls_cert, tls_key: %s\n", node.c_str(), ctx.err().message.c_str());
      return 1;
    }
    rpc.tls = *ctx;
  }
  router_setup rs = g.router;
  rs.agent = agent;
  rs.tok = &*model.tok;
  caf::actor router = spawn_router(sys, rs);
  // Both APIs' requests counted together, for /metrics.
  auto metrics = std::make_shared<gateway_metrics>();
  rpc_gateway gateway(sys, router, api_keys, metrics);
  http_config hc = g.http;
  hc.api_keys = std::move(api_keys);
  hc.tok = &*model.tok;
  hc.limits.context_prompt_bytes = prompt_text_limit(*model.tok, hc.limits.context, hc.limits.max_prompt_bytes);
  hc.metrics = metrics;
  hc.tls = rpc.tls;  // the same certificate: HTTPS
  http_gateway http(sys, router, hc);
  int rc = 0;
  std::fprintf(stderr, "troupe-node %s: vocabulary %s (%s)\n", node.c_str(), describe(model.tok->vocab()).c_str(),
               model.tokenizer_source.empty() ? "the model's own" : model.tokenizer_source.c_str());
  if (g.serve_http) {
    std::fprintf(stderr, "troupe-node %s: chat template %s (%s)\n", node.c_str(), openai::template_name(hc.chat),
                 t.model.chat_template == "auto" ? (model.m.chat_template.empty() ? "the model has none" : "from the model")
                                                 : "from the topology");
    auto port = http.start();
    if (!port) {
      std::fprintf(stderr, "troupe-node: %s\n", port.err().message.c_str());
      rc = 1;
    } else {
      std::printf("endpoint: %s://%s:%u\n", hc.tls ? "https" : "http", g.http_endpoint.host.c_str(),
                  static_cast<unsigned>(*port));
    }
  }
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(t.failure.recovery_timeout_s);
  const int early = rc == 0 ? wait_ready(sys, router, stop_signals, by) : 0;
  if (rc == 0 && early > 0) {
    std::fprintf(stderr, "troupe-node %s: stopping (signal %d) before any replica was ready\n", node.c_str(), early);
  } else if (rc == 0) {
    if (std::chrono::steady_clock::now() >= by)
      std::fprintf(stderr, "troupe-node %s: no replica is ready yet; serving anyway (health says why)\n", node.c_str());
    auto port = gateway.start(g.capnp_endpoint.host, g.capnp_endpoint.port, rpc);
    if (!port) {
      std::fprintf(stderr, "troupe-node: %s\n", port.err().message.c_str());
      rc = 1;
    } else {
      const troupe::model& m = model.m;
      std::fprintf(stderr, "troupe-node %s: serving %s (%s; %s; on CPUs: %s), %zu replica(s)\n", node.c_str(),
                   m.path.c_str(), m.format.c_str(), describe(m.config).c_str(),
                   transformer_shard::cpu_kernels(m, t.kv.cache_type).c_str(), t.replicas.size());
      std::printf("endpoint: %s://%s:%u\n", rpc.tls ? "capnps" : "capnp", g.capnp_endpoint.host.c_str(),
                  static_cast<unsigned>(*port));
      std::fflush(stdout);
      int sig = 0;
      sigwait(&stop_signals, &sig);
      // Drain: no new requests; those in flight finish (for up to 30 s).
      gateway.drain();
      http.drain();
      std::fprintf(stderr, "troupe-node %s: draining (signal %d)\n", node.c_str(), sig);
      for (int i = 0; i < 300; ++i) {
        const router_stats busy = ask_stats(sys, router);
        if (busy.running + busy.waiting == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::fprintf(stderr, "troupe-node %s: stopping\n", node.c_str());
    }
  }
  gateway.stop();
  http.stop();
  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  return rc;
}

}  // namespace troupe::tools

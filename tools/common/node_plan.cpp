#include "tools/common/node_plan.hpp"

#include <algorithm>

#include "actors/gateway/openai.hpp"
#include "actors/replica.hpp"
#include "engine/forward/kv_cache_type.hpp"
#include "engine/forward/shard_tiers.hpp"
#include "engine/serve/llm_engine.hpp"

namespace troupe::tools {

namespace {

// The shards of stage `i` of replica `r`, run by node `me`.
stage_layout layout_of(const topology& t, const model& m, const replica_spec& r, size_t i, const node_spec& me) {
  const stage_spec& s = r.stages[i];
  stage_layout l;
  const auto tp = static_cast<int32_t>(s.devices.size());
  l.first_layer = s.first_layer;
  l.end_layer = end_layer(s, m.config.num_layers);
  l.tp = tp;
  l.threads_per_shard = std::max(1, me.threads / tp);
  l.devices = s.devices;
  l.gpu_weights = t.gpu.weights;
  l.link_host = me.host;
  l.link_ports = me.link_ports;
  l.kv = kv_of(t, r);
  l.max_step_tokens = t.scheduler.max_step_tokens;
  // Disaggregation: a decode stage takes KV on its port; a prefill stage sends each
  // decode replica's counterpart stage its blocks.
  if (r.role == replica_role::decode) {
    l.kv_listen_host = me.host;
    l.kv_listen_port = s.kv_port;
  }
  if (r.role == replica_role::prefill)
    for (const replica_spec& d : t.replicas)
      if (d.role == replica_role::decode)
        l.kv_peers.push_back({d.name, t.node_named(d.stages[i].node)->host, d.stages[i].kv_port});
  return l;
}

// Where a scheduler or the router finds an actor of node `peer`: through its own agent
// when it is on node `me`, else through the agent published at the peer's port.
stage_address address_of(const std::string& name, const node_spec& peer, const node_spec& me) {
  if (peer.name == me.name) return {name, "", 0};
  return {name, peer.host, peer.port};
}

scheduler_placement scheduler_of(const topology& t, const model& m, const tokenizer& tok, const replica_spec& r,
                                 const node_spec& me) {
  scheduler_placement p;
  p.replica = r.name;
  scheduler_setup& s = p.setup;
  s.m = &m;
  s.tok = &tok;
  s.replica = r.name;
  s.config = t.scheduler;
  const kv_config kv = kv_of(t, r);
  s.config.kv = kv;
  s.config.context = m.config.max_seq_len;
  s.config.vocab = m.config.vocab_size;
  // One plan in flight per stage keeps every stage of the pipeline busy.
  s.max_in_flight = static_cast<int32_t>(r.stages.size());
  s.config.micro_batches = s.max_in_flight;
  s.recovery_timeout = std::chrono::seconds(t.failure.recovery_timeout_s);
  for (size_t i = 0; i < r.stages.size(); ++i)
    s.stages.push_back(address_of(stage_name(r.name, i), *t.node_named(r.stages[i].node), me));
  s.kv_manager = kv_manager_name(r.name);
  if (!kv.tiers.empty()) {
    const dtype kv_type = kv.cache_type.value_or(kv_cache_type_for(m));
    s.config.tier_blocks = tier_directory_blocks(kv, m.config, kv_type);
    s.config.tier_prefetch = kv.tiers.size() > 1;
    // Each shard's names in the tiers, and those tiers the scheduler can look in: Redis,
    // and a directory when every stage runs on this node.
    bool all_here = true;
    for (const stage_spec& st : r.stages) {
      all_here = all_here && st.node == me.name;
      const auto tp = static_cast<int32_t>(st.devices.size());
      for (int32_t rank = 0; rank < tp; ++rank) {
        const shard_spec spec{st.first_layer, end_layer(st, m.config.num_layers), tp_slice{rank, tp}};
        s.tier_prefixes.push_back(tier_prefix(
            m, spec, transformer_shard::cache_shape(m.config, spec, static_cast<int32_t>(kv.num_blocks), kv.block_size, kv_type)));
      }
    }
    for (const tier_config& tc : kv.tiers)
      if (tc.kind == tier_kind::redis || (tc.kind == tier_kind::disk && all_here)) s.probe_tiers.push_back(tc);
  }
  p.kv.kv = kv;
  p.kv.context = m.config.max_seq_len;
  return p;
}

// The replicas and their stages, as the status page shows them.
std::vector<replica_layout> layout_of(const topology& t, int32_t num_layers) {
  std::vector<replica_layout> out;
  for (const replica_spec& r : t.replicas) {
    replica_layout& l = out.emplace_back();
    l.name = r.name;
    for (const stage_spec& s : r.stages)
      l.stages.push_back({s.node, std::to_string(s.first_layer) + "-" + std::to_string(end_layer(s, num_layers) - 1), s.devices});
  }
  return out;
}

gateway_plan gateway_of(const topology& t, const model& m, const node_spec& me, const endpoint_overrides& o, int index) {
  gateway_plan g;
  const gateway_place place = t.gateway.places()[static_cast<size_t>(index)];
  g.capnp_endpoint = o.capnp.value_or(place.capnp);
  g.http_endpoint = o.http.value_or(place.http);
  g.serve_http = o.http.has_value() || place.http.port != 0;
  g.index = index;
  g.rpc.gateway = g.http.gateway = g.router.route.gateway = static_cast<uint32_t>(index);
  // Completions in flight each endpoint admits (actors/gateway/admission.hpp).
  const int32_t max_requests = std::max(1, t.scheduler.max_running * 4);
  g.rpc.max_requests = max_requests;
  g.auto_connections = t.gateway.max_connections == 0;
  const int32_t max_connections = g.auto_connections ? 1024 : t.gateway.max_connections;
  g.rpc.max_connections = max_connections;
  g.rpc.greeting_timeout_s = t.gateway.read_timeout_s;
  g.rpc.prefix_cache_per_key = t.kv.prefix_cache_per_key;
  http_config& h = g.http;
  h.host = g.http_endpoint.host;
  h.port = g.http_endpoint.port;
  h.model_id = t.model.name;
  h.chat = t.model.chat_template == "auto" ? openai::template_for_model(m.chat_template)
                                           : openai::template_named(t.model.chat_template).value_or(openai::chat_template::raw);
  h.limits.context = m.config.max_seq_len;
  h.limits.max_tokens = m.config.max_seq_len;
  h.max_requests = max_requests;
  h.max_connections = max_connections;
  h.cors_origins = t.gateway.cors_origins;
  h.read_timeout_s = t.gateway.read_timeout_s;
  h.idle_timeout_s = t.gateway.idle_timeout_s;
  h.prefix_cache_per_key = t.kv.prefix_cache_per_key;
  h.layout = layout_of(t, m.config.num_layers);
  g.router.wait_timeout = std::chrono::seconds(t.failure.recovery_timeout_s);
  // Without a prefix cache there is nothing to route by.
  g.router.route.policy = t.kv.prefix_caching ? t.router.policy : route_policy::least_loaded;
  g.router.route.stream_tokens = t.router.stream_tokens;
  g.router.block_size = t.kv.block_size;
  g.router.classes = t.scheduler.classes;
  g.router.default_class = t.scheduler.default_class;
  g.router.context = m.config.max_seq_len;
  for (const auto& n : t.nodes) {
    const stage_address a = address_of("", n, me);
    g.router.nodes.push_back({n.name, a.host, a.port});
  }
  for (const auto& r : t.replicas) {
    const stage_address a = address_of(scheduler_name(r.name), *t.node_named(r.scheduler_node), me);
    g.router.replicas.push_back({r.name, a.name, a.host, a.port, r.role});
  }
  return g;
}

}  // namespace

expected<node_plan> plan_node(const topology& t, const model& m, const tokenizer& tok, const std::string& node,
                              const endpoint_overrides& overrides, const model* draft,
                              std::shared_ptr<const speculative_heads> heads) {
  const node_spec* me = t.node_named(node);
  if (me == nullptr) return error{t.path + ": no node named '" + node + "'"};
  auto spec = speculative_config_of(t.speculative, m.config, true);
  if (!spec) return error{t.path + ": " + spec.err().message};
  node_plan p;
  p.node = *me;
  p.failure = failure_detection{std::chrono::milliseconds(t.failure.heartbeat_ms),
                                std::chrono::milliseconds(t.failure.timeout_ms)};
  for (const auto& r : t.replicas) {
    for (size_t i = 0; i < r.stages.size(); ++i) {
      const stage_spec& s = r.stages[i];
      if (s.node == me->name) p.stages.push_back({r.name, i, layout_of(t, m, r, i, *me)});
      if (s.node == me->name && !p.next_hop && i + 1 < r.stages.size() && r.stages[i + 1].node != me->name)
        p.next_hop = *t.node_named(r.stages[i + 1].node);
    }
    const bool drafts = spec->method == spec_method::draft || spec->method == spec_method::early_exit;
    if (drafts && r.draft_node == me->name) {
      if (spec->method == spec_method::draft && draft == nullptr)
        return error{t.path + ": [speculative] method draft: the draft model is not loaded"};
      draft_setup d;
      d.m = spec->method == spec_method::draft ? draft : &m;
      d.spec = *spec;
      d.kv = t.kv;
      d.context = m.config.max_seq_len;
      d.threads = me->threads;
      p.drafts.push_back({r.name, d});
    }
    if (r.scheduler_node != me->name) continue;
    p.schedulers.push_back(scheduler_of(t, m, tok, r, *me));
    scheduler_setup& s = p.schedulers.back().setup;
    s.spec = *spec;
    if (spec->uses_heads() && !heads) return error{t.path + ": [speculative] method " + t.speculative.method + ": the head file is not loaded"};
    if (spec->uses_heads()) s.heads = heads;
    // KV eviction: the deployment's default, or requests' own, where the replica can run it.
    s.config.no_eviction = llm_engine::why_no_eviction(*spec).value_or("");
    s.config.sliding_window = m.config.sliding_window;
    const kv_eviction_config& ev = t.scheduler.eviction;
    if (ev.enabled() && !s.config.no_eviction.empty())
      return error{t.path + ": [kv] policy " + std::string(kv_policy_name(ev.policy)) + " in replica '" + r.name +
                   "': " + s.config.no_eviction};
    if (ev.enabled() && ev.budget > m.config.max_seq_len)
      return error{t.path + ": [kv] budget " + std::to_string(ev.budget) + " is past the model's context of " +
                   std::to_string(m.config.max_seq_len)};
    if (drafts) s.draft = address_of(draft_name(r.name), *t.node_named(r.draft_node), *me);
  }
  if (const int k = t.gateway.index_of(me->name); k >= 0) p.gateway = gateway_of(t, m, *me, overrides, k);
  return p;
}

}  // namespace troupe::tools

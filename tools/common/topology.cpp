#include "tools/common/topology.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "engine/forward/kv_cache_type.hpp"
#include "engine/forward/tp_slice.hpp"
#include "tools/common/topology_reader.hpp"

namespace troupe::tools {

namespace {

using namespace topology_impl;

// The names and ports every node, endpoint and replica claims: each once.
void check_names(reader& rd, const topology& t, const toml::table& root) {
  const toml::array* node_tables = root["node"].as_array();
  const toml::array* replica_tables = root["replica"].as_array();
  std::set<std::string> names;
  std::map<std::string, std::string> ports;  // host:port -> who
  std::vector<std::pair<endpoint, std::string>> claimed;
  auto claim = [&](const endpoint& e, const std::string& who, const toml::node* at) {
    auto [it, fresh] = ports.emplace(e.str(), who);
    if (!fresh) rd.fail(at, "port clash: " + who + " and " + it->second + " both use " + e.str());
    claimed.emplace_back(e, who);
  };
  for (size_t i = 0; rd.ok() && i < t.nodes.size(); ++i) {
    const node_spec& n = t.nodes[i];
    const toml::node* at = &(*node_tables)[i];
    if (!names.insert(n.name).second) rd.fail(at, "node name '" + n.name + "' is used twice");
    if (rd.ok() && t.tls.on() && n.name == tls_section::operator_name)
      rd.fail(at, "node name '" + n.name + "' is the operator's certificate under [tls]: name the node otherwise");
    claim({n.host, n.port}, "node '" + n.name + "'", at);
  }
  const toml::node* gw = root.get("gateway");
  std::set<std::string> gateway_nodes;
  for (const gateway_place& g : t.gateway.places()) {
    const std::string who = g.node == t.gateway.node ? "the gateway" : "gateway '" + g.node + "'";
    if (rd.ok() && !names.count(g.node)) rd.fail(gw, "[gateway] names unknown node '" + g.node + "'");
    if (rd.ok() && !gateway_nodes.insert(g.node).second)
      rd.fail(gw, "[gateway] names node '" + g.node + "' twice: a node runs one gateway");
    if (rd.ok()) claim(g.capnp, who + "'s capnp endpoint", gw);
    if (rd.ok() && g.http.port != 0) claim(g.http, who + "'s http endpoint", gw);
  }
  std::set<std::string> replica_names;
  for (size_t i = 0; rd.ok() && i < t.replicas.size(); ++i) {
    const replica_spec& r = t.replicas[i];
    const toml::node* at = &(*replica_tables)[i];
    if (!replica_names.insert(r.name).second) rd.fail(at, "replica name '" + r.name + "' is used twice");
    for (size_t s = 0; rd.ok() && s < r.stages.size(); ++s)
      if (!names.count(r.stages[s].node))
        rd.fail(at, "replica '" + r.name + "', stage " + std::to_string(s) + ": unknown node '" + r.stages[s].node + "'");
    if (rd.ok() && !names.count(r.scheduler_node))
      rd.fail(at, "replica '" + r.name + "': scheduler on unknown node '" + r.scheduler_node + "'");
    if (rd.ok() && !names.count(r.draft_node))
      rd.fail(at, "replica '" + r.name + "': draft actor on unknown node '" + r.draft_node + "'");
    for (size_t s = 0; rd.ok() && s < r.stages.size(); ++s)
      for (size_t k = 0; rd.ok() && r.stages[s].kv_port != 0 && k < r.stages[s].devices.size(); ++k)
        claim({t.node_named(r.stages[s].node)->host, static_cast<uint16_t>(r.stages[s].kv_port + k)},
              "replica '" + r.name + "', stage " + std::to_string(s) + ", shard " + std::to_string(k) + "'s KV channel", at);
  }
  // A node's link ports are its step links' alone.
  for (size_t i = 0; rd.ok() && i < t.nodes.size(); ++i) {
    const node_spec& n = t.nodes[i];
    if (n.link_ports.any()) continue;
    for (const auto& [e, who] : claimed)
      if (e.host == n.host && e.port >= n.link_ports.first && e.port <= n.link_ports.last) {
        rd.fail(&(*node_tables)[i], "port clash: link_ports " + n.link_ports.str() + " of node '" + n.name +
                                        "' take port " + std::to_string(e.port) + ", which " + who + " uses");
        break;
      }
  }
  // Disaggregation takes both halves.
  auto any = [&](replica_role role) {
    return std::any_of(t.replicas.begin(), t.replicas.end(), [&](const replica_spec& r) { return r.role == role; });
  };
  if (rd.ok() && any(replica_role::prefill) != any(replica_role::decode))
    rd.fail(replica_tables, any(replica_role::prefill)
                                ? "prefill replicas need a decode replica to hand their requests to (role = \"decode\")"
                                : "decode replicas need a prefill replica to compute their prompts (role = \"prefill\")");
  if (rd.ok() && any(replica_role::prefill) && !t.kv.prefix_caching)
    rd.fail(replica_tables, "prefill and decode replicas name KV blocks by their prefix: [kv] prefix_caching must be on");
}

// What a GPU shard does not honour is refused at the line that asks for it, naming the
// replica and device that would ignore it: a KV cache type (its cache is F32), KV tiers and
// prefill/decode roles (both move KV through host memory), and proposers or token trees
// that need what only CPU shards return.
void check_gpu_stages(reader& rd, const topology& t, const toml::table& root) {
  const toml::array* replica_tables = root["replica"].as_array();
  const toml::node* kv = root.get("kv");
  const toml::node* spec = root.get("speculative");
  const std::string& method = t.speculative.method;
  for (size_t i = 0; rd.ok() && i < t.replicas.size(); ++i) {
    const replica_spec& r = t.replicas[i];
    std::string gpu;
    for (const stage_spec& st : r.stages)
      if (gpu.empty() && st.devices[0] != "cpu") gpu = st.devices[0];
    if (gpu.empty()) continue;
    const std::string who = "replica '" + r.name + "' runs on " + gpu;
    if (t.kv.cache_type)
      rd.fail(kv->as_table()->get("cache_type"),
              "[kv] cache_type \"" + std::string(dtype_name(*t.kv.cache_type)) + "\": " + who +
                  ", and a GPU shard keeps its KV cache in F32: cache_type applies to CPU shards");
    else if (!t.kv.tiers.empty())
      rd.fail(&(*root["tier"].as_array())[0],
              who + ": KV tiers ([[tier]]) serve CPU shards; a GPU shard's cache stays on its device");
    else if (r.role != replica_role::both)
      rd.fail((*replica_tables)[i].as_table()->get("role"),
              "replica '" + r.name + "' (" + std::string(replica_role_name(r.role)) + ") runs on " + gpu +
                  ": prefill and decode replicas run on CPU shards (KV between GPUs is not sent yet)");
    else if (method == "medusa" || method == "eagle")
      rd.fail(spec->as_table()->get("method"), who + ": [speculative] method " + method +
                                                   " drafts from the features CPU shards return; a GPU shard proposes by n-gram only");
    else if (!t.speculative.tree.empty())
      rd.fail(spec->as_table()->get("tree"),
              who + ": [speculative] tree: on a GPU, speculative decoding verifies chains, not token trees");
  }
}

}  // namespace

kv_config kv_of(const topology& t, const replica_spec& r) {
  kv_config kv = t.kv;
  if (r.num_blocks > 0) kv.num_blocks = r.num_blocks;
  if (r.role == replica_role::decode && (kv.tiers.empty() || kv.tiers[0].kind != tier_kind::host)) {
    tier_config landing;
    landing.kind = tier_kind::host;
    landing.capacity_bytes = static_cast<uint64_t>(r.landing_mb) << 20;
    kv.tiers.insert(kv.tiers.begin(), landing);
  }
  return kv;
}

std::string tls_section::with_node(std::string pattern, const std::string& node) {
  for (size_t at = pattern.find("{node}"); at != std::string::npos; at = pattern.find("{node}", at + node.size()))
    pattern.replace(at, 6, node);
  return pattern;
}

std::string tls_section::ca_key() const {
  return std::filesystem::path(ca).replace_extension(".key").string();
}

const node_spec* topology::node_named(const std::string& name) const {
  for (const auto& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

expected<topology> parse_topology_text(const std::string& text, const std::string& name,
                                       const std::string& base_dir) {
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    return error{name + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column) + ": " +
                 std::string(e.description())};
  }
  reader rd(name);
  topology t;
  t.path = name;
  // Every table is one the format has, in the shape it has.
  for (const auto& [k, v] : root) {
    const std::string_view key = k.str();
    if (std::find(top_tables.begin(), top_tables.end(), key) == top_tables.end()) {
      rd.fail(&v, "unknown table [" + std::string(key) + "] (a topology has [model], [gateway], [kv], [scheduler], "
                  "[failure], [router], [gpu], [speculative], [tls], [[node]], [[replica]], [[tier]] and [[class]])");
      break;
    }
    const bool array = key == "node" || key == "replica" || key == "tier" || key == "class";
    if (array ? !v.is_array_of_tables() : !v.is_table()) {
      rd.fail(&v, array ? "[[" + std::string(key) + "]] must be an array of tables"
                        : "'" + std::string(key) + "' must be a table ([" + std::string(key) + "])");
      break;
    }
  }
  if (!rd.ok()) return error{rd.error_message()};
  const toml::table* model = root["model"].as_table();
  if (!model) return error{name + ": the [model] table is missing"};
  const toml::table* gateway = root["gateway"].as_table();
  if (!gateway) return error{name + ": the [gateway] table is missing"};
  t.model = parse_model(rd, *model, base_dir);
  if (rd.ok()) t.gateway = parse_gateway(rd, *gateway, base_dir);
  if (const toml::table* kv = root["kv"].as_table(); kv && rd.ok()) t.kv = parse_kv(rd, *kv);
  if (const toml::array* tiers = root["tier"].as_array()) {
    for (size_t i = 0; i < tiers->size() && rd.ok(); ++i) {
      const std::string w = "[[tier]] #" + std::to_string(i + 1);
      t.kv.tiers.push_back(parse_tier(rd, *(*tiers)[i].as_table(), w, base_dir));
      if (rd.ok() && t.kv.tiers.back().kind == tier_kind::host && i > 0)
        rd.fail((*tiers)[i].as_table(), w + ": the host tier comes first (the fastest, where loads look first)");
    }
    if (rd.ok() && !t.kv.prefix_caching)
      rd.fail(tiers, "[[tier]] keeps cached prefixes: [kv] prefix_caching must be on");
  }
  std::vector<slo_class> classes;
  if (const toml::array* cs = root["class"].as_array()) {
    for (size_t i = 0; i < cs->size() && rd.ok(); ++i) {
      const std::string w = "[[class]] #" + std::to_string(i + 1);
      classes.push_back(parse_class(rd, *(*cs)[i].as_table(), w));
      if (rd.ok() && slo_class_index(classes, classes.back().name) != static_cast<int32_t>(i))
        rd.fail((*cs)[i].as_table(), w + ": class name '" + classes.back().name + "' is used twice");
    }
  }
  if (const toml::table* s = root["scheduler"].as_table(); s && rd.ok()) {
    t.scheduler = parse_scheduler(rd, *s, classes);
  } else {
    t.scheduler.classes = classes;
    t.scheduler.slo_admission = !classes.empty();
  }
  if (const toml::table* kv = root["kv"].as_table(); kv && rd.ok()) t.scheduler.eviction = parse_kv_eviction(rd, *kv);
  if (const toml::table* f = root["failure"].as_table(); f && rd.ok()) t.failure = parse_failure(rd, *f);
  if (const toml::table* r = root["router"].as_table(); r && rd.ok()) t.router = parse_router(rd, *r);
  if (const toml::table* g = root["gpu"].as_table(); g && rd.ok()) t.gpu = parse_gpu(rd, *g);
  if (const toml::table* sp = root["speculative"].as_table(); sp && rd.ok())
    t.speculative = parse_speculative(rd, *sp, base_dir);
  if (const toml::table* tls = root["tls"].as_table(); tls && rd.ok()) t.tls = parse_tls(rd, *tls, base_dir);
  if (!rd.ok()) return error{rd.error_message()};
  const toml::array* nodes = root["node"].as_array();
  if (!nodes || nodes->empty()) return error{name + ": no [[node]] is declared"};
  for (size_t i = 0; i < nodes->size() && rd.ok(); ++i)
    t.nodes.push_back(parse_node(rd, *(*nodes)[i].as_table(), "[[node]] #" + std::to_string(i + 1), t.tls.on()));
  const toml::array* replicas = root["replica"].as_array();
  if (rd.ok() && (!replicas || replicas->empty())) rd.fail(nullptr, "no [[replica]] is declared");
  for (size_t i = 0; rd.ok() && i < replicas->size(); ++i)
    t.replicas.push_back(parse_replica(rd, *(*replicas)[i].as_table(), "[[replica]] #" + std::to_string(i + 1)));
  if (rd.ok()) check_names(rd, t, root);
  if (rd.ok()) check_gpu_stages(rd, t, root);
  if (!rd.ok()) return error{rd.error_message()};
  return t;
}

expected<topology> parse_topology(const std::string& path) {
  auto text = [&]() -> expected<std::string> {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return error{path + ": cannot open"};
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && s.size() < (1u << 20)) s.append(buf, n);
    std::fclose(f);
    if (s.size() >= (1u << 20)) return error{path + ": larger than 1 MiB; not a topology"};
    return s;
  }();
  if (!text) return text.err();
  return parse_topology_text(*text, path, std::filesystem::path(path).parent_path().string());
}

bool loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  unsigned a = 0, b = 0, c = 0, d = 0;
  char tail = 0;
  return std::sscanf(host.c_str(), "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 && a == 127 && b < 256 && c < 256 && d < 256;
}

std::string insecure_ports_warning(const topology& t, const node_spec& n) {
  if (t.tls.on() || loopback_host(n.host)) return "";
  return "WARNING: node " + n.name + "'s internal ports (its agent, step links, KV channels) listen on " + n.host +
         " without TLS (insecure_internal_ports = true): anyone who reaches them can list and stop its actors, inject "
         "steps and send KV; add a [tls] table to the topology (troupe-launch certs makes its files)";
}

std::string topology_warnings(const topology& t, const model_config& m) {
  const int64_t kv_tokens = int64_t{t.kv.num_blocks} * t.kv.block_size;
  if (kv_tokens >= m.max_seq_len) return "";
  return "the KV cache holds " + std::to_string(kv_tokens) + " tokens ([kv] num_blocks " + std::to_string(t.kv.num_blocks) +
         " x block_size " + std::to_string(t.kv.block_size) + "), fewer than the model's context of " +
         std::to_string(m.max_seq_len) + ": a request that outgrows it ends early, with finish reason length";
}

status validate_topology(const topology& t, const model_config& m, int32_t q8_group_size) {
  // The environment's KV type, like [kv] cache_type (check_gpu_stages), is the CPU's.
  if (auto env = kv_cache_type_from_environment(); env && *env)
    for (const auto& r : t.replicas)
      for (const stage_spec& st : r.stages)
        if (st.devices[0] != "cpu")
          return error{"TROUPE_KV_TYPE=" + std::string(dtype_name(**env)) + " is set, but " + t.path + " runs replica '" +
                       r.name + "' on " + st.devices[0] +
                       ", and a GPU shard keeps its KV cache in F32: the KV cache type applies to CPU shards"};
  for (const auto& r : t.replicas) {
    int32_t next = 0;
    for (size_t s = 0; s < r.stages.size(); ++s) {
      const stage_spec& st = r.stages[s];
      const int32_t last = end_layer(st, m.num_layers) - 1;
      const std::string where = t.path + ": replica '" + r.name + "', stage " + std::to_string(s) + " (layers " +
                                std::to_string(st.first_layer) + "-" + std::to_string(last) + ")";
      if (st.first_layer < next) return error{where + " overlaps the layers of the stage before it"};
      if (st.first_layer > next)
        return error{where + " leaves layers " + std::to_string(next) + "-" + std::to_string(st.first_layer - 1) + " to no stage"};
      if (last < st.first_layer) return error{where + " holds no layer"};
      if (last >= m.num_layers) return error{where + " goes past the model's last layer, " + std::to_string(m.num_layers - 1)};
      if (auto e = check_tp_split(m, static_cast<int32_t>(st.devices.size()), q8_group_size))
        return error{where + ": " + std::to_string(st.devices.size()) + " devices: " + *e};
      next = last + 1;
    }
    if (next != m.num_layers)
      return error{t.path + ": replica '" + r.name + "' leaves layers " + std::to_string(next) + "-" +
                   std::to_string(m.num_layers - 1) + " to no stage"};
  }
  // Disaggregation: a prefill replica's shard sends each block to the decode shard of the
  // same layers and slice, over TCP from host memory.
  const replica_spec* decode = nullptr;
  for (const auto& r : t.replicas)
    if (r.role == replica_role::decode && !decode) decode = &r;
  for (const auto& r : t.replicas) {
    if (r.role == replica_role::both) continue;
    bool same = r.stages.size() == decode->stages.size();
    for (size_t s = 0; same && s < r.stages.size(); ++s)
      same = r.stages[s].first_layer == decode->stages[s].first_layer &&
             end_layer(r.stages[s], m.num_layers) == end_layer(decode->stages[s], m.num_layers) &&
             r.stages[s].devices.size() == decode->stages[s].devices.size();
    if (!same)
      return error{t.path + ": replica '" + r.name + "' splits the model unlike replica '" + decode->name +
                   "': prefill and decode replicas need the same stages (layers) and tensor-parallel sizes, "
                   "so that each shard's KV has one counterpart"};
  }
  if (auto s = speculative_config_of(t.speculative, m, true); !s) return error{t.path + ": " + s.err().message};
  return ok();
}

}  // namespace troupe::tools

// The topology's tables, one parser each (topology_reader.hpp).
#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <set>

#include "engine/forward/kv_cache_type.hpp"
#include "engine/forward/tp_slice.hpp"
#include "tools/common/topology_reader.hpp"

namespace troupe::tools::topology_impl {

model_section parse_model(reader& rd, const toml::table& t, const std::string& base_dir) {
  model_section m;
  rd.only(t, "[model]", {"path", "tokenizer", "name", "chat_template"});
  rd.get(t, "[model]", "path", m.path, true);
  rd.get(t, "[model]", "tokenizer", m.tokenizer);
  rd.get(t, "[model]", "name", m.name);
  if (rd.get(t, "[model]", "chat_template", m.chat_template) && m.chat_template != "auto" && m.chat_template != "raw" &&
      m.chat_template != "llama2" && m.chat_template != "chatml" && m.chat_template != "llama3")
    rd.fail(t.get("chat_template"), "[model]: chat_template must be auto, raw, llama2, chatml or llama3");
  auto resolve = [&](std::string& p) {
    if (!p.empty() && std::filesystem::path(p).is_relative())
      p = (std::filesystem::path(base_dir) / p).lexically_normal().string();
  };
  resolve(m.path);
  resolve(m.tokenizer);
  if (m.name.empty()) m.name = std::filesystem::path(m.path).stem().string();
  return m;
}

gateway_section parse_gateway(reader& rd, const toml::table& t, const std::string& base_dir) {
  gateway_section g;
  const std::string w = "[gateway]";
  rd.only(t, w, {"node", "capnp", "http", "api_keys_file", "cors_origins", "max_connections", "read_timeout_s",
                 "idle_timeout_s", "tls_cert", "tls_key", "also"});
  rd.get(t, w, "node", g.node, true);
  rd.endpoint_of(t, w, "capnp", g.capnp, true);
  rd.endpoint_of(t, w, "http", g.http, false);
  if (rd.get(t, w, "api_keys_file", g.api_keys_file) && std::filesystem::path(g.api_keys_file).is_relative())
    g.api_keys_file = (std::filesystem::path(base_dir) / g.api_keys_file).lexically_normal().string();
  if (const toml::node* origins = t.get("cors_origins")) {
    const toml::array* a = origins->as_array();
    if (!a) rd.fail(origins, w + ": 'cors_origins' must be an array of origins (\"https://host[:port]\") or [\"*\"]");
    for (size_t i = 0; a && rd.ok() && i < a->size(); ++i) {
      auto v = (*a)[i].value<std::string>();
      const bool origin = v && (*v == "*" || ((v->rfind("http://", 0) == 0 || v->rfind("https://", 0) == 0) &&
                                              v->find('/', v->find("//") + 2) == std::string::npos));
      if (!origin)
        rd.fail(origins, w + ": cors_origins entry " + std::to_string(i) +
                             " must be an origin (scheme and host, no path: \"https://app.example\") or \"*\"");
      else
        g.cors_origins.push_back(*v);
    }
  }
  rd.get_in(t, w, "max_connections", g.max_connections, 1, 65536);
  rd.get_in(t, w, "read_timeout_s", g.read_timeout_s, 1, 3600);
  rd.get_in(t, w, "idle_timeout_s", g.idle_timeout_s, 1, 86400);
  // tls_cert and tls_key: the Cap'n Proto endpoint speaks TLS with them (both, or neither).
  for (auto [key, value] : {std::pair{"tls_cert", &g.tls_cert}, std::pair{"tls_key", &g.tls_key}})
    if (rd.get(t, w, key, *value) && std::filesystem::path(*value).is_relative())
      *value = (std::filesystem::path(base_dir) / *value).lexically_normal().string();
  // [[gateway.also]]: more gateway nodes, each its node and endpoints.
  if (const toml::node* also = t.get("also")) {
    const toml::array* a = also->as_array();
    if (!a || !a->is_array_of_tables())
      rd.fail(also, w + ": 'also' must be [[gateway.also]] tables, each a gateway node's node, capnp and http");
    for (size_t i = 0; a && rd.ok() && i < a->size(); ++i) {
      const toml::table& e = *(*a)[i].as_table();
      const std::string at = "[[gateway.also]] " + std::to_string(i + 1);
      gateway_place p;
      rd.only(e, at, {"node", "capnp", "http"});
      rd.get(e, at, "node", p.node, true);
      rd.endpoint_of(e, at, "capnp", p.capnp, true);
      rd.endpoint_of(e, at, "http", p.http, false);
      g.also.push_back(std::move(p));
    }
  }
  if (rd.ok() && g.tls_cert.empty() != g.tls_key.empty())
    rd.fail(&t, w + ": 'tls_cert' and 'tls_key' go together: the endpoint's certificate and its key");
  return g;
}

tls_section parse_tls(reader& rd, const toml::table& t, const std::string& base_dir) {
  tls_section s;
  const std::string w = "[tls]";
  rd.only(t, w, {"ca", "cert", "key"});
  rd.get(t, w, "ca", s.ca, true);
  rd.get(t, w, "cert", s.cert, true);
  rd.get(t, w, "key", s.key, true);
  if (!rd.ok()) return s;
  for (const char* k : {"cert", "key"}) {
    const std::string& v = std::string(k) == "cert" ? s.cert : s.key;
    if (v.find("{node}") == std::string::npos)
      rd.fail(t.get(k), w + ": '" + k + "' names every node's own file: it must hold {node} (\"certs/{node}." +
                            (std::string(k) == "cert" ? "pem" : "key") + "\")");
  }
  if (rd.ok() && std::filesystem::path(s.ca).extension() == ".key")
    rd.fail(t.get("ca"), w + ": 'ca' names the CA's certificate (\"certs/ca.pem\"); its key is kept beside it, ca.key");
  if (rd.ok() && (s.ca == s.cert || s.ca == s.key || s.cert == s.key)) rd.fail(&t, w + ": ca, cert and key must be three files");
  for (std::string* p : {&s.ca, &s.cert, &s.key})
    if (std::filesystem::path(*p).is_relative()) *p = (std::filesystem::path(base_dir) / *p).lexically_normal().string();
  return s;
}

kv_config parse_kv(reader& rd, const toml::table& t) {
  kv_config kv;
  const std::string w = "[kv]";
  rd.only(t, w, {"block_size", "num_blocks", "prefix_caching", "prefix_cache_scope", "cache_type", "policy", "kv_policy",
                 "kv-policy", "budget", "kv_budget", "kv-budget", "sinks", "window", "history"});
  rd.get_in(t, w, "block_size", kv.block_size, 1, 1024);
  rd.get_in(t, w, "num_blocks", kv.num_blocks, 1, int64_t{1} << 30);
  rd.get(t, w, "prefix_caching", kv.prefix_caching);
  std::string scope;
  if (rd.get(t, w, "prefix_cache_scope", scope)) {
    if (scope == "key" || scope == "all")
      kv.prefix_cache_per_key = scope == "key";
    else
      rd.fail(t.get("prefix_cache_scope"),
              w + ": prefix_cache_scope must be \"key\" (cached prompts shared within one API key) or \"all\"");
  }
  std::string cache_type;
  if (rd.get(t, w, "cache_type", cache_type)) {
    if (auto d = kv_cache_type_named(cache_type, w + ": cache_type \"" + cache_type + "\""))
      kv.cache_type = *d;
    else
      rd.fail(t.get("cache_type"), d.err().message);
  }
  return kv;
}

// One [[tier]] of the KV cache below the pool (engine/kv/kv_tiers.hpp), in the order given:
// host memory first, if any, then disk and Redis.
tier_config parse_tier(reader& rd, const toml::table& t, const std::string& w, const std::string& base_dir) {
  tier_config c;
  rd.only(t, w, {"kind", "capacity_mb", "path", "address", "timeout_ms"});
  std::string kind;
  if (rd.get(t, w, "kind", kind, true)) {
    if (auto k = parse_tier_kind(kind))
      c.kind = *k;
    else
      rd.fail(t.get("kind"), w + ": kind \"" + kind + "\" is not a tier (\"host\", \"disk\" or \"redis\")");
  }
  int64_t mb = 0;
  rd.get_in(t, w, "capacity_mb", mb, 1, int64_t{1} << 24);
  c.capacity_bytes = static_cast<uint64_t>(mb) << 20;
  const bool disk = c.kind == tier_kind::disk, redis = c.kind == tier_kind::redis;
  auto only_for = [&](const char* key, bool fits, const char* kinds) {
    if (t.contains(key) && !fits) rd.fail(t.get(key), w + ": '" + key + "' belongs to " + kinds + " tiers");
  };
  only_for("path", disk, "disk");
  only_for("address", redis, "redis");
  only_for("timeout_ms", redis, "redis");
  if (disk && rd.get(t, w, "path", c.path, true) && std::filesystem::path(c.path).is_relative() && !base_dir.empty())
    c.path = (std::filesystem::path(base_dir) / c.path).string();
  if (redis) {
    rd.get(t, w, "address", c.address, true);
    rd.get_in(t, w, "timeout_ms", c.timeout_ms, 1, 60000);
  }
  if (rd.ok())
    if (auto e = validate(c)) rd.fail(&t, w + ": " + *e);
  return c;
}

// The key of `t` among `spellings` (troupe-run's flag names are taken too), or the first
// when none is there; a mistake when two are.
const char* spelled(reader& rd, const toml::table& t, const std::string& where, std::initializer_list<const char*> spellings) {
  const char* found = nullptr;
  for (const char* k : spellings) {
    if (!t.contains(k)) continue;
    if (found) rd.fail(t.get(k), where + ": " + found + " is given twice (as " + found + " and " + k + ")");
    found = k;
  }
  return found ? found : *spellings.begin();
}

// [kv]'s KV eviction keys: the deployment's default policy (engine/kv/kv_eviction.hpp).
kv_eviction_config parse_kv_eviction(reader& rd, const toml::table& t) {
  kv_eviction_config e;
  const std::string w = "[kv]";
  std::string policy = "none";
  const char* policy_key = spelled(rd, t, w, {"policy", "kv_policy", "kv-policy"});
  if (rd.get(t, w, policy_key, policy)) {
    if (auto p = parse_kv_policy(policy))
      e.policy = *p;
    else
      rd.fail(t.get(policy_key), w + ": " + policy_key + " \"" + policy + "\" is none, streaming, h2o or scissorhands");
  }
  const char* budget_key = spelled(rd, t, w, {"budget", "kv_budget", "kv-budget"});
  rd.get_in(t, w, budget_key, e.budget, 0, 1 << 24);
  rd.get_in(t, w, "sinks", e.sinks, 0, 1 << 24);
  rd.get_in(t, w, "window", e.window, 0, 1 << 24);
  rd.get_in(t, w, "history", e.history, 1, 32);
  if (!rd.ok()) return e;
  if (!e.enabled() && (t.contains(budget_key) || t.contains("sinks") || t.contains("window") || t.contains("history")))
    rd.fail(t.get(budget_key) ? t.get(budget_key) : &t, w + ": KV eviction settings without a policy (policy = \"streaming\", "
                                                             "\"h2o\" or \"scissorhands\")");
  else if (auto bad = validate(e, true))
    rd.fail(t.get(budget_key) ? t.get(budget_key) : &t, w + ": " + *bad);
  return e;
}

scheduler_config parse_scheduler(reader& rd, const toml::table& t, const std::vector<slo_class>& classes) {
  scheduler_config s;
  const std::string w = "[scheduler]";
  rd.only(t, w, {"max_step_tokens", "max_running", "default_class", "slo_admission"});
  rd.get_in(t, w, "max_step_tokens", s.max_step_tokens, 1, 1 << 20);
  rd.get_in(t, w, "max_running", s.max_running, 1, 1 << 16);
  s.classes = classes;
  std::string name;
  if (rd.get(t, w, "default_class", name)) {
    s.default_class = slo_class_index(classes, name);
    if (s.default_class < 0)
      rd.fail(t.get("default_class"), w + ": default_class '" + name + "' is not a [[class]]" +
                                           (classes.empty() ? " (none is declared)" : " (the classes: " + slo_class_names(classes) + ")"));
  }
  s.slo_admission = !classes.empty();
  rd.get(t, w, "slo_admission", s.slo_admission);
  if (rd.ok() && s.slo_admission && classes.empty() && t.contains("slo_admission"))
    rd.fail(t.get("slo_admission"), w + ": slo_admission needs [[class]] tables (the targets it admits by)");
  return s;
}

failure_config parse_failure(reader& rd, const toml::table& t) {
  failure_config f;
  const std::string w = "[failure]";
  rd.only(t, w, {"heartbeat_ms", "timeout_ms", "recovery_timeout_s", "restart"});
  rd.get_in(t, w, "heartbeat_ms", f.heartbeat_ms, 10, 60000);
  rd.get(t, w, "timeout_ms", f.timeout_ms);
  if (rd.ok() && (f.timeout_ms <= f.heartbeat_ms || f.timeout_ms > 600000))
    rd.fail(t.get("timeout_ms") ? t.get("timeout_ms") : &t, w + ": timeout_ms must exceed heartbeat_ms (and be at most 600000)");
  rd.get_in(t, w, "recovery_timeout_s", f.recovery_timeout_s, 1, 86400);
  std::string restart = "always";
  if (rd.get(t, w, "restart", restart) && restart != "always" && restart != "never")
    rd.fail(t.get("restart"), w + ": restart must be \"always\" or \"never\"");
  f.restart = restart == "always";
  return f;
}

// One [[class]]: a request class's targets and priority (engine/sched/slo.hpp).
slo_class parse_class(reader& rd, const toml::table& t, const std::string& w) {
  slo_class c;
  rd.only(t, w, {"name", "ttft_ms", "tpot_ms", "priority"});
  rd.get(t, w, "name", c.name, true);
  if (rd.ok() && (c.name.empty() || c.name.size() > 64 || c.name.find_first_of(" \t\r\n\"") != std::string::npos))
    rd.fail(t.get("name"), w + ": name must be 1 to 64 bytes without spaces or quotes");
  int64_t ttft = 0, tpot = 0;
  // A first token takes a step and a round trip, a token a step: below these, no replica
  // can meet a target, and a class would refuse everything.
  rd.get_in(t, w, "ttft_ms", ttft, 10, 3600000);
  rd.get_in(t, w, "tpot_ms", tpot, 1, 600000);
  rd.get_in(t, w, "priority", c.priority, -1000, 1000);
  if (rd.ok() && !t.contains("ttft_ms") && !t.contains("tpot_ms"))
    rd.fail(&t, w + ": a class needs a target: ttft_ms, tpot_ms or both");
  if (rd.ok() && ttft > 0 && tpot > 0 && ttft < tpot)
    rd.fail(t.get("ttft_ms"), w + ": ttft_ms (" + std::to_string(ttft) + ") is below tpot_ms (" + std::to_string(tpot) +
                                  "): a first token cannot come sooner than a later one");
  c.ttft_ms = static_cast<double>(ttft);
  c.tpot_ms = static_cast<double>(tpot);
  return c;
}

router_section parse_router(reader& rd, const toml::table& t) {
  router_section r;
  const std::string w = "[router]";
  rd.only(t, w, {"policy", "stream_tokens"});
  std::string policy;
  if (rd.get(t, w, "policy", policy)) {
    if (policy == "kv-aware" || policy == "least-loaded")
      r.policy = policy == "kv-aware" ? route_policy::kv_aware : route_policy::least_loaded;
    else
      rd.fail(t.get("policy"), w + ": policy must be \"kv-aware\" (where the prompt's prefix is cached, weighed against "
                                   "load) or \"least-loaded\"");
  }
  int32_t stream_tokens = static_cast<int32_t>(r.stream_tokens);
  rd.get_in(t, w, "stream_tokens", stream_tokens, 0, 1 << 20);
  r.stream_tokens = stream_tokens;
  return r;
}

gpu_config parse_gpu(reader& rd, const toml::table& t) {
  gpu_config g;
  rd.only(t, "[gpu]", {"weights"});
  std::string weights;
  if (rd.get(t, "[gpu]", "weights", weights)) {
    const auto d = dtype_named(weights);
    if (!d || (*d != dtype::bf16 && *d != dtype::f16 && *d != dtype::f32))
      rd.fail(t.get("weights"), "[gpu]: weights must be bf16, f16 or f32");
    else
      g.weights = *d;
  }
  return g;
}

// The command line's names, in TOML's spelling (exit_layer; exit-layer is taken too).
speculative_options parse_speculative(reader& rd, const toml::table& t, const std::string& base_dir) {
  speculative_options o;
  const std::string w = "[speculative]";
  rd.only(t, w, {"method", "k", "draft", "exit_layer", "exit-layer", "heads", "tree", "max_step_tokens"});
  rd.get_in(t, w, "max_step_tokens", o.max_step_tokens, 1, 1 << 16);
  if (rd.get(t, w, "method", o.method) && !parse_spec_method(o.method))
    rd.fail(t.get("method"), w + ": method must be ngram, draft, early-exit, medusa, eagle or none");
  rd.get_in(t, w, "k", o.k, 1, max_draft_tokens);
  if (rd.get(t, w, "draft", o.draft) && std::filesystem::path(o.draft).is_relative())
    o.draft = (std::filesystem::path(base_dir) / o.draft).lexically_normal().string();
  if (rd.get(t, w, "heads", o.heads) && std::filesystem::path(o.heads).is_relative())
    o.heads = (std::filesystem::path(base_dir) / o.heads).lexically_normal().string();
  // tree: widths by depth, as [4, 2, 2] or "4,2,2", or "auto" / "auto:NODES".
  if (const toml::node* tree = t.get("tree")) {
    if (const auto* widths = tree->as_array()) {
      for (const toml::node& v : *widths) {
        const auto* n = v.as_integer();
        if (!n || n->get() < 1 || n->get() > max_tree_width) {
          rd.fail(&v, w + ": tree's widths must be integers in 1.." + std::to_string(max_tree_width));
          break;
        }
        o.tree += (o.tree.empty() ? "" : ",") + std::to_string(n->get());
      }
      if (widths->empty()) rd.fail(tree, w + ": tree is empty; leave it out for chains");
    } else if (tree->is_string()) {
      rd.get(t, w, "tree", o.tree);
    } else {
      rd.fail(tree, w + ": tree must be widths by depth ([4, 2, 2] or \"4,2,2\") or \"auto\" / \"auto:NODES\"");
    }
  }
  const char* exit_key = t.contains("exit-layer") ? "exit-layer" : "exit_layer";
  if (t.contains("exit-layer") && t.contains("exit_layer"))
    rd.fail(t.get("exit-layer"), w + ": exit_layer is given twice (as exit_layer and exit-layer)");
  rd.get_in(t, w, exit_key, o.exit_layer, 1, 1 << 16);
  return o;
}

node_spec parse_node(reader& rd, const toml::table& t, const std::string& where, bool tls_on) {
  node_spec n;
  rd.only(t, where, {"name", "host", "port", "threads", "link_ports", "insecure_internal_ports"});
  rd.get(t, where, "name", n.name, true);
  const std::string named = where + " '" + n.name + "'";
  if (rd.get(t, where, "host", n.host, true)) rd.host_ok(n.host, t.get("host"), named);
  rd.get(t, named, "insecure_internal_ports", n.insecure_internal_ports);
  // A node's own ports (its agent, step links, KV channels) take orders and data from
  // whoever reaches them unless [tls] authenticates its peers: on loopback only that
  // machine's users can, elsewhere anyone on the network could list and stop its actors,
  // inject steps and send KV.
  if (rd.ok() && !tls_on && !n.insecure_internal_ports && !loopback_host(n.host))
    rd.fail(t.get("host"), named + ": host " + n.host +
                               " is not loopback, and without [tls] the node's internal ports (its agent, step links and KV "
                               "channels) would take orders and data from anyone who reaches them: add a [tls] table "
                               "(troupe-launch certs makes its files), or insecure_internal_ports = true in this [[node]] "
                               "for a network only the cluster can reach");
  int64_t port = 0;
  if (rd.get(t, where, "port", port, true)) rd.port_of(port, t.get("port"), named, n.port);
  rd.get_in(t, named, "threads", n.threads, 1, 1024);
  // link_ports: a port (20000) or a range ("20000-20099") its step links listen on, for a
  // firewall's opening.
  if (const toml::node* lp = t.get("link_ports")) {
    int64_t first = 0, last = 0;
    bool shaped = false;
    if (const auto* v = lp->as_integer()) {
      first = last = v->get();
      shaped = true;
    } else if (auto text = lp->value<std::string>()) {
      const size_t dash = text->find('-');
      const std::string a = text->substr(0, dash), b = dash == std::string::npos ? a : text->substr(dash + 1);
      auto number = [](const std::string& d, int64_t& out) {
        if (d.empty() || d.size() > 5 || d.find_first_not_of("0123456789") != std::string::npos) return false;
        out = std::stoll(d);
        return true;
      };
      shaped = number(a, first) && number(b, last);
    }
    const std::string what = named + ": link_ports";
    if (!shaped)
      rd.fail(lp, what + " is a port (20000) or a range of them (\"20000-20099\")");
    else if (rd.port_of(first, lp, what, n.link_ports.first) && rd.port_of(last, lp, what, n.link_ports.last) &&
             first > last)
      rd.fail(lp, what + " " + std::to_string(first) + "-" + std::to_string(last) + " ends before it starts");
  }
  return n;
}

bool parse_layers(const std::string& s, int32_t& first, int32_t& last) {
  if (s == "all") {
    first = 0;
    last = -1;
    return true;
  }
  const size_t dash = s.find('-');
  const std::string a = dash == std::string::npos ? s : s.substr(0, dash);
  const std::string b = dash == std::string::npos ? s : s.substr(dash + 1);
  auto num = [](const std::string& x, int32_t& out) {
    if (x.empty() || x.size() > 6 || x.find_first_not_of("0123456789") != std::string::npos) return false;
    out = std::stoi(x);
    return true;
  };
  if (b == "end") {
    last = -1;
    return num(a, first);
  }
  return num(a, first) && num(b, last) && first <= last;
}

bool device_ok(const std::string& d) {
  if (d == "cpu") return true;
  if (d.rfind("cuda:", 0) != 0 || d.size() == 5 || d.size() > 8) return false;
  return d.find_first_not_of("0123456789", 5) == std::string::npos;
}

stage_spec parse_stage(reader& rd, const toml::table& t, const std::string& where) {
  stage_spec s;
  rd.only(t, where, {"node", "layers", "devices", "kv_port"});
  if (int64_t port = 0; rd.get(t, where, "kv_port", port)) rd.port_of(port, t.get("kv_port"), where, s.kv_port);
  std::string layers;
  rd.get(t, where, "node", s.node, true);
  if (rd.get(t, where, "layers", layers, true) && !parse_layers(layers, s.first_layer, s.last_layer))
    rd.fail(t.get("layers"), where + ": layers '" + layers + "' is not FIRST-LAST");
  const toml::array* devs = t["devices"].as_array();
  if (rd.ok() && (!devs || devs->empty())) rd.fail(&t, where + ": 'devices' must be a non-empty array");
  for (size_t d = 0; rd.ok() && d < devs->size(); ++d) {
    auto v = (*devs)[d].value<std::string>();
    if (!v || !device_ok(*v))
      rd.fail(devs, where + ": device " + std::to_string(d) + " must be \"cpu\" or \"cuda:N\"");
    else
      s.devices.push_back(*v);
  }
  // The shards of a stage all-reduce on one kind of device, one shard per GPU.
  std::set<int> seen;  // device numbers ("cuda:01" is cuda:1)
  for (size_t d = 0; rd.ok() && d < s.devices.size(); ++d) {
    const std::string& dev = s.devices[d];
    if ((dev == "cpu") != (s.devices[0] == "cpu"))
      rd.fail(devs, where + ": devices mix \"cpu\" and GPUs; a stage's tensor-parallel shards must all be on the CPU or all on GPUs");
    else if (dev != "cpu" && !seen.insert(std::stoi(dev.substr(5))).second)
      rd.fail(devs, where + ": device " + dev + " is named twice; each GPU shard of a stage needs a GPU of its own");
  }
  return s;
}

replica_spec parse_replica(reader& rd, const toml::table& t, const std::string& where) {
  replica_spec r;
  rd.only(t, where, {"name", "stages", "scheduler", "draft", "role", "num_blocks", "landing_mb"});
  rd.get(t, where, "name", r.name, true);
  std::string role;
  if (rd.get(t, where, "role", role)) {
    if (role == "both" || role == "prefill" || role == "decode")
      r.role = role == "both" ? replica_role::both : role == "prefill" ? replica_role::prefill : replica_role::decode;
    else
      rd.fail(t.get("role"), "replica '" + r.name + "': role must be \"prefill\" (prompts, whose KV goes to a decode "
                             "replica), \"decode\" (generation from that KV) or \"both\"");
  }
  rd.get_in(t, where, "num_blocks", r.num_blocks, 1, int64_t{1} << 30);
  rd.get_in(t, where, "landing_mb", r.landing_mb, 1, int64_t{1} << 20);
  rd.get(t, where, "scheduler", r.scheduler_node);
  rd.get(t, where, "draft", r.draft_node);
  const toml::array* stages = t["stages"].as_array();
  if (rd.ok() && (!stages || stages->empty())) rd.fail(&t, "replica '" + r.name + "': 'stages' must be a non-empty array");
  for (size_t s = 0; rd.ok() && s < stages->size(); ++s) {
    const std::string sw = "replica '" + r.name + "', stage " + std::to_string(s);
    const toml::table* st = (*stages)[s].as_table();
    if (!st) {
      rd.fail(&(*stages)[s], sw + " is not an inline table");
      break;
    }
    r.stages.push_back(parse_stage(rd, *st, sw));
  }
  for (size_t s = 0; rd.ok() && s < r.stages.size(); ++s) {
    const stage_spec& st = r.stages[s];
    const std::string sw = "replica '" + r.name + "', stage " + std::to_string(s);
    if (r.role == replica_role::decode && st.kv_port == 0)
      rd.fail(&t, sw + ": a decode replica's stages need a kv_port (where prefill replicas send KV)");
    else if (r.role != replica_role::decode && st.kv_port != 0)
      rd.fail(&t, sw + ": kv_port is for a decode replica's stages (this replica's role is " +
                      std::string(replica_role_name(r.role)) + ")");
    else if (st.kv_port + st.devices.size() - 1 > 65535)
      rd.fail(&t, sw + ": kv_port " + std::to_string(st.kv_port) + " leaves no port for shard " +
                      std::to_string(st.devices.size() - 1));
  }
  if (rd.ok() && t.contains("landing_mb") && r.role != replica_role::decode)
    rd.fail(&t, "replica '" + r.name + "': landing_mb is for a decode replica");
  if (rd.ok() && r.scheduler_node.empty()) r.scheduler_node = r.stages[0].node;
  if (rd.ok() && r.draft_node.empty()) r.draft_node = r.scheduler_node;
  return r;
}

}  // namespace troupe::tools::topology_impl

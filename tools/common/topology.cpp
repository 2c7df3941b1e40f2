#include "tools/common/topology.hpp"

#include <filesystem>
#include <map>
#include <set>

#include <toml++/toml.h>

#include "engine/forward/tp_slice.hpp"
#include "engine/forward/transformer_shard.hpp"

namespace troupe::tools {

namespace {

class reader {
 public:
  explicit reader(std::string name) : name_(std::move(name)) {}

  template <class T>
  bool get(const toml::table& t, const std::string& where, const char* key, T& out, bool required) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) fail(where + ": '" + key + "' is missing");
      return false;
    }
    if constexpr (std::is_same_v<T, std::string>) {
      if (auto v = n->value<std::string>()) {
        out = *v;
        return true;
      }
      fail(where + ": '" + key + "' must be a string");
    } else {
      if (auto v = n->value<int64_t>()) {
        if (*v < 0 || *v > INT32_MAX) {
          fail(where + ": '" + key + "' = " + std::to_string(*v) + " is out of range");
          return false;
        }
        out = static_cast<T>(*v);
        return true;
      }
      fail(where + ": '" + key + "' must be an integer");
    }
    return false;
  }

  bool port_of(int64_t v, const std::string& where, uint16_t& out) {
    if (v < 1 || v > 65535) return fail(where + ": port " + std::to_string(v) + " is not in 1..65535");
    out = static_cast<uint16_t>(v);
    return true;
  }

  bool endpoint_of(const std::string& s, const std::string& where, endpoint& out) {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return fail(where + ": '" + s + "' is not HOST:PORT");
    out.host = s.substr(0, colon);
    const std::string port = s.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
      return fail(where + ": '" + s + "' has no valid port");
    return port_of(std::stol(port), where, out.port) && host_ok(out.host, where);
  }

  bool host_ok(const std::string& h, const std::string& where) {
    if (h.empty() || h.size() > 253 || h.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != std::string::npos)
      return fail(where + ": host '" + h + "' is not a host name or IPv4 address");
    return true;
  }

  bool fail(const std::string& what) {
    if (error_.empty()) error_ = name_ + ": " + what;
    return false;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error_message() const { return error_; }

 private:
  std::string name_;
  std::string error_;
};

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

}  // namespace

expected<topology> parse_topology_text(const std::string& text, const std::string& name,
                                       const std::string& base_dir) {
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    return error{name + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column) +
                 ": " + std::string(e.description())};
  }
  reader rd(name);
  topology t;
  t.path = name;

  const toml::table* model = root["model"].as_table();
  if (!model) return error{name + ": the [model] table is missing"};
  rd.get(*model, "[model]", "path", t.model_path, true);
  rd.get(*model, "[model]", "tokenizer", t.tokenizer_path, false);
  rd.get(*model, "[model]", "name", t.model_name, false);
  rd.get(*model, "[model]", "chat_template", t.chat_template, false);
  if (rd.ok() && t.chat_template != "auto" && t.chat_template != "raw" && t.chat_template != "llama2" &&
      t.chat_template != "chatml")
    rd.fail("[model]: chat_template must be auto, raw, llama2 or chatml");
  auto resolve = [&](std::string& p) {
    if (!p.empty() && std::filesystem::path(p).is_relative()) p = (std::filesystem::path(base_dir) / p).lexically_normal().string();
  };
  resolve(t.model_path);
  resolve(t.tokenizer_path);
  if (t.model_name.empty()) t.model_name = std::filesystem::path(t.model_path).stem().string();

  const toml::table* gw = root["gateway"].as_table();
  if (!gw) return error{name + ": the [gateway] table is missing"};
  std::string capnp, http;
  rd.get(*gw, "[gateway]", "node", t.gateway_node, true);
  if (rd.get(*gw, "[gateway]", "capnp", capnp, true)) rd.endpoint_of(capnp, "[gateway] capnp", t.capnp);
  if (rd.get(*gw, "[gateway]", "http", http, false)) rd.endpoint_of(http, "[gateway] http", t.http);
  rd.get(*gw, "[gateway]", "api_keys_file", t.api_keys_file, false);
  resolve(t.api_keys_file);
  if (const toml::node* origins = gw->get("cors_origins")) {
    const toml::array* a = origins->as_array();
    if (!a) rd.fail("[gateway]: 'cors_origins' must be an array of origins (\"https://host[:port]\") or [\"*\"]");
    for (size_t i = 0; a && rd.ok() && i < a->size(); ++i) {
      auto v = (*a)[i].value<std::string>();
      const bool origin = v && (*v == "*" || ((v->rfind("http://", 0) == 0 || v->rfind("https://", 0) == 0) &&
                                              v->find('/', v->find("//") + 2) == std::string::npos));
      if (!origin)
        rd.fail("[gateway]: cors_origins entry " + std::to_string(i) +
                " must be an origin (scheme and host, no path: \"https://app.example\") or \"*\"");
      else
        t.cors_origins.push_back(*v);
    }
  }
  rd.get(*gw, "[gateway]", "max_connections", t.max_connections, false);
  rd.get(*gw, "[gateway]", "read_timeout_s", t.read_timeout_s, false);
  if (rd.ok() && (t.max_connections < 1 || t.max_connections > 65536))
    rd.fail("[gateway]: max_connections must be in 1..65536");
  if (rd.ok() && (t.read_timeout_s < 1 || t.read_timeout_s > 3600))
    rd.fail("[gateway]: read_timeout_s must be in 1..3600");

  if (const toml::table* kv = root["kv"].as_table()) {
    rd.get(*kv, "[kv]", "block_size", t.block_size, false);
    rd.get(*kv, "[kv]", "num_blocks", t.num_blocks, false);
    if (const toml::node* pc = kv->get("prefix_caching")) {
      if (auto b = pc->value<bool>()) t.prefix_caching = *b;
      else rd.fail("[kv]: 'prefix_caching' must be true or false");
    }
    std::string scope;
    if (rd.get(*kv, "[kv]", "prefix_cache_scope", scope, false) && rd.ok()) {
      if (scope == "key" || scope == "all") t.prefix_cache_per_key = scope == "key";
      else rd.fail("[kv]: prefix_cache_scope must be \"key\" (cached prompts shared within one API key) or \"all\"");
    }
    std::string cache_type;
    if (rd.get(*kv, "[kv]", "cache_type", cache_type, false) && rd.ok()) {
      if (auto d = transformer_shard::kv_type_named(cache_type, "[kv]: cache_type \"" + cache_type + "\""))
        t.kv_cache_type = *d;
      else
        rd.fail(d.err().message);
    }
    if (rd.ok() && (t.block_size < 1 || t.block_size > 1024)) rd.fail("[kv]: block_size must be in 1..1024");
    if (rd.ok() && t.num_blocks < 1) rd.fail("[kv]: num_blocks must be at least 1");
  }
  if (const toml::table* s = root["scheduler"].as_table()) {
    rd.get(*s, "[scheduler]", "max_step_tokens", t.max_step_tokens, false);
    rd.get(*s, "[scheduler]", "max_running", t.max_running, false);
    if (rd.ok() && (t.max_step_tokens < 1 || t.max_running < 1)) rd.fail("[scheduler]: limits must be at least 1");
  }

  if (const toml::table* g = root["gpu"].as_table()) {
    rd.get(*g, "[gpu]", "weights", t.gpu_weights, false);
    if (rd.ok() && t.gpu_weights != "bf16" && t.gpu_weights != "f16" && t.gpu_weights != "f32")
      rd.fail("[gpu]: weights must be bf16, f16 or f32");
  }
  if (const toml::table* f = root["failure"].as_table()) {
    rd.get(*f, "[failure]", "heartbeat_ms", t.failure.heartbeat_ms, false);
    rd.get(*f, "[failure]", "timeout_ms", t.failure.timeout_ms, false);
    rd.get(*f, "[failure]", "recovery_timeout_s", t.failure.recovery_timeout_s, false);
    std::string restart = "always";
    rd.get(*f, "[failure]", "restart", restart, false);
    if (rd.ok() && restart != "always" && restart != "never") rd.fail("[failure]: restart must be \"always\" or \"never\"");
    t.failure.restart = restart == "always";
    if (rd.ok() && (t.failure.heartbeat_ms < 10 || t.failure.heartbeat_ms > 60000))
      rd.fail("[failure]: heartbeat_ms must be in 10..60000");
    if (rd.ok() && (t.failure.timeout_ms <= t.failure.heartbeat_ms || t.failure.timeout_ms > 600000))
      rd.fail("[failure]: timeout_ms must exceed heartbeat_ms (and be at most 600000)");
    if (rd.ok() && (t.failure.recovery_timeout_s < 1 || t.failure.recovery_timeout_s > 86400))
      rd.fail("[failure]: recovery_timeout_s must be in 1..86400");
  }

  const toml::array* nodes = root["node"].as_array();
  if (!nodes || nodes->empty()) return error{name + ": no [[node]] is declared"};
  for (size_t i = 0; i < nodes->size() && rd.ok(); ++i) {
    const toml::table* n = (*nodes)[i].as_table();
    const std::string where = "[[node]] #" + std::to_string(i + 1);
    if (!n) {
      rd.fail(where + " is not a table");
      break;
    }
    node_spec ns;
    int64_t port = 0;
    rd.get(*n, where, "name", ns.name, true);
    rd.get(*n, where, "host", ns.host, true);
    if (rd.get(*n, where, "port", port, true)) rd.port_of(port, where + " '" + ns.name + "'", ns.port);
    rd.get(*n, where, "threads", ns.threads, false);
    if (rd.ok()) rd.host_ok(ns.host, where + " '" + ns.name + "'");
    if (rd.ok() && (ns.threads < 1 || ns.threads > 1024)) rd.fail(where + " '" + ns.name + "': threads must be in 1..1024");
    t.nodes.push_back(ns);
  }

  const toml::array* replicas = root["replica"].as_array();
  if (rd.ok() && (!replicas || replicas->empty())) rd.fail("no [[replica]] is declared");
  for (size_t i = 0; rd.ok() && i < replicas->size(); ++i) {
    const toml::table* r = (*replicas)[i].as_table();
    const std::string where = "[[replica]] #" + std::to_string(i + 1);
    if (!r) {
      rd.fail(where + " is not a table");
      break;
    }
    replica_spec rs;
    rd.get(*r, where, "name", rs.name, true);
    rd.get(*r, where, "scheduler", rs.scheduler_node, false);
    const toml::array* stages = (*r)["stages"].as_array();
    if (rd.ok() && (!stages || stages->empty())) rd.fail("replica '" + rs.name + "': 'stages' must be a non-empty array");
    for (size_t s = 0; rd.ok() && s < stages->size(); ++s) {
      const std::string sw = "replica '" + rs.name + "', stage " + std::to_string(s);
      const toml::table* st = (*stages)[s].as_table();
      if (!st) {
        rd.fail(sw + " is not an inline table");
        break;
      }
      stage_spec ss;
      std::string layers;
      rd.get(*st, sw, "node", ss.node, true);
      if (rd.get(*st, sw, "layers", layers, true) && !parse_layers(layers, ss.first_layer, ss.last_layer))
        rd.fail(sw + ": layers '" + layers + "' is not FIRST-LAST");
      const toml::array* devs = (*st)["devices"].as_array();
      if (rd.ok() && (!devs || devs->empty())) rd.fail(sw + ": 'devices' must be a non-empty array");
      for (size_t d = 0; rd.ok() && d < devs->size(); ++d) {
        auto v = (*devs)[d].value<std::string>();
        if (!v || !device_ok(*v)) rd.fail(sw + ": device " + std::to_string(d) + " must be \"cpu\" or \"cuda:N\"");
        else ss.devices.push_back(*v);
      }
      // The shards of a stage all-reduce on one kind of device, one shard per GPU.
      std::set<int> seen;  // device numbers ("cuda:01" is cuda:1)
      for (size_t d = 0; rd.ok() && d < ss.devices.size(); ++d) {
        const std::string& dev = ss.devices[d];
        if ((dev == "cpu") != (ss.devices[0] == "cpu"))
          rd.fail(sw + ": devices mix \"cpu\" and GPUs; a stage's tensor-parallel shards must all be on the CPU or all on GPUs");
        else if (dev != "cpu" && !seen.insert(std::stoi(dev.substr(5))).second)
          rd.fail(sw + ": device " + dev + " is named twice; each GPU shard of a stage needs a GPU of its own");
      }
      rs.stages.push_back(ss);
    }
    if (rd.ok() && rs.scheduler_node.empty()) rs.scheduler_node = rs.stages[0].node;
    t.replicas.push_back(rs);
  }
  if (!rd.ok()) return error{rd.error_message()};

  // Names and ports.
  std::set<std::string> names;
  std::map<std::string, std::string> ports;  // host:port -> who
  auto claim = [&](const endpoint& e, const std::string& who) -> bool {
    auto [it, fresh] = ports.emplace(e.str(), who);
    if (!fresh) return rd.fail("port clash: " + who + " and " + it->second + " both use " + e.str());
    return true;
  };
  for (const auto& n : t.nodes) {
    if (!names.insert(n.name).second) return error{name + ": node name '" + n.name + "' is used twice"};
    if (!claim({n.host, n.port}, "node '" + n.name + "'")) return error{rd.error_message()};
  }
  if (!names.count(t.gateway_node)) return error{name + ": [gateway] names unknown node '" + t.gateway_node + "'"};
  if (!claim(t.capnp, "the gateway's capnp endpoint")) return error{rd.error_message()};
  if (t.http.port != 0 && !claim(t.http, "the gateway's http endpoint")) return error{rd.error_message()};
  std::set<std::string> replica_names;
  for (const auto& r : t.replicas) {
    if (!replica_names.insert(r.name).second) return error{name + ": replica name '" + r.name + "' is used twice"};
    for (size_t s = 0; s < r.stages.size(); ++s)
      if (!names.count(r.stages[s].node))
        return error{name + ": replica '" + r.name + "', stage " + std::to_string(s) + ": unknown node '" + r.stages[s].node + "'"};
    if (!names.count(r.scheduler_node))
      return error{name + ": replica '" + r.name + "': scheduler on unknown node '" + r.scheduler_node + "'"};
  }
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

std::string topology_warnings(const topology& t, const model_config& m) {
  const int64_t kv_tokens = int64_t{t.num_blocks} * t.block_size;
  if (kv_tokens >= m.max_seq_len) return "";
  return "the KV cache holds " + std::to_string(kv_tokens) + " tokens ([kv] num_blocks " + std::to_string(t.num_blocks) +
         " x block_size " + std::to_string(t.block_size) + "), fewer than the model's context of " +
         std::to_string(m.max_seq_len) + ": a request that outgrows it ends early, with finish reason length";
}

status validate_topology(const topology& t, const model_config& m, int32_t q8_group_size) {
  for (const auto& r : t.replicas) {
    int32_t next = 0;
    for (size_t s = 0; s < r.stages.size(); ++s) {
      const stage_spec& st = r.stages[s];
      const int32_t last = end_layer(st, m.num_layers) - 1;
      const std::string where = t.path + ": replica '" + r.name + "', stage " + std::to_string(s) + " (layers " +
                                std::to_string(st.first_layer) + "-" + std::to_string(last) + ")";
      if (st.first_layer < next)
        return error{where + " overlaps the layers of the stage before it"};
      if (st.first_layer > next)
        return error{where + " leaves layers " + std::to_string(next) + "-" + std::to_string(st.first_layer - 1) + " to no stage"};
      if (last < st.first_layer)
        return error{where + " holds no layer"};
      if (last >= m.num_layers)
        return error{where + " goes past the model's last layer, " + std::to_string(m.num_layers - 1)};
      if (auto e = check_tp_split(m, static_cast<int32_t>(st.devices.size()), q8_group_size))
        return error{where + ": " + std::to_string(st.devices.size()) + " devices: " + *e};
      next = last + 1;
    }
    if (next != m.num_layers)
      return error{t.path + ": replica '" + r.name + "' leaves layers " + std::to_string(next) + "-" +
                   std::to_string(m.num_layers - 1) + " to no stage"};
  }
  return ok();
}

}  // namespace troupe::tools

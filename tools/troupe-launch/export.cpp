#include "tools/troupe-launch/export.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/model/model.hpp"

#include <toml++/toml.h>

namespace troupe::tools {

namespace fs = std::filesystem;

namespace {

// A string as a YAML (and JSON) scalar: quoted, escaped.
std::string q(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

bool on_gpu(const stage_spec& s) {
  return std::any_of(s.devices.begin(), s.devices.end(), [](const std::string& d) { return d != "cpu"; });
}

// The largest cuda:N index a node's stages use, plus one: the devices it needs.
int32_t gpus_of(const topology& t, const std::string& node) {
  int32_t most = 0;
  for (const auto& r : t.replicas)
    for (const auto& s : r.stages)
      if (s.node == node)
        for (const auto& d : s.devices)
          if (d.rfind("cuda:", 0) == 0) most = std::max(most, std::stoi(d.substr(5)) + 1);
  return most;
}

double kv_bytes_per_value(const topology& t) {
  if (!t.kv.cache_type) return 4.0;
  switch (*t.kv.cache_type) {
    case dtype::f16: case dtype::bf16: return 2.0;
    case dtype::q8_0: return 34.0 / 32.0;
    default: return 4.0;
  }
}

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + "Mi"; }

}  // namespace

uint64_t node_memory_bytes(const topology& t, const model_config& c, uint64_t model_bytes, const std::string& node) {
  const double per_layer_kv = double(t.kv.num_blocks) * t.kv.block_size * 2.0 * c.num_kv_heads * c.head_dim * kv_bytes_per_value(t);
  double bytes = 256.0 * (1 << 20);  // the process, its threads and buffers
  for (const auto& r : t.replicas)
    for (const auto& s : r.stages) {
      if (s.node != node) continue;
      const int32_t layers = end_layer(s, c.num_layers) - s.first_layer;
      // Weights mapped from the file (GPU stages read them once, to upload); the KV cache
      // in host memory on CPUs, on the device otherwise.
      bytes += double(model_bytes) * layers / std::max(1, c.num_layers);
      if (!on_gpu(s)) bytes += per_layer_kv * layers;
    }
  return static_cast<uint64_t>(bytes);
}

std::string deployment_name(const std::string& topology_path) {
  std::string out = "troupe-";
  for (char ch : fs::path(topology_path).stem().string()) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    out += (std::isalnum(static_cast<unsigned char>(lower)) ? lower : '-');
  }
  while (out.size() > 1 && out.back() == '-') out.pop_back();
  return out.substr(0, 40);
}

std::vector<exported_file> systemd_units(const topology& t, const export_options& o) {
  const std::string name = deployment_name(o.topology_file);
  const std::string bin = (fs::path(o.bin_dir) / "troupe-node").string();
  // Each client connection a descriptor: both endpoints' max_connections (unset: what a
  // node gives them, at most 65536 HTTP and 4096 Cap'n Proto), and the node's own.
  const int64_t files = (t.gateway.max_connections > 0 ? int64_t{t.gateway.max_connections} * 2 : 65536 + 4096) + 4096;
  std::vector<exported_file> out;
  std::map<std::string, std::vector<std::string>> by_host;  // the units each host runs
  for (const auto& n : t.nodes) by_host[n.host].push_back(name + "-" + n.name + ".service");
  for (const auto& n : t.nodes) {
    const bool gateway = t.gateway.index_of(n.name) >= 0;
    std::ostringstream u;
    u << "# troupe-launch export systemd " << o.topology_file << ": node " << n.name << " on " << n.host
      << (gateway ? ", the gateway" : "") << ".\n";
    u << "[Unit]\n";
    u << "Description=troupe node " << n.name << " of " << fs::path(o.topology_file).filename().string()
      << (gateway ? " (the gateway)" : "") << "\n";
    u << "Wants=network-online.target\n";
    u << "After=network-online.target";
    // A gateway starts after the other (not gateway) nodes of its host, and stops before
    // them (it drains the requests in flight first).
    if (gateway)
      for (const auto& m : t.nodes)
        if (m.host == n.host && t.gateway.index_of(m.name) < 0) u << " " << name << "-" << m.name << ".service";
    u << "\nPartOf=" << name << ".target\n\n";
    u << "[Service]\n";
    u << "Type=simple\n";
    u << "ExecStart=" << bin << " " << o.topology_file << " --node " << n.name << "\n";
    if (!o.user.empty()) u << "User=" << o.user << "\n";
    u << "Restart=" << (t.failure.restart ? "always" : "no") << "\n";
    u << "RestartSec=1\n";
    u << "KillSignal=SIGTERM\n";
    u << "TimeoutStopSec=40\n";  // a gateway drains for up to 30 s
    u << "LimitNOFILE=" << files << "\n";
    u << "NoNewPrivileges=yes\n";
    u << "PrivateTmp=yes\n";
    u << "ProtectSystem=full\n\n";
    u << "[Install]\n";
    u << "WantedBy=multi-user.target " << name << ".target\n";
    out.push_back({name + "-" + n.name + ".service", u.str()});
  }
  std::ostringstream target;
  target << "# troupe-launch export systemd " << o.topology_file << ": every node of this host; start with\n"
         << "# systemctl enable --now " << name << ".target\n";
  target << "[Unit]\nDescription=troupe nodes of " << fs::path(o.topology_file).filename().string() << "\n";
  target << "\n[Install]\nWantedBy=multi-user.target\n";
  out.push_back({name + ".target", target.str()});
  return out;
}

expected<std::vector<exported_file>> k8s_manifests(const topology& t, const model_config& c, uint64_t model_bytes,
                                                   const export_options& o) {
  const std::string name = deployment_name(o.topology_file);
  // The topology as the pods read it: each node's host its Service's name, model files
  // under /models, the API keys from the Secret, the client endpoints on every address.
  toml::table tbl;
  try {
    tbl = toml::parse(o.topology_text);
  } catch (const toml::parse_error& e) {
    return error{o.topology_file + ": " + std::string(e.description())};
  }
  auto under_models = [](const std::string& p) { return "/models/" + fs::path(p).filename().string(); };
  if (auto* m = tbl["model"].as_table()) {
    m->insert_or_assign("path", under_models(t.model.path));
    if (!t.model.tokenizer.empty()) m->insert_or_assign("tokenizer", under_models(t.model.tokenizer));
  }
  if (auto* sp = tbl["speculative"].as_table(); sp && !t.speculative.draft.empty())
    sp->insert_or_assign("draft", under_models(t.speculative.draft));
  if (auto* sp = tbl["speculative"].as_table(); sp && !t.speculative.heads.empty())
    sp->insert_or_assign("heads", under_models(t.speculative.heads));
  if (auto* g = tbl["gateway"].as_table()) {
    g->insert_or_assign("capnp", "0.0.0.0:" + std::to_string(t.gateway.capnp.port));
    if (t.gateway.http.port != 0) g->insert_or_assign("http", "0.0.0.0:" + std::to_string(t.gateway.http.port));
    g->insert_or_assign("api_keys_file", "/etc/troupe/secrets/api-keys");
  }
  // Each pod's address is on the cluster's network: without [tls] its internal ports are
  // open to whoever reaches the pods, which the nodes refuse unless told (and say so at
  // every start).
  if (auto* nodes = tbl["node"].as_array())
    for (auto& n : *nodes)
      if (auto* nt = n.as_table()) {
        nt->insert_or_assign("host", name + "-" + (*nt)["name"].value_or(std::string()));
        if (!t.tls.on()) nt->insert_or_assign("insecure_internal_ports", true);
      }
  std::ostringstream topo;
  topo << tbl << "\n";

  std::ostringstream y;
  y << "# troupe-launch export k8s " << o.topology_file << ". Before applying: put the model files in the\n"
    << "# PersistentVolumeClaim " << q(o.models_claim) << " (mounted at /models), build an image with troupe-node\n"
    << "# on its PATH (" << o.image << "), and create the API keys, one a line:\n"
    << "#   kubectl create secret generic " << name << "-api-keys --from-file=api-keys=KEYS_FILE\n";
  if (!t.tls.on())
    y << "# WARNING: the topology has no [tls]: the nodes' internal ports (agents, step links, KV channels) take\n"
      << "# orders and data from any pod that reaches them (insecure_internal_ports = true below). Add a [tls]\n"
      << "# table and export again for links that authenticate their peers.\n";
  y << "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " << name << "-topology\n"
    << "  labels:\n    app.kubernetes.io/name: troupe\n    app.kubernetes.io/instance: " << name << "\n"
    << "data:\n  topology.toml: |\n";
  std::istringstream lines(topo.str());
  for (std::string line; std::getline(lines, line);) y << "    " << line << "\n";
  for (const auto& n : t.nodes) {
    const int gateway_index = t.gateway.index_of(n.name);
    const bool gateway = gateway_index >= 0;
    const tools::gateway_place place = gateway ? t.gateway.places()[static_cast<size_t>(gateway_index)] : tools::gateway_place{};
    const std::string unit = name + "-" + n.name;
    // Its address: a headless Service that names the pod as soon as it has an address
    // (the nodes find each other before they are ready).
    y << "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: " << unit << "\n"
      << "  labels:\n    app.kubernetes.io/name: troupe\n    app.kubernetes.io/instance: " << name << "\n"
      << "spec:\n  clusterIP: None\n  publishNotReadyAddresses: true\n"
      << "  selector:\n    app.kubernetes.io/instance: " << name << "\n    troupe.node: " << q(n.name) << "\n"
      << "  ports:\n    - name: agent\n      port: " << n.port << "\n      targetPort: agent\n";
    const uint64_t memory = node_memory_bytes(t, c, model_bytes, n.name);
    const int32_t gpus = gpus_of(t, n.name);
    y << "---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: " << unit << "\n"
      << "  labels:\n    app.kubernetes.io/name: troupe\n    app.kubernetes.io/instance: " << name
      << "\n    app.kubernetes.io/component: " << (gateway ? "gateway" : "node") << "\n"
      << "spec:\n  serviceName: " << unit << "\n  replicas: 1\n  podManagementPolicy: Parallel\n"
      << "  selector:\n    matchLabels:\n      app.kubernetes.io/instance: " << name << "\n      troupe.node: " << q(n.name) << "\n"
      << "  template:\n    metadata:\n      labels:\n        app.kubernetes.io/name: troupe\n        app.kubernetes.io/instance: "
      << name << "\n        troupe.node: " << q(n.name) << "\n"
      << (gateway ? "        troupe.gateway: \"true\"\n" : "")
      << "    spec:\n      terminationGracePeriodSeconds: 40\n"
      << "      containers:\n        - name: troupe-node\n          image: " << q(o.image) << "\n"
      << "          command: [\"troupe-node\", \"/etc/troupe/topology.toml\", \"--node\", " << q(n.name) << "]\n"
      << "          ports:\n            - name: agent\n              containerPort: " << n.port << "\n";
    if (gateway) {
      y << "            - name: capnp\n              containerPort: " << place.capnp.port << "\n";
      if (place.http.port != 0) y << "            - name: http\n              containerPort: " << place.http.port << "\n";
    }
    // Loading weights takes time: the startup probe allows 10 minutes. Ready: the gateway
    // while /health says a replica can serve (503 while none can, or while it drains);
    // another node once its agent answers.
    y << "          startupProbe:\n            tcpSocket:\n              port: agent\n            periodSeconds: 5\n"
      << "            failureThreshold: 120\n";
    if (gateway && place.http.port != 0)
      y << "          readinessProbe:\n            httpGet:\n              path: /health\n              port: http\n"
        << "            periodSeconds: 2\n            failureThreshold: 2\n";
    else
      y << "          readinessProbe:\n            tcpSocket:\n              port: " << (gateway ? "capnp" : "agent") << "\n"
        << "            periodSeconds: 2\n";
    y << "          livenessProbe:\n            tcpSocket:\n              port: agent\n            periodSeconds: 10\n"
      << "            failureThreshold: 6\n";
    y << "          resources:\n            requests:\n              cpu: " << q(std::to_string(n.threads)) << "\n"
      << "              memory: " << q(mib(memory)) << "\n            limits:\n              memory: "
      << q(mib(memory + memory / 2)) << "\n";
    if (gpus > 0) y << "              nvidia.com/gpu: " << gpus << "\n";
    y << "          volumeMounts:\n            - name: topology\n              mountPath: /etc/troupe\n              readOnly: true\n"
      << "            - name: models\n              mountPath: /models\n              readOnly: true\n";
    if (gateway) y << "            - name: api-keys\n              mountPath: /etc/troupe/secrets\n              readOnly: true\n";
    y << "      volumes:\n        - name: topology\n          configMap:\n            name: " << name << "-topology\n"
      << "        - name: models\n          persistentVolumeClaim:\n            claimName: " << q(o.models_claim)
      << "\n            readOnly: true\n";
    if (gateway)
      y << "        - name: api-keys\n          secret:\n            secretName: " << name << "-api-keys\n";
  }
  // The client endpoints: every gateway of the deployment behind one Service (kube-proxy
  // spreads the connections over those that are ready).
  y << "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: " << name << "\n"
    << "  labels:\n    app.kubernetes.io/name: troupe\n    app.kubernetes.io/instance: " << name << "\n"
    << "spec:\n  selector:\n    app.kubernetes.io/instance: " << name << "\n    troupe.gateway: \"true\"\n"
    << "  ports:\n    - name: capnp\n      port: " << t.gateway.capnp.port << "\n      targetPort: capnp\n";
  if (t.gateway.http.port != 0) y << "    - name: http\n      port: " << t.gateway.http.port << "\n      targetPort: http\n";
  return std::vector<exported_file>{{name + ".yaml", y.str()}};
}

int run_export(const topology& t, const std::string& topology_path, const std::string& kind, const std::string& out_dir,
               export_options o) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "troupe-launch export: %s\n", why.c_str());
    return 1;
  };
  if (o.topology_file.empty()) o.topology_file = fs::absolute(topology_path).lexically_normal().string();
  o.bin_dir = fs::absolute(o.bin_dir).lexically_normal().string();  // (systemd takes absolute paths only)
  std::vector<exported_file> files;
  if (kind == "systemd") {
    files = systemd_units(t, o);
  } else {
    std::ifstream in(topology_path, std::ios::binary);
    o.topology_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    auto m = load_model(t.model.path);
    if (!m) return fail(m.err().message);
    std::error_code ec;
    const uint64_t bytes = fs::file_size(t.model.path, ec);
    if (ec) return fail(t.model.path + ": " + ec.message());
    auto made = k8s_manifests(t, m->config, bytes, o);
    if (!made) return fail(made.err().message);
    files = std::move(made).value();
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return fail(out_dir + ": " + ec.message());
  for (const exported_file& f : files) {
    const fs::path path = fs::path(out_dir) / f.name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << f.text;
    if (!out) return fail(path.string() + ": cannot write");
    std::printf("%s\n", path.string().c_str());
  }
  return 0;
}

}  // namespace troupe::tools

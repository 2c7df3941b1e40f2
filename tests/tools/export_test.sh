#!/usr/bin/env bash
# troupe-launch export, for every topology in deploy/: systemd units that
# `systemd-analyze verify` passes without a word (one service per node, restarts as
# [failure] says, the gateway after its host's other nodes), and Kubernetes manifests
# checked for their structure (a documented check, deploy/README.md: names, selectors
# that match, probes on declared ports, resources, volumes, a ConfigMap whose topology
# parses). Writes only under a scratch directory.
# Usage: export_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
scratch
command -v systemd-analyze >/dev/null || fail "systemd-analyze is not installed (tools/install-packages.sh installs systemd)"
launch=$build/tools/troupe-launch

n=0
for topo in "$src"/deploy/*.toml; do
  stem=$(basename "$topo" .toml)
  out=$work/$stem
  "$launch" export systemd "$topo" --out "$out/systemd" --bin-dir "$build/tools" --user troupe >"$work/list" ||
    fail "$stem: export systemd"
  nodes=$(grep -c '^\[\[node\]\]' "$topo")
  [[ $(ls "$out/systemd"/*.service | wc -l) == "$nodes" ]] || fail "$stem: not one unit per node"
  [[ -f $out/systemd/troupe-$stem.target ]] || fail "$stem: no target"
  (cd "$out/systemd" && systemd-analyze verify ./*.service ./*.target) >"$work/verify" 2>&1 ||
    fail "$stem: systemd-analyze verify: $(cat "$work/verify")"
  [[ ! -s $work/verify ]] || fail "$stem: systemd-analyze verify warns: $(cat "$work/verify")"
  python3 - "$topo" "$out/systemd" "$stem" <<'PY' || fail "$stem: the units do not say what the topology does"
import configparser, glob, os, sys, tomllib
topo = tomllib.load(open(sys.argv[1], "rb"))
restart = topo.get("failure", {}).get("restart", "always")
gateways = [topo["gateway"]["node"]] + [g["node"] for g in topo["gateway"].get("also", [])]
hosts = {n["name"]: n["host"] for n in topo["node"]}
for n in topo["node"]:
    path = os.path.join(sys.argv[2], f"troupe-{sys.argv[3]}-{n['name']}.service")
    c = configparser.ConfigParser(strict=False, interpolation=None)
    c.optionxform = str
    c.read(path)
    s = c["Service"]
    assert s["ExecStart"].endswith(f"--node {n['name']}"), s["ExecStart"]
    assert s["Restart"] == ("always" if restart == "always" else "no"), s["Restart"]
    assert s["User"] == "troupe"
    assert int(s["LimitNOFILE"]) > 2 * topo["gateway"].get("max_connections", 1024)
    after = c["Unit"]["After"].split()
    if n["name"] in gateways:  # after its host's other nodes, gateways aside (no cycle)
        for m, h in hosts.items():
            if m not in gateways and h == n["host"]:
                assert f"troupe-{sys.argv[3]}-{m}.service" in after, (m, after)
PY

  "$launch" export k8s "$topo" --out "$out/k8s" --image registry.example/troupe:1 >/dev/null || fail "$stem: export k8s"
  python3 - "$topo" "$out/k8s/troupe-$stem.yaml" "$work/$stem-pod.toml" <<'PY' || fail "$stem: the manifests are not sound"
import re, sys, tomllib, yaml
topo = tomllib.load(open(sys.argv[1], "rb"))
docs = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d is not None]
dns = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
by_kind = {}
for d in docs:
    for k in ("apiVersion", "kind", "metadata"):
        assert k in d, f"a document without {k}"
    name = d["metadata"]["name"]
    assert dns.match(name) and len(name) <= 63, name
    by_kind.setdefault(d["kind"], {})[name] = d
nodes = [n["name"] for n in topo["node"]]
assert len(by_kind["ConfigMap"]) == 1
assert len(by_kind["StatefulSet"]) == len(nodes)
assert len(by_kind["Service"]) == len(nodes) + 1
configmap = next(iter(by_kind["ConfigMap"].values()))
open(sys.argv[3], "w").write(configmap["data"]["topology.toml"])
pod_topo = tomllib.loads(configmap["data"]["topology.toml"])
services = by_kind["Service"]
def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())
for st in by_kind["StatefulSet"].values():
    spec = st["spec"]
    tmpl = spec["template"]
    labels = tmpl["metadata"]["labels"]
    assert selects(spec["selector"]["matchLabels"], labels), "selector does not match the pod"
    headless = services[spec["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and selects(headless["spec"]["selector"], labels)
    pod = tmpl["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "registry.example/troupe:1"
    assert c["command"][:2] == ["troupe-node", "/etc/troupe/topology.toml"] and c["command"][2] == "--node"
    node = c["command"][3]
    assert labels["troupe.node"] == node and node in nodes
    # The node's address in the pods' topology is its headless Service, at its port.
    spec_node = next(n for n in pod_topo["node"] if n["name"] == node)
    assert spec_node["host"] == spec["serviceName"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["agent"] == spec_node["port"]
    assert headless["spec"]["ports"][0]["port"] == spec_node["port"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c[probe]
        port = (p.get("httpGet") or p.get("tcpSocket"))["port"]
        assert port in ports, f"{probe} on an undeclared port {port}"
    if node == topo["gateway"]["node"] and "http" in ports:
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    req, lim = c["resources"]["requests"], c["resources"]["limits"]
    mem = lambda s: int(s[:-2])
    assert int(req["cpu"]) >= 1 and mem(req["memory"]) >= 256 and mem(lim["memory"]) >= mem(req["memory"])
    gpus = sum(1 for r in topo["replica"] for s in r["stages"] if s["node"] == node for d in s["devices"] if d != "cpu")
    assert ("nvidia.com/gpu" in lim) == (gpus > 0)
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        assert m["name"] in volumes, f"mount of an undeclared volume {m['name']}"
    assert volumes["topology"]["configMap"]["name"] == configmap["metadata"]["name"]
# The client Service: every gateway's pod (none other), each with its declared ports.
client = [s for s in services.values() if s["spec"].get("clusterIP") != "None"]
assert len(client) == 1
gateways = [topo["gateway"]["node"]] + [g["node"] for g in topo["gateway"].get("also", [])]
for st in by_kind["StatefulSet"].values():
    labels = st["spec"]["template"]["metadata"]["labels"]
    is_gateway = labels["troupe.node"] in gateways
    assert selects(client[0]["spec"]["selector"], labels) == is_gateway, labels["troupe.node"]
    if is_gateway:
        gw_ports = {p["name"] for p in st["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert all(p["targetPort"] in gw_ports for p in client[0]["spec"]["ports"])
assert pod_topo["gateway"]["api_keys_file"] == "/etc/troupe/secrets/api-keys"
# Off loopback, a node without [tls] must say that its internal ports may be open.
for n in pod_topo["node"]:
    assert n.get("insecure_internal_ports", False) == ("tls" not in topo), n
assert pod_topo["model"]["path"].startswith("/models/")
PY
  # The pods' topology parses (the models are not here to check it against).
  set +e
  "$launch" status "$work/$stem-pod.toml" --state-dir "$work/state" >"$work/parse" 2>&1
  rc=$?
  set -e
  [[ $rc == 3 ]] || fail "$stem: the ConfigMap's topology does not parse: $(cat "$work/parse")"
  n=$((n + 1))
done
[[ $n -ge 7 ]] || fail "only $n topologies"

# Bad input: an unknown kind, a missing --out.
if "$launch" export nomad "$src/deploy/pp2.toml" --out "$work/x" >/dev/null 2>&1; then fail "export nomad was accepted"; fi
if "$launch" export systemd "$src/deploy/pp2.toml" >/dev/null 2>&1; then fail "export without --out was accepted"; fi
echo "PASS: $n topologies exported and checked"

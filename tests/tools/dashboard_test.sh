#!/usr/bin/env bash
# deploy/grafana's dashboard and deploy/prometheus's alerting rules against a live node:
# every metric, label and label value their expressions name is one the node's /metrics
# exports; a real Prometheus (Debian's) scraping the node loads the rules healthy and
# evaluates every dashboard expression without an error; `promtool check rules` and the
# rules' unit tests (`promtool test rules`) pass. Bounded in time; the node and Prometheus
# are always stopped.
# Usage: dashboard_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
scratch
command -v prometheus >/dev/null && command -v promtool >/dev/null || fail "prometheus is not installed (tools/install-packages.sh installs it)"
dashboard=$src/deploy/grafana/troupe-dashboard.json
rules=$src/deploy/prometheus/troupe-alerts.yml

promtool check rules "$rules" >"$work/check.out" 2>&1 || fail "promtool check rules: $(cat "$work/check.out")"
(cd "$src/deploy/prometheus" && promtool test rules troupe-alerts.test.yml) >"$work/test.out" 2>&1 ||
  fail "promtool test rules: $(cat "$work/test.out")"

# A node under a little traffic: some requests served, one refused. It speculates and
# evicts, so that those figures are exported too.
single_topology "$src" "$work"
printf '[speculative]\nmethod = "ngram"\n[kv]\npolicy = "h2o"\nbudget = 64\n' >>"$work/t.toml"
start_node "$work/t.toml" "$work"
base=$http_url
for i in 1 2 3; do
  curl -sf "$base/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}' >/dev/null ||
    fail "a completion failed"
done
curl -s "$base/v1/completions" -d '{"model":"nope","prompt":"x"}' >/dev/null
curl -sf "$base/metrics" >"$work/metrics" || fail "no /metrics"

# Every name, label and value the expressions use, against what the node exports.
python3 - "$dashboard" "$rules" "$work/metrics" "$work/exprs" <<'PY' || fail "the dashboard or the rules name what /metrics lacks"
import json, re, sys
dash = json.load(open(sys.argv[1]))
exprs = []
ids = set()
for p in dash["panels"]:
    assert p["id"] not in ids, f"panel id {p['id']} twice"
    ids.add(p["id"])
    assert {"x", "y", "w", "h"} <= p["gridPos"].keys(), p["title"]
    for t in p.get("targets", []):
        exprs.append(("dashboard: " + p["title"], t["expr"]))
assert len(exprs) >= 20, "too few expressions"
rules = open(sys.argv[2]).read()
for m in re.finditer(r"^\s+expr: (>\n)?((?:.+\n)+?)(?=\s+(for|labels):)", rules, re.M):
    exprs.append(("rules", " ".join(m.group(2).split())))
assert sum(1 for w, _ in exprs if w == "rules") == 6, "the rules' expressions were not all found"

families, labels = {}, {}
for line in open(sys.argv[3]):
    if line.startswith("# TYPE "):
        _, _, name, kind = line.split()
        families[name] = kind
    elif line and not line.startswith("#"):
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
        for k, v in re.findall(r'(\w+)="([^"]*)"', line):
            labels.setdefault(k, set()).add(v)
problems = []
for where, e in exprs:
    for name in set(re.findall(r"\btroupe_[a-z_]+", e)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name in families or (base in families and families[base] == "histogram"):
            continue
        problems.append(f"{where}: {name} is not exported")
    for k, op, v in re.findall(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"', e):
        if k == "instance":
            continue  # (Prometheus's own label)
        if k not in labels:
            problems.append(f"{where}: label {k} is not exported")
            continue
        for alt in (v.split("|") if op == "=~" else [v]):
            if alt not in labels[k]:
                problems.append(f"{where}: {k}=\"{alt}\" is never exported")
    for group in re.findall(r"by \(([^)]*)\)", e):
        for k in (x.strip() for x in group.split(",")):
            if k not in ("instance", "le") and k not in labels:
                problems.append(f"{where}: grouping by {k}, which is not exported")
for p in problems:
    print(p)
# The dashboard's expressions for Prometheus itself: Grafana's variables given values.
with open(sys.argv[4], "w") as out:
    for where, e in exprs:
        if where.startswith("dashboard"):
            out.write(e.replace("$__rate_interval", "1m").replace("$instance", ".*") + "\n")
sys.exit(1 if problems else 0)
PY

# A real Prometheus scrapes the node with the rules loaded.
cp "$rules" "$work/troupe-alerts.yml"
cat >"$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [troupe-alerts.yml]
scrape_configs:
  - job_name: troupe
    static_configs:
      - targets: ["${base#http://}"]
YML
start_prometheus "$work/prometheus.yml"
for _ in $(seq 1 100); do
  curl -s "$prom/api/v1/query" --data-urlencode 'query=troupe_replicas' | grep -q '"value"' && break
  sleep 0.3
done
# A few scrapes (rates need two samples), and every rule evaluated once.
for _ in $(seq 1 100); do
  curl -s "$prom/api/v1/query" --data-urlencode 'query=count_over_time(troupe_replicas[1m]) >= 3' | grep -q '"value"' &&
    ! curl -s "$prom/api/v1/rules" | grep -q '"health":"unknown"' && break
  sleep 0.3
done
python3 - "$prom" "$work/exprs" <<'PY' || fail "Prometheus refused an expression or a rule (log: $(tail -3 "$work/prom.log"))"
import json, sys, urllib.parse, urllib.request
prom = sys.argv[1]
def get(path, **q):
    with urllib.request.urlopen(prom + path + ("?" + urllib.parse.urlencode(q) if q else ""), timeout=10) as r:
        return json.load(r)
bad = 0
exprs = [l.strip() for l in open(sys.argv[2]) if l.strip()]
for e in exprs:
    r = get("/api/v1/query", query=e)
    if r.get("status") != "success":
        print("refused:", e, r)
        bad += 1
# Series the node exports come back: replicas, requests by outcome.
r = get("/api/v1/query", query='sum(troupe_replicas_ready) / sum(troupe_replicas)')
assert r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) == 1.0, r
groups = get("/api/v1/rules")["data"]["groups"]
rules = [x for g in groups for x in g["rules"]]
for x in rules:
    if x.get("health") != "ok":
        print("rule", x["name"], x.get("health"), x.get("lastError"))
        bad += 1
assert len(rules) == 6, f"{len(rules)} rules loaded"
print(f"{len(exprs)} dashboard expressions evaluated, {len(rules)} rules loaded")
sys.exit(1 if bad else 0)
PY
echo PASS

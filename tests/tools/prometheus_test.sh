#!/usr/bin/env bash
# A real Prometheus server (Debian's) scrapes a troupe-node's /metrics; after a known
# number of requests, the scraped counters equal what the test did.
# Usage: prometheus_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
scratch
command -v prometheus >/dev/null || fail "prometheus is not installed (tools/setup.sh installs it)"

single_topology "$src" "$work"
start_node "$work/t.toml" "$work"
base=$http_url

# Known traffic: 5 finished completions of 12 tokens, 2 invalid requests.
prompt_len=$(curl -sf "$base/tokenize" -d '{"model":"stories260K","prompt":"Once upon a time"}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])')
[[ $prompt_len -gt 0 ]] || fail "/tokenize gave no count"
for i in 1 2 3 4 5; do
  curl -sf "$base/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":12,"temperature":0}' >/dev/null
done
for i in 1 2; do curl -s "$base/v1/completions" -d '{"model":"nope","prompt":"x"}' >/dev/null; done

cat >"$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: troupe
    static_configs:
      - targets: ["${base#http://}"]
YML
start_prometheus "$work/prometheus.yml"

query() { curl -s "$prom/api/v1/query" --data-urlencode "query=$1" |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "none")'; }
for _ in $(seq 1 100); do
  [[ $(query 'troupe_generated_tokens_total' 2>/dev/null || echo none) != none ]] && break
  sleep 0.3
done
[[ $(query 'troupe_requests_total{outcome="length"}') == 5 ]] || fail "length requests: $(query 'troupe_requests_total{outcome="length"}')"
[[ $(query 'troupe_requests_total{outcome="invalid"}') == 2 ]] || fail "invalid requests"
[[ $(query 'troupe_generated_tokens_total') == 60 ]] || fail "generated tokens: $(query 'troupe_generated_tokens_total')"
[[ $(query 'troupe_time_to_first_token_seconds_count') == 5 ]] || fail "TTFT count"
[[ $(query 'troupe_kv_blocks{state="used"}') == 0 ]] || fail "KV blocks in use"
# Every prompt was looked up in the prefix cache once (no request was preempted).
[[ $(query 'troupe_prompt_tokens_total') == $((5 * prompt_len)) ]] ||
  fail "prompt tokens: $(query 'troupe_prompt_tokens_total'), not 5 x $prompt_len"
[[ $(query 'troupe_prefix_cache_queried_tokens_total') == $((5 * prompt_len)) ]] ||
  fail "prefix-cache lookups $(query 'troupe_prefix_cache_queried_tokens_total') for $((5 * prompt_len)) prompt tokens"
[[ $(query 'troupe_replicas_ready') == 1 ]] || fail "replicas ready: $(query 'troupe_replicas_ready')"
echo "prometheus scraped the counters the test produced"

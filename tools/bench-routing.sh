#!/usr/bin/env bash
# KV-aware routing, for BENCHMARKS.md: two replicas of the synthetic 110M Q8_0 model (one
# node and one thread each), each with a pool of NUM_BLOCKS blocks (16 tokens), serving a
# multi-tenant workload: TENANTS system prompts of PREFIX words, each request one of them
# plus 20 words of its own, 8 output tokens, at concurrency 4. The pools hold about half of
# the tenants' prompts each: routed by prefix, each replica keeps its tenants cached;
# routed by load, each sees every tenant and keeps few. Side by side: [router] policy
# kv-aware and least-loaded, alternated RUNS times; prints each run, then a Markdown table
# of medians with the share of prompt tokens served from the prefix caches.
#   tools/bench-routing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
TENANTS=${TENANTS:-8}
PREFIX=${PREFIX:-300}
NUM_BLOCKS=${NUM_BLOCKS:-112}
REQUESTS=${REQUESTS:-96}
tools/setup.sh build >&2
source tools/bench-models.sh
model=$(bench_model syn110m.q8_0.gguf --type q8_0)
bench_cluster_scratch
topology() {  # POLICY
  cat >"$work/$1.toml" <<TOML
[model]
path = "$model"
name = "s110m"
[gateway]
node = "n0"
capnp = "127.0.0.1:$(free_port)"
[kv]
num_blocks = $NUM_BLOCKS
[scheduler]
max_running = 8
[router]
policy = "$1"
[[node]]
name = "n0"
host = "127.0.0.1"
port = $(free_port)
threads = 1
[[node]]
name = "n1"
host = "127.0.0.1"
port = $(free_port)
threads = 1
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
[[replica]]
name = "r1"
stages = [ { node = "n1", layers = "all", devices = ["cpu"] } ]
TOML
}
configs=(kv-aware least-loaded)
for c in "${configs[@]}"; do topology "$c"; done
declare -A ttft ttft99 tput cached
for run in $(seq 1 "$RUNS"); do
  for cfg in "${configs[@]}"; do
    url=$(launch_http "$work/$cfg.toml")
    build/tools/troupe-bench --endpoint "$url" --requests "$REQUESTS" --concurrency 4 --shared-prefix "$PREFIX" \
      --prefixes "$TENANTS" --prompt-words $((PREFIX + 20)) --output-tokens 8 --seed "$run" --json "$work/r.json" >/dev/null
    read -r t t99 tp c < <(python3 - "$work/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["errors"] == 0, r["errors_by_kind"]
print("%.0f %.0f %.1f %.0f" % (r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["requests_per_s"],
                               100 * r["cached_prompt_tokens"] / r["prompt_tokens"]))
PY
    )
    ttft[$cfg]+="$t "
    ttft99[$cfg]+="$t99 "
    tput[$cfg]+="$tp "
    cached[$cfg]+="$c "
    echo "run $run, $cfg: TTFT p50 $t ms, p99 $t99 ms, $tp requests/s, $c% of prompt tokens cached" >&2
    launch down "$work/$cfg.toml" >/dev/null
  done
done
base=$(echo "${ttft[least-loaded]}" | median)
echo "| [router] policy | TTFT p50 (ms), runs | median | TTFT p99 median | requests/s | prompt tokens cached | TTFT p50 against least-loaded |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for cfg in "${configs[@]}"; do
  m=$(echo "${ttft[$cfg]}" | median)
  echo "| $cfg | ${ttft[$cfg]}| $m | $(echo "${ttft99[$cfg]}" | median) | $(echo "${tput[$cfg]}" | median) | $(echo "${cached[$cfg]}" | median)% | $(ratio "$base" "$m") |"
done

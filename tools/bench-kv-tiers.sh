#!/usr/bin/env bash
# KV tiers served, for BENCHMARKS.md: one troupe-node (two threads) on the synthetic 110M
# Q8_0 model with a pool of 1,536 tokens, serving multi-turn chat whose conversations
# outgrow it together: troupe-bench --chat, 6 conversations at once, 10 turns of 60 words
# and 12 output tokens each, 3 s of reading between turns (a conversation ends near 900
# tokens). Side by side: no tiers, a host tier of 2 GiB, and small host and disk tiers over
# Redis (a redis-server started here), so that each tier serves some loads. Alternated
# RUNS times; prints each run, then a Markdown table of medians with each tier's hit rate.
#   tools/bench-kv-tiers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
tools/setup.sh build >&2
source tools/bench-models.sh
model=$(bench_model syn110m.q8_0.gguf --type q8_0)
work=$(mktemp -d)
redis_pid=
launch() { build/tools/troupe-launch "$@" --state-dir "$work/state"; }
cleanup() {
  for t in "$work"/*.toml; do [[ -f $t ]] && launch down "$t" >/dev/null 2>&1; done
  [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
redis_pid=$!
topology() {  # NAME TIER_LINES...
  local name=$1
  shift
  cat >"$work/$name.toml" <<TOML
[model]
path = "$model"
name = "s110m"
[gateway]
node = "n0"
capnp = "127.0.0.1:$(free_port)"
[kv]
num_blocks = 96
[scheduler]
max_running = 8
$(printf '%s\n' "$@")
[[node]]
name = "n0"
host = "127.0.0.1"
port = $(free_port)
threads = 2
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
TOML
}
topology none
topology host '[[tier]]' 'kind = "host"' 'capacity_mb = 2048'
# Smaller host and disk tiers than the conversations need: some loads come from each tier.
topology all '[[tier]]' 'kind = "host"' 'capacity_mb = 48' '[[tier]]' 'kind = "disk"' "path = \"$work/disk\"" \
  'capacity_mb = 96' '[[tier]]' 'kind = "redis"' "address = \"127.0.0.1:$redis_port\""
configs=(none host all)
declare -A ttft ttft99 cached hits
for run in $(seq 1 "$RUNS"); do
  for cfg in "${configs[@]}"; do
    rm -rf "$work/disk"
    redis-cli -p "$redis_port" flushall >/dev/null
    url=$(launch_http "$work/$cfg.toml")
    build/tools/troupe-bench --endpoint "$url" --chat --turns 10 --think-ms 3000 --requests 6 --concurrency 6 \
      --prompt-words 60 --output-tokens 12 --seed "$run" --json "$work/r.json" >/dev/null
    sleep 1.5  # the router's next poll
    curl -s "$url/metrics" >"$work/metrics"
    read -r t t99 c h < <(python3 - "$work/r.json" "$work/metrics" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
assert r["errors"] == 0, r["errors_by_kind"]
m = {}
for line in open(sys.argv[2]):
    g = re.match(r'troupe_kv_tier_(hits|lookups)_total\{node="n0",tier="(\w+)"\} (\S+)', line)
    if g:
        m.setdefault(g.group(2), {})[g.group(1)] = float(g.group(3))
rates = ",".join("%s:%.0f%%" % (k, 100 * v["hits"] / v["lookups"] if v.get("lookups") else 0) for k, v in m.items()) or "-"
print("%.0f %.0f %.0f %s" % (r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], 100 * r["cached_prompt_tokens"] / r["prompt_tokens"], rates))
PY
    )
    ttft[$cfg]+="$t "
    ttft99[$cfg]+="$t99 "
    cached[$cfg]+="$c "
    hits[$cfg]=$h
    echo "run $run, $cfg: TTFT p50 $t ms, p99 $t99 ms, $c% of prompt tokens cached, tier hit rates $h" >&2
    launch down "$work/$cfg.toml" >/dev/null
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
base=$(echo "${ttft[none]}" | median)
echo "| KV tiers | TTFT p50 (ms), runs | median | TTFT p99 median | prompt tokens cached | tier hit rates (last run) | TTFT p50 against none |"
echo "| --- | --- | ---: | ---: | ---: | --- | ---: |"
for cfg in "${configs[@]}"; do
  m=$(echo "${ttft[$cfg]}" | median)
  name=$([[ $cfg == all ]] && echo "host 48 MB + disk 96 MB + redis" || echo "$cfg")
  echo "| $name | ${ttft[$cfg]}| $m | $(echo "${ttft99[$cfg]}" | median) | $(echo "${cached[$cfg]}" | median)% | ${hits[$cfg]} | $(ratio "$base" "$m") |"
done

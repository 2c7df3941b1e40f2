#!/usr/bin/env bash
# The gateway's load test of BENCHMARKS.md, on loopback: a server of stories260K holds
# IDLE keep-alive connections and STREAMS concurrent streamed completions
# (tools/gateway-load.py), while troupe-bench at concurrency 8 measures what a working
# client sees; the same troupe-bench run unloaded first is the reference. Prints the
# server's memory per idle connection and per stream, its threads at each stage, and
# troupe-bench's TTFT beside the unloaded run's, as Markdown rows: with the idle
# connections alone, then with the streams too, then (troupe) with troupe-bench's requests
# in an interactive SLO class that runs before the streams' batch class. With LLAMA_CPP set
# (a llama.cpp build's bin folder), llama-server takes the same loads in the same sitting.
#   [LLAMA_CPP=/path/to/llama.cpp/build/bin] tools/bench-gateway.sh [IDLE [STREAMS]]
set -euo pipefail
cd "$(dirname "$0")/.."
idle=${1:-10000} streams=${2:-1000}
tools/setup.sh build >&2
model=$(cd .. && pwd)/shared/models/stories260K/stories260K.gguf
[[ -f $model ]] || { echo "bench-gateway: $model is missing" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"

wait_http() { for _ in $(seq 1 600); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
threads() { ls "/proc/$1/task" | wc -l; }
bench() {  # endpoint model [class]: TTFT p50 / p99 ms of 64 streamed requests at concurrency 8
  rm -f "$work/r.json"
  timeout 180 build/tools/troupe-bench --endpoint "$1" --model "$2" --concurrency 8 --requests 64 --output-tokens 32 \
    --prompt-words 20 ${3:+--class "$3"} --json "$work/r.json" >/dev/null 2>"$work/bench.err" || { echo "failed: $(tail -1 "$work/bench.err" | tr -d "\r" | cut -c1-80) (180 s bound)"; return; }
  python3 - "$work/r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["ttft_ms"]
print(f"{t['p50']:.1f} / {t['p99']:.1f} ({d['completed']} done, {d['errors']} errors)")
PY
}
p99() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ttft_ms"]["p99"])' "$work/r.json" 2>/dev/null || echo 0; }

run() {  # name pid endpoint model streams [class]
  local name=$1 pid=$2 ep=$3 m=$4 streams=$5 class=${6:-}
  wait_http "$ep" || { echo "| $name | did not start | | | | | |"; return; }
  bench "$ep" "$m" "$class" >/dev/null  # warm-up: pages faulted in, caches filled
  local base; base=$(bench "$ep" "$m" "$class"); local base_p99; base_p99=$(p99)
  local rss0 t0; rss0=$(rss_kib "$pid"); t0=$(threads "$pid")
  : >"$work/status"
  python3 tools/gateway-load.py "${ep#http://}" "$idle" "$streams" "$work/status" "$m" >"$work/load.out" 2>&1 &
  local load=$!
  pids+=("$load")
  for _ in $(seq 1 1200); do grep -q '^idle' "$work/status" && break; sleep 0.1; done
  local rss1 t1; rss1=$(rss_kib "$pid"); t1=$(threads "$pid")
  for _ in $(seq 1 1200); do grep -q '^streams' "$work/status" && break; sleep 0.1; done
  sleep 2
  local rss2 t2; rss2=$(rss_kib "$pid"); t2=$(threads "$pid")
  local loaded; loaded=$(bench "$ep" "$m" "$class"); local loaded_p99; loaded_p99=$(p99)
  kill -TERM "$load"; wait "$load" 2>/dev/null || true
  local held; held=$(sed -n 's/^idle //p' "$work/status")
  local summary; summary=$(tail -1 "$work/status")
  python3 - "$name" "$base" "$loaded" "$base_p99" "$loaded_p99" "$rss0" "$rss1" "$rss2" "$t0" "$t1" "$t2" "${held:-0}" "$streams" "$summary" <<'PY'
import json, sys
name, base, loaded, bp, lp, r0, r1, r2, t0, t1, t2, held, streams, summary = sys.argv[1:]
r0, r1, r2, held, streams = int(r0), int(r1), int(r2), int(held or 0), int(streams)
per_idle = (r1 - r0) * 1024 / held if held else float("nan")
per_stream = (r2 - r1) * 1024 / streams if streams else 0
ratio = float(lp) / float(bp) if float(bp) > 0 and float(lp) > 0 else float("nan")
try:
    s = json.loads(summary)
    load = (f"{held} idle held ({s['idle_failed']} refused, {s['idle_closed_by_server']} closed by the server); "
            f"streams {s['streams_done']} done, {s['streams_failed']} failed, statuses {s['stream_statuses']}")
except Exception:
    load = f"{held} idle held; load summary missing"
print(f"| {name} | {base} | {loaded} | {'-' if ratio != ratio else f'{ratio:.2f}x'} | {per_idle:.0f} B | "
      f"{f'{per_stream / 1024:.1f} KiB' if streams else '-'} | {t0} / {t1} / {t2} | {load} |")
PY
}

echo "| server | TTFT p50 / p99 ms, unloaded | TTFT p50 / p99 ms, loaded | p99 ratio | memory per idle connection | per stream | threads: before / idle / streams | load |"
echo "| --- | --- | --- | ---: | ---: | ---: | --- | --- |"
cat >"$work/t.toml" <<TOML
[model]
path = "$model"
name = "stories260K"
[gateway]
node = "n0"
capnp = "127.0.0.1:7700"
idle_timeout_s = 900
[kv]
num_blocks = 16384
[scheduler]
max_running = 256          # admission: 1,024 completions in flight
default_class = "batch"    # the streams'
slo_admission = false      # classes order the queue; nothing is refused
[[class]]
name = "interactive"
ttft_ms = 1000
priority = -10
[[class]]
name = "batch"
ttft_ms = 3600000
priority = 10
[[node]]
name = "n0"
host = "127.0.0.1"
port = 7710
threads = 2
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
TOML
serve_troupe() {
  build/tools/troupe-node "$work/t.toml" --http 127.0.0.1:7701 >"$work/node.out" 2>"$work/node.err" &
  node=$!
  pids+=("$node")
}
stop() { kill -TERM "$1"; wait "$1" 2>/dev/null || true; }
serve_troupe; run "troupe, $idle idle" "$node" http://127.0.0.1:7701 stories260K 0; stop "$node"
serve_troupe; run "troupe, $idle idle + $streams streams" "$node" http://127.0.0.1:7701 stories260K "$streams"; stop "$node"
serve_troupe
run "troupe, $idle idle + $streams streams, bench interactive" "$node" http://127.0.0.1:7701 stories260K "$streams" interactive
stop "$node"

if [[ -n ${LLAMA_CPP:-} ]]; then
  serve_llama() {
    "$LLAMA_CPP/llama-server" -m "$model" -t 2 -c 8192 -np 16 --host 127.0.0.1 --port 7702 >"$work/llama.log" 2>&1 &
    llama=$!
    pids+=("$llama")
  }
  serve_llama; run "llama-server, $idle idle" "$llama" http://127.0.0.1:7702 stories260K 0; stop "$llama"
  serve_llama; run "llama-server, $idle idle + $streams streams" "$llama" http://127.0.0.1:7702 stories260K "$streams"; stop "$llama"
fi

#!/usr/bin/env bash
# The serving benchmark of BENCHMARKS.md: troupe (troupe-node, HTTP) beside llama.cpp's
# llama-server on the same synthetic 110M Q8_0 model, 2 threads each, driven by
# troupe-bench with the same seeded workloads: plain prompts and a shared 400-word prefix,
# at concurrency 1, 8 and 32; and troupe with its prefix cache off, for the shared-prefix
# comparison. Prints Markdown rows.
#   LLAMA_CPP=/path/to/llama.cpp/build/bin tools/bench-serving.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build >&2
source tools/bench-models.sh
model=$(bench_model syn110m.q8_0.gguf --type q8_0)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

topology() {  # prefix_caching
  cat >"$work/t-$1.toml" <<TOML
[model]
path = "$model"
name = "syn110m"
[gateway]
node = "n0"
capnp = "127.0.0.1:7600"
[kv]
num_blocks = 4096
prefix_caching = $1
[scheduler]
max_running = 32
[[node]]
name = "n0"
host = "127.0.0.1"
port = 7610
threads = 2
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
TOML
}
wait_http() { for _ in $(seq 1 600); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }
bench() {  # name endpoint model concurrency requests prompt-words shared-prefix-words
  build/tools/troupe-bench --endpoint "$2" --model "$3" --concurrency "$4" --requests "$5" --output-tokens 64 \
    --prompt-words "$6" --shared-prefix "$7" --json "$work/r.json" >/dev/null 2>"$work/bench.err" ||
    { echo "| $1 | $4 | failed: $(tail -1 "$work/bench.err") | | | |"; return 0; }
  python3 - "$work/r.json" "$1" "$4" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {d['completed']} | {d['output_tokens_per_s']:.1f} | "
      f"{d['ttft_ms']['p50']:.0f} / {d['ttft_ms']['p99']:.0f} | {d['tpot_ms']['p50']:.1f} / {d['tpot_ms']['p99']:.1f} |")
PY
}

echo "| server, workload | concurrency | done | output tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for caching in true false; do
  topology $caching
  build/tools/troupe-node "$work/t-$caching.toml" --http 127.0.0.1:7601 >"$work/node.out" 2>"$work/node.err" &
  pids+=($!)
  wait_http http://127.0.0.1:7601
  if [[ $caching == true ]]; then
    for c in 1 8 32; do bench "troupe, plain" http://127.0.0.1:7601 syn110m $c $((c < 8 ? 8 : 2 * c)) 100 0; done
  fi
  for c in 1 8 32; do
    bench "troupe, shared prefix (cache $([[ $caching == true ]] && echo on || echo off))" http://127.0.0.1:7601 syn110m $c \
      $((c < 8 ? 8 : 2 * c)) 416 400
  done
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
done
if [[ -n ${LLAMA_CPP:-} ]]; then
  "$LLAMA_CPP/llama-server" -m "$model" -t 2 -c 32768 -np 32 -fa --port 7602 >"$work/llama.log" 2>&1 &
  pids+=($!)
  wait_http http://127.0.0.1:7602
  for c in 1 8 32; do bench "llama-server, plain" http://127.0.0.1:7602 syn110m $c $((c < 8 ? 8 : 2 * c)) 100 0; done
  for c in 1 8 32; do
    bench "llama-server, shared prefix" http://127.0.0.1:7602 syn110m $c $((c < 8 ? 8 : 2 * c)) 416 400
  done
fi

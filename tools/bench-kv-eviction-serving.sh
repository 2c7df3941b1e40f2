#!/usr/bin/env bash
# KV eviction served, for BENCHMARKS.md: a PP=2 cluster (two troupe-node processes, one
# thread each) on the synthetic 110M Q8_0 model with a 4,096-token context, its [kv]
# policy the full cache, then h2o, scissorhands and streaming at a budget of 384 tokens;
# troupe-bench over HTTP, 8 requests of ~260 prompt tokens and 1,500 output tokens at
# concurrency 4. The attention sums of h2o and scissorhands cross the step link with
# every step. Alternated RUNS times; prints each run and a Markdown table of medians.
#   tools/bench-kv-eviction-serving.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
BENCH_DIR=${BENCH_DIR:-/tmp/troupe-bench}
mkdir -p "$BENCH_DIR"
tools/setup.sh build >&2
model=$BENCH_DIR/s110m-4k.gguf
[[ -f $model ]] || build/tools/make-model "$model" --preset 110m --type q8_0 --context 4096 >&2
work=$(mktemp -d)
launch() { build/tools/troupe-launch "$@" --state-dir "$work/state"; }
cleanup() { for t in "$work"/*.toml; do [[ -f $t ]] && launch down "$t" >/dev/null 2>&1; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
topology() {  # NAME KV_LINES...
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
num_blocks = 2048
$(printf '%s\n' "$@")
[scheduler]
max_running = 8
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
stages = [ { node = "n0", layers = "0-5", devices = ["cpu"] }, { node = "n1", layers = "6-end", devices = ["cpu"] } ]
TOML
}
topology full
for p in h2o scissorhands streaming; do topology "$p" "policy = \"$p\"" "budget = 384"; done
declare -A tpot tput
for run in $(seq 1 "$RUNS"); do
  for cfg in full h2o scissorhands streaming; do
    url=$(launch_http "$work/$cfg.toml")
    build/tools/troupe-bench --endpoint "$url" --requests 8 --concurrency 4 --prompt-words 200 --output-tokens 1500 \
      --seed "$run" --json "$work/r.json" >/dev/null
    read -r t r < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["errors"] == 0, r["errors_by_kind"]
print("%.1f %.1f" % (r["tpot_ms"]["p50"], r["output_tokens_per_s"]))' "$work/r.json")
    tpot[$cfg]+="$t "
    tput[$cfg]+="$r "
    echo "run $run, $cfg: TPOT p50 $t ms, $r output tok/s" >&2
    launch down "$work/$cfg.toml" >/dev/null
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
echo "| KV cache | TPOT p50 (ms), runs | median | output tok/s, runs | median | throughput against the full cache |"
echo "| --- | --- | ---: | --- | ---: | ---: |"
base=$(echo "${tput[full]}" | median)
for cfg in full h2o scissorhands streaming; do
  name=$([[ $cfg == full ]] && echo "full" || echo "$cfg, 384")
  m=$(echo "${tput[$cfg]}" | median)
  echo "| $name | ${tpot[$cfg]}| $(echo "${tpot[$cfg]}" | median) | ${tput[$cfg]}| $m | $(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.2fx", a / b}') |"
done

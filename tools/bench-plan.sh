#!/usr/bin/env bash
# troupe-plan's predictions against troupe-bench on this machine (the table in
# BENCHMARKS.md): calibrate the machine with troupe-perf; fit the serving path's step
# overhead to troupe-bench runs at concurrency 1 of one replica on a node of 2 threads and
# of 1, and the all-reduce latency to one of TP=2; then, for each layout,
# run troupe-bench under Poisson arrivals and in a closed loop and predict the same
# workloads with troupe-plan (which simulates 4x the requests, for steadier percentiles).
#   tools/bench-plan.sh
#   RATE=1 CONCURRENCY=8 LAYOUTS="pp1 pp2" tools/bench-plan.sh
#   KEEP=dir tools/bench-plan.sh      also keeps the profile and every run's JSON in dir
#                                     (tests/data/plan-recorded holds one such sitting)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build >&2
source tools/bench-models.sh
model=$(bench_model syn110m.q8_0.gguf --type q8_0)
rate=${RATE:-0.5}          # Poisson requests/s
rate_requests=${RATE_REQUESTS:-40}
conc=${CONCURRENCY:-8}    # closed loop: throughput at saturation
conc_requests=${CONCURRENCY_REQUESTS:-32}
layouts=(${LAYOUTS:-pp1 pp2 replicas2 tp2})
out_tokens=64
prompt_words=100
work=$(mktemp -d)
cleanup() {
  for t in "$work"/*.toml; do [[ -f $t ]] && build/tools/troupe-launch down "$t" --state-dir "$work" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

topology() {  # name, threads per node, replicas (TOML)
  cat >"$work/$1.toml" <<TOML
[model]
path = "$model"
[gateway]
node = "n0"
capnp = "127.0.0.1:7690"
[kv]
num_blocks = 2048
[[node]]
name = "n0"
host = "127.0.0.1"
port = 7691
threads = $2
[[node]]
name = "n1"
host = "127.0.0.1"
port = 7692
threads = $2
$3
TOML
}
topology pp1 2 '[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]'
topology pp2 1 '[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "0-5", devices = ["cpu"] }, { node = "n1", layers = "6-end", devices = ["cpu"] } ]'
topology replicas2 1 '[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
[[replica]]
name = "r1"
stages = [ { node = "n1", layers = "all", devices = ["cpu"] } ]'
topology one 1 '[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]'
topology tp2 2 '[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu", "cpu"] } ]'
declare -A layout=([pp1]="pp=1,threads=2" [pp2]="pp=2,threads=1" [replicas2]="replicas=2,threads=1"
                   [tp2]="tp=2,threads=1" [one]="pp=1,threads=1")

bench() {  # topology, json, troupe-bench load flags...
  local t=$1 json=$2
  shift 2
  build/tools/troupe-launch up "$work/$t.toml" --state-dir "$work" >/dev/null
  build/tools/troupe-bench --endpoint capnp://127.0.0.1:7690 "$@" --output-tokens $out_tokens \
    --prompt-words $prompt_words --json "$json" >/dev/null
  build/tools/troupe-launch down "$work/$t.toml" --state-dir "$work" >/dev/null 2>&1
}
predict() {  # topology, measured json, plan json, troupe-plan load flags...
  local t=$1 measured=$2 json=$3
  shift 3
  local prompt
  prompt=$(python3 -c "import json; d = json.load(open('$measured')); print(round(d['prompt_tokens'] / d['completed']))")
  build/tools/troupe-plan --hardware "$work/machine.json" --model "$model" --layout "${layout[$t]}" "$@" \
    --prompt-tokens "$prompt" --output-tokens $out_tokens --json "$json" >/dev/null
}

echo "troupe-plan against troupe-bench: calibrating this machine (troupe-perf calibrate)" >&2
build/tools/troupe-perf -r 2 calibrate "$model" -o "$work/machine.json" >&2
for t in pp1 one tp2; do  # nodes of 2 threads and of 1, then the all-reduce between shards
  echo "fitting $t at concurrency 1" >&2
  bench $t "$work/fit-$t.json" --concurrency 1 --requests 6
  build/tools/troupe-plan fit --hardware "$work/machine.json" --model "$model" --layout "${layout[$t]}" \
    --bench "$work/fit-$t.json" --out "$work/machine.json" >&2
done

echo "| layout | load | out tok/s measured / predicted | TTFT p50 ms measured / predicted | TPOT p50 ms measured / predicted |"
echo "| --- | --- | ---: | ---: | ---: |"
for t in "${layouts[@]}"; do
  for load in "rate $rate" "concurrency $conc"; do
    set -- $load
    echo "measuring $t at $1 $2" >&2
    if [[ $1 == rate ]]; then n=$rate_requests; else n=$conc_requests; fi
    bench "$t" "$work/$t-$1.json" --$1 "$2" --requests $n
    predict "$t" "$work/$t-$1.json" "$work/$t-$1-plan.json" --$1 "$2" --requests $((n * 4))
    python3 - "$work/$t-$1.json" "$work/$t-$1-plan.json" "$t (${layout[$t]})" "$([[ $1 == rate ]] && echo "$2 req/s" || echo "c=$2")" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))["layouts"][0]
def cell(a, b, digits):
    return f"{a:.{digits}f} / {b:.{digits}f} ({b / a:.2f}x)"
# (Under Poisson arrivals below capacity, throughput is the offered load: not a prediction.)
tput = "-" if m.get("rate") else cell(m['output_tokens_per_s'], p['output_tokens_per_s'], 1)
print(f"| {sys.argv[3]} | {sys.argv[4]} | {tput} | "
      f"{cell(m['ttft_ms']['p50'], p['ttft_ms']['p50'], 0)} | {cell(m['tpot_ms']['p50'], p['tpot_ms']['p50'], 1)} |")
PY
  done
done
echo >&2
cp "$work/machine.json" "${PROFILE_OUT:-/dev/null}"
if [[ -n ${KEEP:-} ]]; then
  mkdir -p "$KEEP"
  cp "$work"/*.json "$KEEP/"
  echo "kept the profile and the runs in $KEEP" >&2
fi
grep '"threads"\|"step_overhead_ms"' "$work/machine.json" >&2

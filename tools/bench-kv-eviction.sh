#!/usr/bin/env bash
# KV eviction, for BENCHMARKS.md. Quality: troupe-perf eviction on stories260K (seeded
# generations with each policy at 20% and 50% budgets, the perplexity the full-cache
# model assigns them, and streaming to 4x the context). Speed: single-stream decode of
# 4,000 tokens on the synthetic 110M Q8_0 model with a 4,096-token context, with the full
# cache and with each policy at a 20% budget (800 tokens), alternated RUNS times in one
# sitting; prints each run and the medians.
#   tools/bench-kv-eviction.sh [MODELS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:-../shared/models/stories260K}
RUNS=${RUNS:-3}
TEXTS=${TEXTS:-32}
BENCH_DIR=${BENCH_DIR:-/tmp/troupe-bench}
mkdir -p "$BENCH_DIR"
tools/setup.sh build >&2
perf=build/tools/troupe-perf
"$perf" eviction "$models/stories260K.bin" -z "$models/tok512.bin" --texts "$TEXTS" --long 4
target=$BENCH_DIR/s110m-4k.gguf
[[ -f $target ]] || build/tools/make-model "$target" --preset 110m --type q8_0 --context 4096 >&2
echo
echo "### Decode at long context: 110M Q8_0, 4,000 tokens, budget 800 (20%), $RUNS alternations"
echo
declare -A rates
for run in $(seq 1 "$RUNS"); do
  for policy in none streaming h2o scissorhands; do
    args=()
    [[ $policy != none ]] && args=(--kv-policy "$policy" --kv-budget 800)
    rate=$("$perf" decode "$target" -n 4000 -r 1 "${args[@]}" --json "$BENCH_DIR/r.json" 2>/dev/null >/dev/null &&
           python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))[0]["value"])' "$BENCH_DIR/r.json")
    rates[$policy]+="$rate "
    echo "run $run, $policy: $rate tok/s" >&2
  done
done
echo "| KV cache | runs (tok/s) | median | against the full cache |"
echo "| --- | --- | ---: | ---: |"
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
base=$(echo "${rates[none]}" | median)
for policy in none streaming h2o scissorhands; do
  m=$(echo "${rates[$policy]}" | median)
  name=$([[ $policy == none ]] && echo "full" || echo "$policy, 800")
  echo "| $name | ${rates[$policy]}| $m | $(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.2fx", a / b}') |"
done

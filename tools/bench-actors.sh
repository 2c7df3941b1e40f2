#!/usr/bin/env bash
# Actor-path benchmarks for BENCHMARKS.md: a synthetic 110M Q8_0 model served by
# troupe-launch in three shapes (PP=1, PP=2 over two processes, TP=2 in one process),
# single-stream decode (TP=2 with one thread per shard against TP=1 with one thread) and
# 16 concurrent streams of 128 generated tokens. Prints Markdown rows.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build >&2
source tools/bench-models.sh
model=$(bench_model syn110m.q8_0.gguf --type q8_0)
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT

topology() {  # name, threads, stages (TOML array body)
  cat >"$state/$1.toml" <<TOML
[model]
path = "$model"
[gateway]
node = "n0"
capnp = "127.0.0.1:7490"
[kv]
num_blocks = 2048
[[node]]
name = "n0"
host = "127.0.0.1"
port = 7491
threads = $2
[[node]]
name = "n1"
host = "127.0.0.1"
port = 7492
threads = $2
[[replica]]
name = "r0"
stages = [ $3 ]
TOML
}
topology pp1-1t 1 '{ node = "n0", layers = "all", devices = ["cpu"] }'
topology tp2-1t 2 '{ node = "n0", layers = "all", devices = ["cpu", "cpu"] }'
topology pp1 2 '{ node = "n0", layers = "all", devices = ["cpu"] }'
topology pp2 1 '{ node = "n0", layers = "0-5", devices = ["cpu"] }, { node = "n1", layers = "6-end", devices = ["cpu"] }'
topology tp2 2 '{ node = "n0", layers = "all", devices = ["cpu", "cpu"] }'

client() { build/tools/troupe-client --connect 127.0.0.1:7490 -t 0 --ignore-eos "$@"; }
single() {  # median decode tok/s of 3 streams, one at a time
  for _ in 1 2 3; do client -p "Once upon a time" -n 129 --ids --time 2>&1 >/dev/null | sed -n 's/.*then \([0-9.]*\) tok\/s/\1/p'; done |
    sort -n | sed -n 2p
}
sixteen() {  # output tok/s of 16 concurrent streams of 128 tokens
  local t0 t1
  t0=$(date +%s.%N)
  for i in $(seq 1 16); do client -p "Story number $i begins" -n 133 --ids >/dev/null & done
  wait
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", 16 * 128 / (b - a) }'
}
echo "| shape | threads | single-stream tok/s | 16 streams, output tok/s |"
echo "| --- | --- | ---: | ---: |"
for t in pp1-1t tp2-1t pp1 pp2 tp2; do
  build/tools/troupe-launch up "$state/$t.toml" --state-dir "$state" >/dev/null
  s=$(single)
  m=$( [[ $t == *-1t ]] && echo "-" || sixteen )
  build/tools/troupe-launch down "$state/$t.toml" --state-dir "$state" 2>/dev/null
  echo "| $t | $(sed -n 's/^threads = //p' "$state/$t.toml" | head -1) per node | $s | $m |"
done

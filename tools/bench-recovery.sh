#!/usr/bin/env bash
# Recovery benchmark for BENCHMARKS.md: deploy/pp2x2.toml (two replicas, PP=2 over two
# processes each) serves 640 greedy requests at concurrency 64, first without failures,
# then while troupe-launch chaos injects EVENTS failures (actor kills, SIGKILL, SIGSTOP);
# prints the latency percentiles of both runs side by side and chaos's recovery table.
# Usage: tools/bench-recovery.sh [EVENTS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-12} seed=${2:-5}
tools/setup.sh build >&2
state=$(mktemp -d)
topo=deploy/pp2x2.toml
launch() { build/tools/troupe-launch "$@" --state-dir "$state"; }
cleanup() {
  [[ -f $state/pp2x2.supervisor ]] && kill -9 "$(cat "$state/pp2x2.supervisor")" 2>/dev/null || true
  if [[ -f $state/pp2x2.procs ]]; then
    while read -r _ pid; do kill -CONT "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done <"$state/pp2x2.procs"
  fi
  rm -rf "$state"
}
trap cleanup EXIT
launch up "$topo" >/dev/null
for _ in $(seq 1 100); do [[ $(build/tools/troupe-client --connect 127.0.0.1:7400 --health || true) == ready ]] && break; sleep 0.1; done
bench() {
  build/tools/troupe-bench --endpoint capnp://127.0.0.1:7400 --requests 640 --concurrency 64 --prompt-words 12 \
    --output-tokens 200 --json "$1" >/dev/null
}
echo "troupe-bench: without failures" >&2
bench "$state/calm.json"
echo "troupe-bench: with $events failures (seed $seed)" >&2
launch chaos "$topo" --events "$events" --seed "$seed" --gap-ms 300-800 --stop-ms 1200 >"$state/chaos.out" 2>&1 &
chaos=$!
bench "$state/chaos.json"
wait "$chaos" || true
python3 - "$state/calm.json" "$state/chaos.json" <<'PY'
import json, sys
calm, chaos = (json.load(open(p)) for p in sys.argv[1:3])
print("| run | done | errors | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p99 ms | E2E p50 / p99 / max ms |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, j in (("no failures", calm), ("during chaos", chaos)):
    print(f"| {name} | {j['completed']} | {j['errors']} | {j['output_tokens_per_s']:.0f} | "
          f"{j['ttft_ms']['p50']:.0f} / {j['ttft_ms']['p99']:.0f} | {j['tpot_ms']['p50']:.1f} / {j['tpot_ms']['p99']:.1f} | "
          f"{j['itl_ms']['p99']:.0f} | {j['e2e_ms']['p50']:.0f} / {j['e2e_ms']['p99']:.0f} / {j['e2e_ms']['max']:.0f} |")
PY
echo
grep -v '^$' "$state/chaos.out"

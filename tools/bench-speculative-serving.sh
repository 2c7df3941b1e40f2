#!/usr/bin/env bash
# Speculative decoding served through the actors, for BENCHMARKS.md: one troupe-node
# (HTTP, 2 threads) on the synthetic target of tools/bench-speculative.sh whose drafts
# agree most (damping DAMP), with its topology's [speculative] table set to none, early
# exit after layer 1, and the draft model cut to the target's first layer; troupe-bench
# drives greedy streams at concurrency 1 (10 requests) and 16 (48). One sitting; each
# row's anchor is the plain node just before it. Prints a Markdown table.
#   tools/bench-speculative-serving.sh          1B target, k = 3
#   PRESET=110m DAMP=0.02 tools/bench-speculative-serving.sh
#   METHODS=draft LEVELS=16 tools/bench-speculative-serving.sh     some rows only
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-1b}
K=${K:-3}
DAMP=${DAMP:-0.005}
BENCH_DIR=${BENCH_DIR:-/tmp/troupe-bench}
mkdir -p "$BENCH_DIR"
tools/setup.sh build >&2
mm=build/tools/make-model
target=$BENCH_DIR/spec-$PRESET-damp$DAMP.gguf
draft=$BENCH_DIR/spec-$PRESET-damp$DAMP-draft1.gguf
[[ -f $target ]] || "$mm" "$target" --preset "$PRESET" --type q8_0 --separate-classifier --damp-layers 1 --damp "$DAMP" >&2
[[ -f $draft ]] || "$mm" "$draft" --from "$target" --keep-layers 1 --type q8_0 >&2
work=$(mktemp -d)
node=
cleanup() { [[ -n $node ]] && kill "$node" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

serve() {  # speculative table lines...
  cat >"$work/t.toml" <<TOML
[model]
path = "$target"
name = "target"
[gateway]
node = "n0"
capnp = "127.0.0.1:7650"
[kv]
num_blocks = 2048
[scheduler]
max_running = 32
[speculative]
$(printf '%s\n' "$@")
[[node]]
name = "n0"
host = "127.0.0.1"
port = 7660
threads = 2
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
TOML
  build/tools/troupe-node "$work/t.toml" --http 127.0.0.1:7651 >"$work/node.out" 2>"$work/node.err" &
  node=$!
  for _ in $(seq 1 600); do curl -sf http://127.0.0.1:7651/health >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "the node did not start: $(tail -3 "$work/node.err")" >&2
  exit 1
}
stop() { kill "$node"; wait "$node" 2>/dev/null || true; node=; }
bench() {  # concurrency requests -> "tok/s tpot_p50"
  build/tools/troupe-bench --endpoint http://127.0.0.1:7651 --model target --concurrency "$1" --requests "$2" \
    --output-tokens 64 --prompt-words 40 --json "$work/r.json" >/dev/null 2>"$work/bench.err" ||
    { echo "troupe-bench failed: $(tail -1 "$work/bench.err")" >&2; exit 1; }
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.1f %.1f" % (d["output_tokens_per_s"], d["tpot_ms"]["p50"]))' \
    "$work/r.json"
}
accepted() {  # the node's acceptance, from /metrics
  curl -s http://127.0.0.1:7651/metrics | awk '
    /^troupe_speculative_verifies_total/ {v += $2} /^troupe_speculative_proposed_tokens_total/ {p += $2}
    /^troupe_speculative_accepted_tokens_total/ {a += $2}
    END { if (v > 0) printf "%.0f%% of drafts, %.2f per verify", 100 * a / p, a / v; else printf "none verified" }'
}

echo "### Served through troupe-node: $PRESET Q8_0 target (damping $DAMP), k = $K, greedy, 64 tokens a request"
echo
echo "| proposer | concurrency | plain tok/s | speculative tok/s | speedup | TPOT p50 plain / speculative (ms) | drafts accepted |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
for method in ${METHODS:-early-exit draft}; do
  case $method in
    early-exit) table=('method = "early-exit"' 'exit_layer = 1' "k = $K") ;;
    draft) table=('method = "draft"' "draft = \"$draft\"" "k = $K") ;;
  esac
  for c in ${LEVELS:-1 16}; do
    n=$((c == 1 ? 10 : 48))
    serve 'method = "none"'
    read -r plain plain_tpot <<<"$(bench "$c" "$n")"
    stop
    serve "${table[@]}"
    read -r spec spec_tpot <<<"$(bench "$c" "$n")"
    acc=$(accepted)
    stop
    echo "| $method | $c | $plain | $spec | $(awk -v a="$spec" -v b="$plain" 'BEGIN {printf "%.2f", a / b}')x |" \
         "$plain_tpot / $spec_tpot | $acc |"
  done
done

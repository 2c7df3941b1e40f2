#!/usr/bin/env bash
# Trained proposers and token trees served by a PP=2 cluster, for BENCHMARKS.md: two
# troupe-node processes (troupe-launch, one thread each) serving stories260K split at
# layer 3, over HTTP, with the topology's [speculative] table set to each proposer in turn
# (tests/data's trained Medusa heads, EAGLE head and draft model, n-gram), chains and
# token trees; troupe-bench drives greedy streams at concurrency 1. Plain decoding is
# measured before every row, in the same sitting. Prints a Markdown table.
#   tools/bench-heads-cluster.sh
#   ROWS="medusa-chain medusa-tree" REQUESTS=20 tools/bench-heads-cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
models=${MODELS:-$PWD/../shared/models/stories260K}
trained=$PWD/tests/data/stories260K
REQUESTS=${REQUESTS:-12}
TOKENS=${TOKENS:-200}
tools/setup.sh build >&2
work=$(mktemp -d)
cleanup() { build/tools/troupe-launch down "$work/t.toml" --state-dir "$work/state" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

up() {  # [speculative] lines...
  cat >"$work/t.toml" <<TOML
[model]
path      = "$models/stories260K.bin"
tokenizer = "$models/tok512.bin"
name      = "stories260K"
[gateway]
node  = "n0"
capnp = "127.0.0.1:$(port)"
http  = "127.0.0.1:$(port)"
[speculative]
$(printf '%s\n' "$@")
[[node]]
name = "n0"
host = "127.0.0.1"
port = $(port)
[[node]]
name = "n1"
host = "127.0.0.1"
port = $(port)
[[replica]]
name   = "r0"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] },
           { node = "n1", layers = "3-4", devices = ["cpu"] } ]
draft  = "n1"
TOML
  out=$(build/tools/troupe-launch up "$work/t.toml" --state-dir "$work/state" 2>&1) || { echo "$out" >&2; exit 1; }
  base=$(sed -n 's|^endpoint: \(http://.*\)|\1|p' <<<"$out")
}
down() { build/tools/troupe-launch down "$work/t.toml" --state-dir "$work/state" >/dev/null 2>&1; }
bench() {  # -> "tok/s tpot_p50"
  build/tools/troupe-bench --endpoint "$base" --model stories260K --concurrency 1 --requests "$REQUESTS" \
    --output-tokens "$TOKENS" --prompt-words 8 --json "$work/r.json" >/dev/null 2>"$work/bench.err" ||
    { echo "troupe-bench failed: $(tail -1 "$work/bench.err")" >&2; exit 1; }
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.1f %.2f" % (d["output_tokens_per_s"], d["tpot_ms"]["p50"]))' \
    "$work/r.json"
}
per_verify() {  # tokens per verify step, from /metrics (the router polls each second)
  sleep 1.5
  curl -s "$base/metrics" | awk '
    /^troupe_speculative_verifies_total/ {v += $2} /^troupe_speculative_accepted_tokens_total/ {a += $2}
    END { if (v > 0) printf "%.2f", 1 + a / v; else printf "-" }'
}

echo "| proposer | shape | tokens per verify | plain tok/s | speculative tok/s | speedup | TPOT p50 plain / speculative (ms) |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for row in ${ROWS:-medusa-chain medusa-tree eagle-chain eagle-tree draft-chain draft-tree ngram-chain}; do
  case $row in
    medusa-chain) name="Medusa heads" shape="chain, k 4" table=('method = "medusa"' "heads = \"$trained-medusa.gguf\"" 'k = 4') ;;
    medusa-tree) name="Medusa heads" shape="tree 3,2,1" table=('method = "medusa"' "heads = \"$trained-medusa.gguf\"" 'tree = [3, 2, 1]') ;;
    eagle-chain) name="EAGLE head" shape="chain, k 4" table=('method = "eagle"' "heads = \"$trained-eagle.gguf\"" 'k = 4') ;;
    eagle-tree) name="EAGLE head" shape="tree 2,2,1" table=('method = "eagle"' "heads = \"$trained-eagle.gguf\"" 'tree = [2, 2, 1]') ;;
    draft-chain) name="draft model (trained)" shape="chain, k 4" table=('method = "draft"' "draft = \"$trained-draft.gguf\"" 'k = 4') ;;
    draft-tree) name="draft model (trained)" shape="tree 2,2,1" table=('method = "draft"' "draft = \"$trained-draft.gguf\"" 'tree = [2, 2, 1]') ;;
    ngram-chain) name="n-gram" shape="chain, k 4" table=('method = "ngram"' 'k = 4') ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
  echo "$row ..." >&2
  up 'method = "none"'
  read -r plain plain_tpot <<<"$(bench)"
  down
  up "${table[@]}"
  read -r spec spec_tpot <<<"$(bench)"
  tpv=$(per_verify)
  down
  echo "| $name | $shape | $tpv | $plain | $spec | $(awk -v a="$spec" -v b="$plain" 'BEGIN {printf "%.2f", a / b}')x |" \
       "$plain_tpot / $spec_tpot |"
done

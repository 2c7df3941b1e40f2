#!/usr/bin/env bash
# Trained proposers and token trees served by a PP=2 cluster (two troupe-node processes,
# troupe-launch) over the OpenAI HTTP API: Medusa heads and an EAGLE head drafting in the
# scheduler from the features the last stage returns, and the trained draft model in its
# draft actor on the second node, each as a chain and as a token tree (a fixed shape, or
# one chosen by acceptance). Greedy completions, whole and streamed, of the shared
# prompts and of prompts made at random are troupe-run's plain output; /metrics counts
# acceptance per depth, and per head with Medusa. Heads that cannot work start nothing.
# Bounded in time; every node is stopped.
# Usage: speculative_heads_serve_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
#   SEED=N replays a run's random prompts; VARIANTS="medusa eagle" runs only those (over
#   TLS, TROUPE_TEST_TLS=1, two of them unless VARIANTS names others).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
trained=$src/tests/data/stories260K
launch_scratch
metric() { sed -n "s/^$1 //p" "$work/metrics"; }

# The shared prompts, and three made of words drawn at random (seeded by the run's time,
# printed so that a failure can be replayed).
seed=${SEED:-$(date +%s)}
echo "random prompts seeded by $seed"
prompts=("Once upon a time" "Lily and Tom went to the" "The little dog")
while IFS= read -r p; do prompts+=("$p"); done < <(python3 -c '
import random, sys
r = random.Random(int(sys.argv[1]))
words = "the a little big dog cat girl boy sun tree park ball happy sad went saw said and then one day mom".split()
for _ in range(3): print(" ".join(r.choice(words) for _ in range(r.randint(1, 7))).capitalize())' "$seed")

# Over TLS (the twin), the variants whose traffic crosses the links in ways of their own:
# features coming back from the last stage to the scheduler (EAGLE, a tree chosen by
# acceptance), and draft orders to the draft actor on the other node; the rest differ from
# them only inside a process.
variants="medusa medusa-tree eagle-tree-auto eagle draft-tree-on-n1"
tls_twin && variants="eagle-tree-auto draft-tree-on-n1"
for variant in ${VARIANTS:-$variants}; do
  method=${variant%%-*}
  replica_extra=
  [[ $variant == *-on-n1 ]] && replica_extra='draft  = "n1"'
  case $variant in
    medusa) speculative_topology "$variant" 'method = "medusa"' "heads = \"$trained-medusa.gguf\"" ;;
    medusa-tree) speculative_topology "$variant" 'method = "medusa"' "heads = \"$trained-medusa.gguf\"" 'tree = [3, 2, 1]' ;;
    eagle) speculative_topology "$variant" 'method = "eagle"' "heads = \"$trained-eagle.gguf\"" 'k = 4' ;;
    eagle-tree-auto) speculative_topology "$variant" 'method = "eagle"' "heads = \"$trained-eagle.gguf\"" 'tree = "auto:12"' ;;
    draft-tree-on-n1) speculative_topology "$variant" 'method = "draft"' "draft = \"$trained-draft.gguf\"" 'tree = "3,2,2"' ;;
  esac
  launch_http "$work/$variant.toml" "$variant"

  for p in "${prompts[@]}"; do
    code=$(post /v1/completions "$(python3 -c 'import json,sys; print(json.dumps({"model":"stories260K","prompt":sys.argv[1],"max_tokens":80,"temperature":0,"ignore_eos":True}))' "$p")")
    [[ $code == 200 ]] || fail "$variant: '$p': status $code $(cat "$work/body")"
    served_as_run "$variant: '$p'" "$work/body" 80 "$p"
  done
  code=$(post /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":60,"temperature":0,"ignore_eos":true}')
  [[ $code == 200 ]] || fail "$variant: status $code $(cat "$work/body")"
  served_as_run "$variant" "$work/body" 60 "Once upon a time"
  ref=$(cat "$work/body.text")
  code=$(post /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":60,"temperature":0,"ignore_eos":true,"stream":true}')
  [[ $code == 200 ]] || fail "$variant: streamed: status $code $(cat "$work/body")"
  got=$(streamed_text)
  [[ $got == "$ref" ]] || fail "$variant: streamed: '$got' vs '$ref'"
  # Seeded draws, two choices: both complete.
  code=$(post /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":40,"temperature":0.8,"seed":5,"n":2}')
  [[ $code == 200 ]] || fail "$variant: n 2: status $code $(cat "$work/body")"

  # The router polls the scheduler about once a second: acceptance per depth arrives.
  ok=
  for _ in $(seq 1 50); do
    curl -s "$base/metrics" >"$work/metrics"
    offered=$(metric "troupe_speculative_depth_offered_total{method=\"$method\",depth=\"1\"}")
    kept=$(metric "troupe_speculative_depth_accepted_total{method=\"$method\",depth=\"1\"}")
    if [[ -n $offered && -n $kept ]] && (( offered > 0 && kept > 0 && kept <= offered )); then
      ok=1
      break
    fi
    sleep 0.2
  done
  [[ -n $ok ]] || cat "$state"/*.log >&2 || true  # (the nodes' logs say why)
  [[ -n $ok ]] || fail "$variant: /metrics lacks acceptance by depth: $(grep speculative "$work/metrics" || true)"
  if [[ $method == medusa ]]; then
    head1=$(metric 'troupe_speculative_head_acceptance_ratio{head="1"}')
    python3 -c 'import sys; v = float(sys.argv[1]); assert 0 < v <= 1, v' "${head1:-x}" ||
      fail "$variant: no acceptance for Medusa head 1: $(grep speculative "$work/metrics" || true)"
  fi
  echo "$variant: depth 1 kept $kept of $offered"
  launch down "$work/$variant.toml" >/dev/null
done

# Settings that cannot work: nothing starts, and troupe-launch says why.
replica_extra=
speculative_topology bad-heads-model 'method = "medusa"' "heads = \"$models/stories260K.gguf\""
speculative_topology bad-heads-kind 'method = "eagle"' "heads = \"$trained-medusa.gguf\""
speculative_topology bad-no-heads 'method = "eagle"'
speculative_topology bad-tree-deep 'method = "medusa"' "heads = \"$trained-medusa.gguf\"" 'tree = [2, 2, 1, 1, 1]'
speculative_topology bad-tree-width 'method = "ngram"' 'tree = [2, 0]'
"$build/tools/make-model" "$work/dim128.gguf" --dim 128 --layers 5 --vocab 512 >/dev/null 2>&1
speculative_topology bad-heads-shape 'method = "eagle"' "heads = \"$trained-eagle.gguf\""
sed -i "s|path      = \"$models/stories260K.bin\"|path      = \"$work/dim128.gguf\"|" "$work/bad-heads-shape.toml"
speculative_topology bad-gpu-heads 'method = "medusa"' "heads = \"$trained-medusa.gguf\""
sed -i 's|layers = "3-4", devices = \["cpu"\]|layers = "3-4", devices = ["cuda:0"]|' "$work/bad-gpu-heads.toml"
speculative_topology bad-gpu-tree 'method = "ngram"' 'tree = "2,2"'
sed -i 's|layers = "3-4", devices = \["cpu"\]|layers = "3-4", devices = ["cuda:0"]|' "$work/bad-gpu-tree.toml"
for bad in "bad-gpu-heads:a GPU shard proposes by n-gram only" "bad-gpu-tree:verifies chains, not token trees" \
           "bad-heads-model:is not a head file" "bad-heads-kind:holds Medusa heads" "bad-no-heads:needs [speculative] heads = FILE" \
           "bad-tree-deep:is deeper than the" "bad-tree-width:widths must be integers in 1..16" "bad-heads-shape:dim"; do
  name=${bad%%:*} why=${bad#*:}
  if out=$(launch up "$work/$name.toml" 2>&1); then fail "$name was started"; fi
  grep -qF "$why" <<<"$out" || fail "$name: no reason given: $out"
  [[ ! -f $state/$name.procs ]] || fail "$name: processes were started"
done
echo "trained proposers and token trees in a cluster: every check passed"

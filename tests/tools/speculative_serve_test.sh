#!/usr/bin/env bash
# Speculative decoding served by a PP=2 cluster (two troupe-node processes, troupe-launch)
# over the OpenAI HTTP API, with each proposer in the topology's [speculative] table (and
# a draft model's actor on the second node, reached over the node link as well):
# greedy completions, whole, streamed and with log-probabilities, are troupe-run's plain
# output; a request may
# turn speculation off or cap it, and a cap out of range is a 400; seeded draws with n 2
# complete; /metrics counts the drafts proposed and accepted per method. A [speculative]
# table that cannot work starts nothing. Bounded in time; every node is stopped.
# Usage: speculative_serve_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
launch_scratch

prompts=("Once upon a time" "Lily and Tom went to the" "The little dog")

# Over TLS (the twin), the proposer made in the scheduler and the draft actor reached over
# the node link; the other two differ from them only inside a process.
variants="ngram early-exit draft draft-on-n1"
tls_twin && variants="ngram draft-on-n1"
for variant in $variants; do
  method=${variant%-on-n1}
  replica_extra=
  [[ $variant == *-on-n1 ]] && replica_extra='draft  = "n1"'
  case $method in
    ngram) speculative_topology "$variant" 'method = "ngram"' 'k = 4' ;;
    early-exit) speculative_topology "$variant" 'method = "early-exit"' 'exit_layer = 4' ;;
    draft) speculative_topology "$variant" 'method = "draft"' "draft = \"$models/stories260K.gguf\"" 'k = 5' ;;
  esac
  launch_http "$work/$variant.toml" "$variant"

  for p in "${prompts[@]}"; do
    code=$(post /v1/completions '{"model":"stories260K","prompt":"'"$p"'","max_tokens":80,"temperature":0,"ignore_eos":true}')
    [[ $code == 200 ]] || fail "$variant: '$p': status $code $(cat "$work/body")"
    served_as_run "$variant: '$p'" "$work/body" 80 "$p"
  done
  # Streamed, and with speculation off or capped for the request: the same text, whole.
  code=$(post /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":60,"temperature":0,"ignore_eos":true}')
  [[ $code == 200 ]] || fail "$variant: status $code $(cat "$work/body")"
  served_as_run "$variant" "$work/body" 60 "Once upon a time"
  ref=$(cat "$work/body.text")
  for extra in '"stream":true' '"speculative":0' '"speculative":false' '"speculative":1' '"logprobs":2'; do
    code=$(post /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":60,"temperature":0,"ignore_eos":true,'"$extra"'}')
    [[ $code == 200 ]] || fail "$variant: $extra: status $code $(cat "$work/body")"
    if [[ $extra == '"stream":true' ]]; then
      got=$(streamed_text)
    else
      got=$(text_of)
    fi
    [[ $got == "$ref" ]] || fail "$variant: $extra: '$got' vs '$ref'"
  done
  code=$(post /v1/completions '{"model":"stories260K","prompt":"Once","max_tokens":8,"speculative":17}')
  [[ $code == 400 ]] && grep -q "speculative" "$work/body" || fail "$variant: a cap of 17: status $code $(cat "$work/body")"
  # Seeded draws, two choices: both complete.
  code=$(post /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":40,"temperature":0.8,"seed":5,"n":2}')
  [[ $code == 200 ]] || fail "$variant: n 2: status $code $(cat "$work/body")"
  python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); assert len(b["choices"]) == 2 and all(c["text"] for c in b["choices"])' \
    "$work/body" || fail "$variant: n 2: $(cat "$work/body")"

  # The router polls the scheduler about once a second: the figures arrive.
  ok=
  for _ in $(seq 1 50); do
    curl -s "$base/metrics" >"$work/metrics"
    proposed=$(sed -n "s/^troupe_speculative_proposed_tokens_total{method=\"$method\"} //p" "$work/metrics")
    accepted=$(sed -n "s/^troupe_speculative_accepted_tokens_total{method=\"$method\"} //p" "$work/metrics")
    count=$(sed -n "s/^troupe_speculative_acceptance_length_count{method=\"$method\"} //p" "$work/metrics")
    if [[ -n $proposed && -n $accepted && -n $count ]] && (( proposed > 0 && accepted > 0 && accepted <= proposed && count > 0 )); then
      ok=1
      break
    fi
    sleep 0.2
  done
  [[ -n $ok ]] || fail "$variant: /metrics lacks the drafts: $(grep speculative "$work/metrics" || true)"
  echo "$variant: proposed $proposed, accepted $accepted over $count verifies"
  launch down "$work/$variant.toml" >/dev/null
done

# Settings that cannot work: nothing starts, and troupe-launch says why.
replica_extra=
speculative_topology bad-exit 'method = "early-exit"' 'exit_layer = 5'
speculative_topology bad-key 'method = "ngram"' 'draft_length = 3'
speculative_topology bad-draft 'method = "draft"'
"$build/tools/make-model" "$work/vocab300.gguf" --vocab 300 --layers 1 >/dev/null 2>&1
speculative_topology bad-vocab 'method = "draft"' "draft = \"$work/vocab300.gguf\""
for bad in "bad-exit:exit layer 5 is outside the model" "bad-key:draft_length" "bad-draft:needs [speculative] draft" \
           "bad-vocab:vocabulary has 300 tokens"; do
  name=${bad%%:*} why=${bad#*:}
  if out=$(launch up "$work/$name.toml" 2>&1); then fail "$name was started"; fi
  grep -qF "$why" <<<"$out" || fail "$name: no reason given: $out"
  [[ ! -f $state/$name.procs ]] || fail "$name: processes were started"
done
echo "speculative serving: every check passed"

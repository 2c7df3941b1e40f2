#!/usr/bin/env bash
# KV eviction served by a PP=2 cluster (two troupe-node processes, troupe-launch) over the
# OpenAI HTTP API: the topology's [kv] policy is the deployment's default, and greedy
# completions under it are troupe-run's under the same policy and budget (the attention
# the policy ranks by summed over both stages, across the step link), and each policy's
# logprobs and text are those of an independent reference (kv_eviction_reference.py,
# numpy: attention over exactly the tokens the policy, written from its definition, keeps);
# a request's own kv_eviction overrides it ({"policy": "none"}: troupe-run's plain text), streaming runs
# a request past the model's context, a policy that cannot work is a 400 naming the
# field, and /metrics counts the evicted tokens. [kv] settings that cannot work start
# nothing. Bounded in time; every node is stopped.
# Usage: kv_eviction_serve_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
launch_scratch
# topology NAME LINES...: the PP=2 stories260K topology whose [kv] table holds LINES, and
# $extra_tables after it.
topology() {
  local name=$1
  shift
  pp2_topology "$work/$name.toml" "[kv]" "$@" "${extra_tables[@]}"
}

extra_tables=()
topology h2o 'policy = "h2o"' 'budget = 64'
launch_http "$work/h2o.toml"

# The deployment's policy: troupe-run's text under the same one, whole, which differs from
# the full cache's.
for p in "Once upon a time" "Lily and Tom went to the"; do
  code=$(post /v1/completions '{"model":"stories260K","prompt":"'"$p"'","max_tokens":200,"temperature":0,"ignore_eos":true}')
  [[ $code == 200 ]] || fail "h2o: '$p': status $code $(cat "$work/body")"
  served_as_run "h2o: '$p'" "$work/body" 200 "$p" --kv-policy h2o --kv-budget 64
  h2o_text=$(cat "$work/body.text")
  # The request's own policy: none is the full cache's text; scissorhands its own.
  code=$(post /v1/completions '{"model":"stories260K","prompt":"'"$p"'","max_tokens":200,"temperature":0,"ignore_eos":true,"kv_eviction":{"policy":"none"}}')
  [[ $code == 200 ]] || fail "policy none: '$p': status $code $(cat "$work/body")"
  served_as_run "policy none: '$p'" "$work/body" 200 "$p"
  [[ $(cat "$work/body.text") != "$h2o_text" ]] || fail "h2o: '$p' is the full cache's text: the budget did nothing"
  code=$(post /v1/completions '{"model":"stories260K","prompt":"'"$p"'","max_tokens":200,"temperature":0,"ignore_eos":true,"kv_eviction":{"policy":"scissorhands","budget":48,"window":16}}')
  [[ $code == 200 ]] || fail "scissorhands: '$p': status $code $(cat "$work/body")"
  served_as_run "scissorhands: '$p'" "$work/body" 200 "$p" --kv-policy scissorhands --kv-budget 48 --window 16
done

# Each policy against an independent reference (kv_eviction_reference.py: the checkpoint
# read, attention over exactly the kept tokens at their positions, the policy written from
# its definition): every output token's logprobs and the whole text, after a short prompt
# and after one longer than the budget (which goes in chunks).
prompt_ids() {
  code=$(post /tokenize '{"model":"stories260K","prompt":"'"$1"'"}')
  [[ $code == 200 ]] || fail "tokenize: status $code $(cat "$work/body")"
  python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["tokens"])))' "$work/body"
}
short=$(prompt_ids "Lily and Tom went to the")
long=$(prompt_ids "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she saw a big red ball in the park. She ran to the ball and kicked it very hard. The ball flew over the fence and into the garden of an old man.")
for case in 'short h2o 64' 'short h2o 40 --window 8' 'short scissorhands 48 --window 16' \
            'short scissorhands 40 --window 24 --history 4' 'short streaming 64 --sinks 4' \
            'short streaming 48 --sinks 2 --window 30' 'long h2o 48' 'long scissorhands 64' 'long streaming 40'; do
  read -r which policy budget opts <<<"$case"
  ids=${!which}
  fields=$(python3 -c 'import sys; a = sys.argv[1:]; print("".join(",\"%s\":%s" % (a[i][2:], a[i + 1]) for i in range(0, len(a), 2)))' $opts)
  code=$(post /v1/completions '{"model":"stories260K","prompt":['"$ids"'],"max_tokens":160,"temperature":0,"ignore_eos":true,"logprobs":5,"kv_eviction":{"policy":"'"$policy"'","budget":'"$budget$fields"'}}')
  [[ $code == 200 ]] || fail "reference: $case: status $code $(cat "$work/body")"
  # shellcheck disable=SC2086
  "${TROUPE_TEST_PYTHON:-/usr/bin/python3}" "$(dirname "$0")/kv_eviction_reference.py" "$models/stories260K.bin" \
    "$models/tok512.bin" "$work/body" "$ids" "$policy" "$budget" $opts || fail "reference: $case"
done

# Streaming past the context (512 tokens), streamed as it goes.
code=$(post /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":700,"temperature":0.8,"seed":3,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"kv_eviction":{"policy":"streaming","budget":96,"sinks":4}}')
[[ $code == 200 ]] || fail "streaming past the context: status $code $(head -c 300 "$work/body")"
python3 - "$work/body" <<'PY' || fail "streaming past the context: $(tail -c 400 "$work/body")"
import json, sys
events = [l[6:].strip() for l in open(sys.argv[1]) if l.startswith("data: ")]
assert events[-1] == "[DONE]"
chunks = [json.loads(e) for e in events[:-1]]
assert not any("error" in c for c in chunks)
usage = [c["usage"] for c in chunks if c.get("usage")]
assert usage and usage[-1]["completion_tokens"] == 700, usage
assert any(ch.get("finish_reason") == "length" for c in chunks for ch in c.get("choices", []))
PY

# Policies that cannot work: a 400 naming the field; past the context without streaming too.
for bad in '{"policy":"lru","budget":64}' '{"policy":"streaming","budget":8,"sinks":4,"window":8}' \
           '{"policy":"h2o","budget":9999}' '"h2o"'; do
  code=$(post /v1/completions '{"model":"stories260K","prompt":"Once","max_tokens":8,"kv_eviction":'"$bad"'}')
  [[ $code == 400 ]] && grep -q '"param":"kv_eviction"' "$work/body" || fail "kv_eviction $bad: status $code $(cat "$work/body")"
done
code=$(post /v1/completions '{"model":"stories260K","prompt":"Once","max_tokens":700}')
[[ $code == 400 ]] && grep -q 'max_tokens' "$work/body" || fail "700 tokens without streaming: status $code $(cat "$work/body")"

# The router polls the scheduler about once a second: the figures arrive.
ok=
for _ in $(seq 1 50); do
  curl -s "$base/metrics" >"$work/metrics"
  evicted=$(sed -n 's/^troupe_kv_evicted_tokens_total //p' "$work/metrics")
  if [[ -n $evicted ]] && (( evicted >= 4 * (200 - 64) + 600 )); then ok=1; break; fi
  sleep 0.2
done
[[ -n $ok ]] || fail "/metrics lacks the evicted tokens: $(grep kv_evict "$work/metrics" || true)"
grep -q '^troupe_kv_eviction_budget_tokens 0$' "$work/metrics" || fail "budgets of requests that ended: $(grep kv_evict "$work/metrics")"
echo "evicted $evicted tokens"
launch down "$work/h2o.toml" >/dev/null

# Settings that cannot work: nothing starts, and troupe-launch says why.
topology bad-policy 'policy = "lru"' 'budget = 64'
topology bad-window 'policy = "streaming"' 'budget = 16' 'sinks = 4' 'window = 16'
topology bad-budget 'policy = "h2o"' 'budget = 600'
topology no-policy 'budget = 64'
extra_tables=('[speculative]' 'method = "early-exit"' 'tree = "2,2"')
topology bad-spec 'policy = "h2o"' 'budget = 64'
for bad in 'bad-policy:policy "lru" is none, streaming, h2o or scissorhands' \
           'bad-window:budget must be at least sinks + window' \
           "bad-budget:budget 600 is past the model's context of 512" \
           'no-policy:KV eviction settings without a policy' \
           'bad-spec:token trees and KV eviction do not run together'; do
  name=${bad%%:*} why=${bad#*:}
  if out=$(launch up "$work/$name.toml" 2>&1); then fail "$name was started"; fi
  grep -qF "$why" <<<"$out" || fail "$name: no reason given: $out"
  [[ ! -f $state/$name.procs ]] || fail "$name: processes were started"
done
echo "PASS"

#!/usr/bin/env bash
# Prefill/decode disaggregation served by real node processes: a prefill replica computes
# each prompt and its first token, sends the prompt's KV over the KV channel to a decode
# replica, which generates the rest from it. Greedy text, whole and streamed, is troupe-run's;
# the decode replica reports the handed-over prompt tokens as loaded (cached), and /metrics
# counts the handoffs; the same with token trees on the decode replica, and for a request
# with KV eviction of its own. Then every lever at once (PP=2 prefill and decode replicas,
# a draft model, H2O eviction, a host tier), through PP=2 replicas on three processes
# (troupe-launch), and with a decode replica's node killed mid-stream: its requests go on
# on the other decode replica, each token delivered once. Bounded in time; every process
# is stopped.
# Usage: disagg_serve_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
launch_scratch

run() { "$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -t 0 -q --ignore-eos "$@"; }
# post OUT BODY: prints the status; curl's exit status goes to OUT.curl (28: it timed out).
post() {
  local rc=0
  curl -s -m 20 -o "$1" -w '%{http_code}' -H 'Content-Type: application/json' "$base/v1/completions" --data-binary "$2" || rc=$?
  echo "$rc" >"$1.curl"
}
# complete OUT PROMPT TOKENS [STREAM]: a greedy completion; its text in OUT.text, cached
# prompt tokens in OUT.cached.
complete() {
  local code stream=${4:-false}
  code=$(post "$1" '{"model":"stories260K","prompt":"'"$2"'","max_tokens":'"$3"',"temperature":0,"ignore_eos":true,"stream":'"$stream"'}')
  [[ $code == 200 ]] || { echo "status $code: $(head -c 300 "$1")"; return 1; }
  python3 - "$1" "$stream" <<'PY'
import json, sys
path, stream = sys.argv[1], sys.argv[2] == "true"
text, cached = "", 0
if stream:
    for line in open(path):
        if line.startswith("data: {"):
            d = json.loads(line[6:])
            text += "".join(c.get("text", "") for c in d.get("choices", []))
else:
    d = json.load(open(path))
    text = d["choices"][0]["text"]
    cached = d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
open(path + ".text", "w").write(text)
open(path + ".cached", "w").write(str(cached))
PY
}
metric() { curl -s "$base/metrics" | sed -n "s/^$1 //p" | head -1; }
metric_n() { local v; v=$(metric "$1"); echo "${v%.*}"; }
# all_ready N WHAT: waits (20 s at most) until N replicas are ready, or fails: a prefill
# replica not ready yet would leave the decode replicas to compute prompts themselves.
all_ready() {
  for _ in $(seq 1 200); do [[ $(metric_n troupe_replicas_ready) == "$1" ]] && return; sleep 0.1; done
  fail "$2: the $1 replicas were not all ready within 20 s"
}

story="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball and wanted to play with it. Her mom said"

# check WHAT: the story whole and streamed, as troupe-run says it.
check() {
  complete "$work/a" "$story" 60 || fail "$1: $(cat "$work/a")"
  served_as_run "$1" "$work/a" 60 "$story"
  cached=$(cat "$work/a.cached")
  [[ $cached -ge 32 ]] || fail "$1: the decode replica reports $cached prompt tokens loaded, not computed (want 32 or more)"
  complete "$work/s" "$story" 60 true || fail "$1 streamed: $(cat "$work/s")"
  [[ $(cat "$work/s.text") == $(cat "$work/a.text") ]] || fail "$1: the stream's text differs: '$(cat "$work/s.text")'"
  echo "ok: $1: troupe-run's text, whole and streamed; $cached prompt tokens came from the prefill replica"
}

# cluster FILE NODES KV_PORTS: a stories260K topology at FILE with nodes n0.. (the gateway
# on n0), every one on its own free port, and KV_PORTS more free ports in $kv for the
# replicas, which the caller appends.
cluster() {
  local ports i
  read -ra ports <<<"$(free_ports $(($2 + 1 + $3)))"
  {
    printf '[model]\npath = "%s"\ntokenizer = "%s"\n' "$models/stories260K.bin" "$models/tok512.bin"
    printf '[gateway]\nnode = "n0"\ncapnp = "127.0.0.1:%s"\n' "${ports[0]}"
    for ((i = 0; i < $2; i++)); do printf '[[node]]\nname = "n%d"\nhost = "127.0.0.1"\nport = %s\n' "$i" "${ports[i + 1]}"; done
  } >"$1"
  kv=("${ports[@]:$(($2 + 1))}")
}

# one_process FILE: a prefill replica and a decode replica in one process (cluster).
one_process() {
  cluster "$1" 1 1
  cat >>"$1" <<TOML
[[replica]]
name   = "p0"
role   = "prefill"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
[[replica]]
name   = "d0"
role   = "decode"
stages = [ { node = "n0", layers = "all", devices = ["cpu"], kv_port = ${kv[0]} } ]
TOML
}

# One process: a prefill replica and a decode replica.
one_process "$work/one.toml"
start_node "$work/one.toml" "$work"
base=$http_url
all_ready 2 "one process"
check "one process"
handed=$(metric troupe_requests_handed_off_total)
[[ ${handed%.*} -ge 2 ]] || fail "troupe_requests_handed_off_total is '$handed' after two requests"
[[ $(metric 'troupe_replica_role{replica="p0",role="prefill"}') == 1 ]] || fail "/metrics does not give p0's role"
# A request with KV eviction of its own is handed over like any: the prefill replica
# evicts within its budget while it computes the prompt, the decode replica computes what
# it was not sent under the same policy, and the text is troupe-run's with that budget.
code=$(post "$work/ev" '{"model":"stories260K","prompt":"'"$story"'","max_tokens":60,"temperature":0,"ignore_eos":true,"kv_eviction":{"policy":"streaming","budget":40}}')
[[ $code == 200 ]] || fail "a request with its own KV eviction: status $code: $(head -c 300 "$work/ev")"
served_as_run "its own KV eviction" "$work/ev" 60 "$story" --kv-policy streaming --kv-budget 40
(( $(metric_n troupe_requests_handed_off_total) > ${handed%.*} )) || fail "a request with its own KV eviction was not handed over"
echo "ok: a request with its own KV eviction was handed over, with troupe-run's text under that budget"
stop_tree "$node_pid"
node_pid=

# The same with token trees: the decode replica verifies trees (the target drafting for
# itself, so every kept path moves in the KV) over the prompt KV the prefill replica sent.
one_process "$work/tree.toml"
cat >>"$work/tree.toml" <<TOML
[speculative]
method = "draft"
draft = "$models/stories260K.bin"
tree = "2,2,2"
max_step_tokens = 16
TOML
start_node "$work/tree.toml" "$work"
base=$http_url
all_ready 2 "token trees"
check "token trees"
[[ $(metric_n troupe_requests_handed_off_total) -ge 2 ]] || fail "token trees: requests were not handed over"
# (The router polls the schedulers' figures about once a second.)
for _ in $(seq 1 50); do
  kept=$(metric_n 'troupe_speculative_depth_accepted_total{method="draft",depth="3"}')
  [[ ${kept:-0} -gt 0 ]] && break
  sleep 0.2
done
[[ ${kept:-0} -gt 0 ]] || fail "token trees: no tree kept a path three deep (${kept:-none})"
stop_tree "$node_pid"
node_pid=

# Every lever at once: prefill and decode replicas PP=2 across two processes, a draft
# model, H2O eviction within 48 tokens (the story's prompt is longer: the prefill replica
# compacts while it computes it) and a host tier. Greedy text is troupe-run's with the same
# eviction and nothing else, on the first request and on one whose prompt the decode
# replica's tier holds.
cluster "$work/all.toml" 2 4
cat >>"$work/all.toml" <<TOML
[kv]
policy = "h2o"
budget = 48
[[tier]]
kind = "host"
[speculative]
method = "draft"
draft = "$models/stories260K.bin"
[[replica]]
name   = "p0"
role   = "prefill"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "3-4", devices = ["cpu"] } ]
[[replica]]
name   = "d0"
role   = "decode"
stages = [ { node = "n1", layers = "0-2", devices = ["cpu"], kv_port = ${kv[0]} },
           { node = "n0", layers = "3-4", devices = ["cpu"], kv_port = ${kv[1]} } ]
TOML
launch_http "$work/all.toml"
for i in 1 2; do
  complete "$work/all$i" "$story" 120 || fail "every lever, request $i: $(cat "$work/all$i")"
  served_as_run "every lever, request $i" "$work/all$i" 120 "$story" --kv-policy h2o --kv-budget 48
  # (Of the prompt's first chunk, the 48 tokens the prefill replica sent, what a prefix hit
  # would give: all but the 32 whose attention H2O reads, in whole blocks.)
  [[ $(cat "$work/all$i.cached") -ge 16 ]] || fail "every lever, request $i: $(cat "$work/all$i.cached") prompt tokens loaded"
done
for _ in $(seq 1 50); do
  accepted=$(metric_n 'troupe_speculative_accepted_tokens_total{method="draft"}')
  [[ ${accepted:-0} -gt 0 ]] && break
  sleep 0.2
done
[[ ${accepted:-0} -gt 0 ]] || fail "every lever: no draft was kept ($(curl -s "$base/metrics" | grep speculative_accepted))"
(( $(metric_n troupe_kv_evicted_tokens_total) > 0 )) || fail "every lever: nothing was evicted"
(( $(metric_n troupe_requests_handed_off_total) >= 2 )) || fail "every lever: the requests were not handed over"
echo "ok: PP=2 prefill and decode replicas, a draft model, H2O within 48 tokens and a host tier: troupe-run's text"
launch down "$work/all.toml" >/dev/null 2>&1 || true

# Three processes: the prefill replica PP=2 across n0 and n1, decode replica d0 PP=2 the
# other way round, d1 whole on n2 (its scheduler there, so killing n2 loses it).
cluster "$work/pp2.toml" 3 4
cat >>"$work/pp2.toml" <<TOML
[[replica]]
name   = "p0"
role   = "prefill"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "3-4", devices = ["cpu"] } ]
[[replica]]
name   = "d0"
role   = "decode"
stages = [ { node = "n1", layers = "0-2", devices = ["cpu"], kv_port = ${kv[0]} },
           { node = "n0", layers = "3-4", devices = ["cpu"], kv_port = ${kv[1]} } ]
[[replica]]
name   = "d1"
role   = "decode"
stages = [ { node = "n2", layers = "0-2", devices = ["cpu"], kv_port = ${kv[2]} },
           { node = "n2", layers = "3-4", devices = ["cpu"], kv_port = ${kv[3]} } ]
TOML
launch_http "$work/pp2.toml"
# troupe-launch up returns once every replica is ready, the prefill replica too.
ready=$(metric_n troupe_replicas_ready)
[[ $ready == 3 ]] || fail "troupe-launch up returned with $ready of 3 replicas ready"
check "PP=2 across three processes"
# troupe-run's continuation of the story over the 400 tokens the streams below ask for.
want=$(run -p "$story" -n $((served_prompt_tokens - 1 + 400)))
want=${want#"$story"}

# Node n2 (decode replica d1, whole) killed while streams run there and on d0: every stream
# ends with troupe-run's text, each token once. A stream of 400 tokens on d1 alone lasts a
# few tens of milliseconds, too short to catch by polling /metrics (which asks every
# replica), so n2 is killed as soon as a stream of the batch has its first chunk: the
# prompts are computed together and handed over, and d1's streams are under way. If none
# was on d1 then, the next batch tries.
moved=0
for batch in 1 2 3 4 5; do
  all_ready 3 "batch $batch"
  n2=$(launch status "$work/pp2.toml" 2>/dev/null | sed -n 's/^node n2 pid \([0-9]*\).*/\1/p' | head -1)
  [[ -n $n2 ]] || fail "cannot find node n2's process: $(launch status "$work/pp2.toml" 2>&1)"
  before=$(metric_n troupe_requests_resubmitted_total)
  pids=()
  for i in 1 2 3 4; do
    complete "$work/k$batch.$i" "$story" 400 true >/dev/null 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1 5000); do
    [[ -s $work/k$batch.1 || -s $work/k$batch.2 || -s $work/k$batch.3 || -s $work/k$batch.4 ]] && break
    sleep 0.001
  done
  kill -9 "$n2"
  for p in "${pids[@]}"; do wait "$p" || true; done
  for i in 1 2 3 4; do
    got=$(cat "$work/k$batch.$i.text" 2>/dev/null || true)
    [[ $got == "$want" ]] ||
      fail "batch $batch, stream $i: '$got' (curl exit $(cat "$work/k$batch.$i.curl" 2>/dev/null); the stream's end: \
$(tail -c 300 "$work/k$batch.$i" 2>/dev/null); the nodes said: $(grep -h -v 'info request' "$state"/n*.log | grep 'troupe' | tail -12))"
    grep -q '"finish_reason":"length"' "$work/k$batch.$i" || fail "batch $batch, stream $i did not run to its end: $(tail -c 300 "$work/k$batch.$i")"
  done
  moved=$(( $(metric_n troupe_requests_resubmitted_total) - before ))
  ((moved >= 1)) && break
done
((moved >= 1)) || fail "in five batches, d1 never held a stream when its node was killed"
echo "ok: decode replica d1's node killed mid-stream (batch $batch): every stream ended with troupe-run's text ($moved moved to d0)"
launch down "$work/pp2.toml" >/dev/null 2>&1 || true
echo "PASS"

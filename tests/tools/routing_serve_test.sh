#!/usr/bin/env bash
# Routing between two replicas in one troupe-node, kv-aware against least-loaded: with
# replica r0 busy with a long stream and a prompt cached only there, kv-aware routing sends
# that prompt back to r0 (its usage reports the cached tokens, its text is the same), while
# least-loaded sends it to the idle r1, which computes it all. /metrics names the policy and
# counts the requests routed by prefix; the node's log line for each request says where it
# went. Bounded in time; every process is stopped.
# Usage: routing_serve_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
scratch

topology() {  # FILE POLICY
  cat >"$1" <<TOML
[model]
path      = "$models/stories260K.bin"
tokenizer = "$models/tok512.bin"
[gateway]
node  = "n0"
capnp = "127.0.0.1:$(free_port)"
[router]
policy = "$2"
[[node]]
name = "n0"
host = "127.0.0.1"
port = $(free_port)
[[replica]]
name   = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
[[replica]]
name   = "r1"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
TOML
}
post() { curl -s -m 60 -o "$1" -w '%{http_code}' -H 'Content-Type: application/json' "$http_url/v1/completions" --data-binary "$2"; }
# complete OUT PROMPT: a greedy completion of 24 tokens; its text in OUT.text, cached tokens in OUT.cached.
complete() {
  local code
  code=$(post "$1" '{"model":"stories260K","prompt":"'"$2"'","max_tokens":24,"temperature":0,"ignore_eos":true}')
  [[ $code == 200 ]] || fail "status $code: $(head -c 300 "$1")"
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
open(sys.argv[1] + ".text", "w").write(d["choices"][0]["text"])
open(sys.argv[1] + ".cached", "w").write(str(d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)))
PY
}
metric() { curl -s "$http_url/metrics" | sed -n "s/^$1 //p" | head -1; }
# replica_of BODY: the replica that served the completion in BODY, from the node's log
# line for its request (written when it ends; waited for, 10 s at most).
replica_of() {
  local id r
  id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"].split("-")[-1])' "$1")
  for _ in $(seq 1 100); do
    r=$(sed -n "s/.* request id=$id outcome=[a-z]* replica=\([^ ]*\) .*/\1/p" "$work/node.err" | head -1)
    [[ -n $r ]] && break
    sleep 0.1
  done
  echo "${r:-none}"
}

story="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball and wanted to play with it. Her mom said she could play with the ball if she shared it with her friends, and Lily was very happy to share."
# Each policy: the story once (to r0: both idle), then a long stream held on r0, then the story again.
for policy in kv-aware least-loaded; do
  topology "$work/$policy.toml" "$policy"
  start_node "$work/$policy.toml" "$work"
  complete "$work/first" "$story"
  [[ $(cat "$work/first.cached") == 0 ]] || fail "$policy: the first request found $(cat "$work/first.cached") cached tokens"
  [[ $(replica_of "$work/first") == r0 ]] || fail "$policy: the first request (both idle) went to $(replica_of "$work/first"), not r0"
  # The stream: a different prompt, generating for seconds (streaming eviction runs past
  # the context), so r0 stays busy with it; cancelled by closing it.
  : >"$work/stream"  # not only by the background job's redirection: the wait below reads it
  curl -s -N -m 60 -H 'Content-Type: application/json' "$http_url/v1/completions" \
    --data-binary '{"model":"stories260K","prompt":"Tom had a dog.","max_tokens":200000,"ignore_eos":true,"stream":true,"kv_eviction":{"policy":"streaming","budget":128}}' \
    >"$work/stream" &
  streamer=$!
  others+=("$streamer")
  for _ in $(seq 1 100); do grep -q '"text"' "$work/stream" 2>/dev/null && break; sleep 0.05; done
  grep -q '"text"' "$work/stream" || fail "$policy: the long stream did not start"
  for _ in $(seq 1 50); do [[ $(metric 'troupe_replica_requests{replica="r0"}') == 1 ]] && break; sleep 0.1; done
  [[ $(metric 'troupe_replica_requests{replica="r0"}') == 1 ]] || fail "$policy: the long stream is not on r0"
  if [[ $policy == kv-aware ]]; then
    # The router's summary of r0 holds the story's blocks (polled every 500 ms).
    for _ in $(seq 1 50); do
      blocks=$(metric 'troupe_router_summary_blocks{replica="r0"}')
      [[ ${blocks%.*} -ge 4 ]] && break
      sleep 0.1
    done
    [[ ${blocks%.*} -ge 4 ]] || fail "$policy: the router's summary of r0 holds $blocks blocks, not the story's"
  fi
  complete "$work/again" "$story"
  cached=$(cat "$work/again.cached")
  [[ $(cat "$work/again.text") == $(cat "$work/first.text") ]] || fail "$policy: the story's text changed"
  went=$(replica_of "$work/again")
  if [[ $policy == kv-aware ]]; then
    [[ $went == r0 ]] || fail "kv-aware: the story again went to $went, not back to r0"
    [[ $cached -ge 64 ]] || fail "kv-aware: the story again found $cached cached tokens (it should go back to r0)"
    [[ $(metric 'troupe_router_policy{policy="kv-aware"}') == 1 ]] || fail "kv-aware: /metrics does not name the policy"
    routed=$(metric troupe_router_prefix_routed_total)
    [[ ${routed%.*} -ge 1 ]] || fail "kv-aware: troupe_router_prefix_routed_total is '$routed'"
  else
    [[ $went == r1 ]] || fail "least-loaded: the story again went to $went, not the idle r1"
    [[ $cached == 0 ]] || fail "least-loaded: the story again found $cached cached tokens (it should go to the idle r1)"
    [[ $(metric 'troupe_router_policy{policy="least-loaded"}') == 1 ]] || fail "least-loaded: /metrics does not name the policy"
  fi
  grep -q '"finish_reason":"length"' "$work/stream" && fail "$policy: the long stream ended before the story came back"
  kill "$streamer" 2>/dev/null || true
  wait "$streamer" 2>/dev/null || true
  stop_tree "$node_pid"
  node_pid=
  echo "ok: $policy: the story again found $cached cached tokens"
done
echo "PASS"

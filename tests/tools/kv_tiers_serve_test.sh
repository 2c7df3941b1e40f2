#!/usr/bin/env bash
# KV tiers served by a PP=2 cluster (two troupe-node processes, troupe-launch) with a host
# tier and a Redis tier (a redis-server this test starts): a prompt the pool lost comes back
# from the tiers with troupe-run's greedy text; a restarted cluster finds its prefixes in
# Redis (its first request reports cached tokens); blocks flipped in Redis are computed
# again; Redis killed while requests run and started again loses none of them, and
# /metrics counts its errors; token trees' moved blocks reach the host tier as they end up.
# Bounded in time; every process is stopped.
# Usage: kv_tiers_serve_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
launch_scratch
command -v redis-server >/dev/null || fail "redis-server is not installed (tools/install-packages.sh installs it)"

redis_port=$(free_port)
redis_pid=
start_redis() {
  timeout 120 redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
  redis_pid=$!
  others+=("$redis_pid")
  for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done
  fail "redis-server did not start: $(tail -3 "$work/redis.log")"
}
start_redis

# A pool of 24 blocks (384 slots): three other long requests push a prompt out of it.
pp2_topology "$work/t.toml" "[kv]" "num_blocks = 24" "" "[[tier]]" 'kind = "host"' "" "[[tier]]" 'kind = "redis"' \
  "address = \"127.0.0.1:$redis_port\""
up() {
  launch_http "$work/t.toml"
}
post() { curl -s -o "$1" -w '%{http_code}' -H 'Content-Type: application/json' "$base/v1/completions" --data-binary "$2"; }
# complete OUT PROMPT TOKENS: a greedy completion; its text in OUT.text, cached tokens in OUT.cached.
complete() {
  local code
  code=$(post "$1" '{"model":"stories260K","prompt":"'"$2"'","max_tokens":'"$3"',"temperature":0,"ignore_eos":true}')
  [[ $code == 200 ]] || { echo "status $code: $(head -c 300 "$1")"; return 1; }
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
open(sys.argv[1] + ".text", "w").write(d["choices"][0]["text"])
open(sys.argv[1] + ".cached", "w").write(str(d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)))
PY
}
metric() { curl -s "$base/metrics" | sed -n "s/^$1 //p" | head -1; }

story="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball and wanted to play with it. Her mom said"
churn() {
  for i in 1 2 3; do
    complete "$work/churn" "Tom and Sam went to the zoo number $i and saw a lion, a tiger and a bear, and they were all very happy that day" 150 ||
      fail "churn: $(cat "$work/churn")"
  done
}
check_story() {  # check_story WHAT MIN_CACHED
  complete "$work/a" "$story" 40 || fail "$1: $(cat "$work/a")"
  served_as_run "$1" "$work/a" 40 "$story"
  local cached
  cached=$(cat "$work/a.cached")
  (( cached >= $2 )) || fail "$1: $cached cached tokens, expected at least $2"
}

up
check_story "first" 0
churn
check_story "after the pool lost it" 16
echo "pool lost the prompt: $(cat "$work/a.cached") tokens back from the tiers"

# A restart: empty pools and host tiers; Redis still holds the blocks.
launch down "$work/t.toml" >/dev/null
up
check_story "restarted" 16
echo "restarted: $(cat "$work/a.cached") tokens back from Redis"

# Every record in Redis with a byte flipped: detected, computed again, same text.
launch down "$work/t.toml" >/dev/null
keys=0
while read -r k; do
  [[ -n $k ]] || continue
  redis-cli -p "$redis_port" SETRANGE "$k" 60 "~" >/dev/null
  keys=$((keys + 1))
done < <(redis-cli -p "$redis_port" --scan)
(( keys > 0 )) || fail "nothing stored in Redis"
up
check_story "flipped in Redis" 0
ok=
for _ in $(seq 1 30); do
  failed=$(metric troupe_kv_tier_failed_loads_total)
  corrupt=$(curl -s "$base/metrics" | sed -n 's/^troupe_kv_tier_corrupt_total{node="n[01]",tier="redis"} //p' | awk '{s += $1} END {print s + 0}')
  if [[ ${failed:-0} -ge 1 && ${corrupt:-0} -ge 1 ]]; then ok=1; break; fi
  sleep 0.2
done
[[ -n $ok ]] || fail "flipped records were not counted: failed loads ${failed:-none}, corrupt ${corrupt:-none}"

# Redis killed while requests run, then started again (empty): every request completes with
# troupe-run's text, and the errors are counted.
pids=()
for i in 1 2 3 4 5 6; do
  ( complete "$work/k$i" "$story" 40 ) &
  pids+=($!)
  if (( i == 2 )); then stop_tree "$redis_pid"; fi
done
for p in "${pids[@]}"; do wait "$p" || fail "a request failed while Redis was away"; done
start_redis
for i in 1 2 3 4 5 6; do
  served_as_run "request $i while Redis was away" "$work/k$i" 40 "$story"
done
churn
check_story "Redis back" 0
errors=
for _ in $(seq 1 30); do
  errors=$(curl -s "$base/metrics" | sed -n 's/^troupe_kv_tier_errors_total{node="n[01]",tier="redis"} //p' | awk '{s += $1} END {print s + 0}')
  [[ ${errors:-0} -ge 1 ]] && break
  sleep 0.2
done
[[ ${errors:-0} -ge 1 ]] || fail "Redis away: no errors counted"
echo "Redis away: $errors errors counted, every request served"
launch down "$work/t.toml" >/dev/null

# Token trees with a host tier: the target drafts for itself through its draft actor, so
# every tree keeps a path that moves in the KV (with the request's next step). The blocks
# its output filled are saved after their move: a prompt of the story's ids and 64 of the
# generated ones loads them from the tier (the pool lost them) and continues with the text
# that followed them.
pp2_topology "$work/tree.toml" "[kv]" "num_blocks = 24" "" "[[tier]]" 'kind = "host"' "" "[speculative]" \
  'method = "draft"' "draft = \"$models/stories260K.bin\"" 'tree = "2,2,2"' 'max_step_tokens = 16'
launch_http "$work/tree.toml" tree
complete "$work/t1" "$story" 100 || fail "tree: $(cat "$work/t1")"
served_as_run "tree" "$work/t1" 100 "$story"
churn
ids=$("$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -p "$story" -t 0 -q --ignore-eos \
  -n $((served_prompt_tokens - 1 + 64)) --ids)
code=$(post "$work/t2" '{"model":"stories260K","prompt":[1,'"$(tr -s ' ' ',' <<<"${ids% }")"'],"max_tokens":24,"temperature":0,"ignore_eos":true}')
[[ $code == 200 ]] || fail "tree: the prompt of ids: status $code $(head -c 300 "$work/t2")"
python3 - "$work/t1" "$work/t2" "$served_prompt_tokens" <<'PY' || fail "tree: the prompt over the tree's blocks: $(head -c 400 "$work/t2")"
import json, sys
whole = json.load(open(sys.argv[1]))["choices"][0]["text"]
d = json.load(open(sys.argv[2]))
text, cached = d["choices"][0]["text"], d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
# Blocks of 16: those past the story's own hold generated tokens, moved by the trees.
assert cached >= (int(sys.argv[3]) + 64) // 16 * 16 - 16 and cached > int(sys.argv[3]), "%d tokens cached" % cached
assert len(text) > 20 and text in whole and whole.find(text) > 0, "%r is not a part of %r" % (text, whole)
PY
# (The router polls the schedulers' figures about once a second.)
for _ in $(seq 1 50); do
  kept=$(curl -s "$base/metrics" | sed -n 's/^troupe_speculative_depth_accepted_total{method="draft",depth="3"} //p')
  [[ ${kept%.*} -gt 0 ]] 2>/dev/null && break
  sleep 0.2
done
[[ ${kept%.*} -gt 0 ]] 2>/dev/null || fail "tree: no tree kept a path three deep (${kept:-none})"
echo "trees with a host tier: depth 3 kept $kept times; $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["cached_tokens"])' "$work/t2") tokens of the prompt over the trees' blocks loaded"
echo PASS

#!/usr/bin/env bash
# No single point of failure: deploy/two-gateways.toml (two gateway nodes, each with its
# router and both APIs, before two PP=2 replicas) on real processes on 127.0.0.1. Rounds of
# 192 greedy requests, 64 at a time, through troupe-bench naming both gateways, one gateway
# SIGKILLed in each round (g1, g2, in turn, once the bench's clients of it are connected,
# and each round must have moved requests to the other gateway): every request ends
# exactly once, every stream numbered without gap or repeat, with the failure-free
# output, byte for byte. A client of a killed gateway alone is told the connection was
# lost, in words (never KJ's "PromiseFulfiller was destroyed"), and an HTTP stream gets a
# connection error, never an internal message. troupe-launch restarts killed gateways.
# Bounded in time; every process is stopped at the end.
# Usage: gateway_failover_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
state=$(mktemp -d)
topology_copy "$src/deploy/two-gateways.toml" "$state/t.toml"
topo=$state/t.toml
# The replicas' schedulers are held (SIGSTOP) for a moment below, so that requests wait
# when a gateway goes: a heartbeat timeout long enough that their nodes are not lost.
sed -i 's/^timeout_ms *= *[0-9]*/timeout_ms = 10000/' "$topo"
launch() { timeout 120 "$build/tools/troupe-launch" "$@" --state-dir "$state"; }
cleanup() {
  [[ -f $state/t.supervisor ]] && kill -9 "$(cat "$state/t.supervisor")" 2>/dev/null || true
  if [[ -f $state/t.procs ]]; then
    while read -r _ pid; do kill -9 "$pid" 2>/dev/null || true; done <"$state/t.procs"
  fi
  rm -rf "$state"
}
trap cleanup EXIT

launch up "$topo" >"$state/up.out"
launched_over_tls "$topo" "$state"
for ep in capnp://127.0.0.1:7430 capnp://127.0.0.1:7432 http://127.0.0.1:7431 http://127.0.0.1:7433; do
  grep -qx "endpoint: $ep" "$state/up.out" || fail "up did not print $ep: $(cat "$state/up.out")"
done
both=capnp://127.0.0.1:7430,127.0.0.1:7432
bench() {
  # 192 requests, 64 at a time: three waves, two seconds or so, every moment of it with requests
  # under way at both gateways.
  timeout 120 "$build/tools/troupe-bench" --endpoint "$both" --requests 192 --concurrency 64 --prompt-words 12 \
    --output-tokens 200 --outputs "$1" --json "$1.json" >/dev/null 2>"$1.err"
}
ready() { [[ $(timeout 10 "$build/tools/troupe-client" --connect "$1" --health 2>/dev/null || true) == ready ]]; }
pid_of() { awk -v n="$1" '$1 == n {print $2}' "$state/t.procs"; }
# in_flight HTTP_PORT: the completions a gateway has admitted (both APIs) that have not
# ended (from its /metrics: troupe_requests_in_flight, summed).
in_flight() { curl -s -m 5 "http://127.0.0.1:$1/metrics" | awk '/^troupe_requests_in_flight\{/ {s += $2} END {print s + 0}'; }
# connections_to PORT: connections established to the local server on PORT.
connections_to() { awk -v p="$(printf ':%04X' "$1")" 'substr($2, length($2) - 4) == p && $4 == "01"' /proc/net/tcp | wc -l; }
for ep in 127.0.0.1:7430 127.0.0.1:7432; do
  for _ in $(seq 1 100); do ready "$ep" && break; sleep 0.1; done
  ready "$ep" || fail "gateway $ep never became ready"
done

bench "$state/clean.jsonl"
[[ $(grep -c '"ok":true' "$state/clean.jsonl") == 192 ]] || fail "the failure-free run: $(grep -v '"ok":true' "$state/clean.jsonl" | head -2)"

# A client of one gateway alone, and an HTTP stream from it, when that gateway is lost
# while their requests wait (the replicas' schedulers stopped for a moment, so that they
# surely wait): the client is told in words, the HTTP client gets a connection error.
kill -STOP "$(pid_of a0)" "$(pid_of b0)"
timeout 30 "$build/tools/troupe-client" --connect 127.0.0.1:7430 -p "Once upon a time" -n 64 -t 0 >"$state/lone.out" 2>"$state/lone.err" &
lone=$!
curl -sN -o "$state/http.out" -w '%{http_code}' http://127.0.0.1:7431/v1/completions \
  -d '{"model":"stories260K","prompt":"Once","max_tokens":64,"stream":true}' >"$state/http.code" 2>&1 &
streamer=$!
# Both connected (a client can take a while to start beside other work), and both requests
# with g1's router (sent to the stopped replicas), before g1 goes.
for _ in $(seq 1 100); do
  (($(connections_to 7430) > 0 && $(connections_to 7431) > 0)) && (($(in_flight 7431) >= 2)) && break
  sleep 0.1
done
(($(in_flight 7431) >= 2)) || fail "the lone client's and the stream's requests did not reach g1: $(in_flight 7431) in flight"
pid=$(pid_of g1)
kill -9 "$pid"
rc=0
wait "$lone" || rc=$?
http_rc=0
wait "$streamer" || http_rc=$?
kill -CONT "$(pid_of a0)" "$(pid_of b0)"
((rc != 0)) || fail "the lone client of the killed gateway succeeded: $(cat "$state/lone.out")"
grep -q "PromiseFulfiller" "$state/lone.err" && fail "the lone client saw KJ's words: $(cat "$state/lone.err")"
grep -q "the gateway closed the connection before the request ended" "$state/lone.err" ||
  fail "the lone client was not told the connection was lost: $(cat "$state/lone.err")"
((http_rc == 52 || http_rc == 56)) || fail "the HTTP stream: curl exit $http_rc, wanted a connection error (52 or 56)"
[[ ! -s $state/http.out ]] || fail "the HTTP stream was sent: $(head -c 200 "$state/http.out")"
for _ in $(seq 1 200); do [[ $(pid_of g1) != "$pid" ]] && ready 127.0.0.1:7430 && break; sleep 0.1; done
ready 127.0.0.1:7430 || fail "g1 was not restarted"

failovers=0
for round in 1 2 3 4; do
  victim=g$(((round - 1) % 2 + 1))
  if [[ $victim == g1 ]]; then port=7430; else port=7432; fi
  ep=127.0.0.1:$port
  rm -f "$state/round.jsonl"
  # Killed while the bench's requests through it are under way, never after the round has
  # ended: the replicas' schedulers are held so that the requests wait, until most of the
  # 32 of the first 64 that start there (request i at gateway i mod 2) are connected.
  kill -STOP "$(pid_of a0)" "$(pid_of b0)"
  bench "$state/round.jsonl" &
  bench_pid=$!
  for _ in $(seq 1 1000); do (($(connections_to "$port") >= 24)) && break; sleep 0.01; done
  killed_at=$(connections_to "$port")
  pid=$(pid_of "$victim")
  kill -9 "$pid"
  kill -CONT "$(pid_of a0)" "$(pid_of b0)"
  ((killed_at >= 24)) || fail "round $round: only $killed_at clients of $victim connected (the bench: $(tail -3 "$state/round.jsonl.err"))"
  wait "$bench_pid" || true
  if ! cmp -s "$state/round.jsonl" "$state/clean.jsonl"; then
    diff <(cut -c1-120 "$state/clean.jsonl") <(cut -c1-120 "$state/round.jsonl") | head -6 || true
    fail "round $round ($victim killed) differs from the failure-free run: $(head -3 "$state/round.jsonl.err")"
  fi
  moved=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed_over"])' "$state/round.jsonl.json")
  ((moved > 0)) || fail "round $round: no request was in flight at $victim when it was killed ($killed_at connections then; the bench: $(head -c 600 "$state/round.jsonl.json"))"
  failovers=$((failovers + moved))
  # Restarted by the supervisor, and serving again, before the next round.
  for _ in $(seq 1 200); do [[ $(pid_of "$victim") != "$pid" ]] && ready "$ep" && break; sleep 0.1; done
  ready "$ep" || fail "round $round: $victim was not restarted"
  echo "round $round: $victim killed under load; 192 of 192 requests as before, $moved finished by the other gateway"
done
((failovers > 0)) || fail "no request was ever in flight at a killed gateway: nothing failed over"
launch down "$topo" >/dev/null
echo "gateway failover: 4 gateways killed under load, every request exactly once and unchanged"

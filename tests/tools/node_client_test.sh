#!/usr/bin/env bash
# A real troupe-node on 127.0.0.1 serving a topology, and troupe-client against it:
# greedy output equal to troupe-run's, 16 concurrent streams, health, junk bytes on the
# ports and on step links (refused with a log line), step links within a node's
# link_ports, and a clean stop on SIGTERM. Bounded in time; the node is
# always killed.
# Usage: node_client_test.sh BUILD_DIR TOPOLOGY MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 models=$3
scratch
topology=$work/$(basename "$2")
topology_copy "$2" "$topology"

# Every node but the gateway's first, then the gateway's node.
gateway=$(sed -n '/^\[gateway\]/,/^\[/ s/^node *= *"\(.*\)"/\1/p' "$topology")
for n in $(sed -n '/^\[\[node\]\]/,/^$/ s/^name *= *"\(.*\)"/\1/p' "$topology"); do
  [[ $n == "$gateway" ]] && continue
  timeout 120 "$build/tools/troupe-node" "$topology" --node "$n" >"$work/$n.out" 2>"$work/$n.err" &
  others+=($!)
done
timeout 120 "$build/tools/troupe-node" "$topology" --node "$gateway" --capnp 127.0.0.1:0 >"$work/node.out" 2>"$work/node.err" &
node_pid=$!
for _ in $(seq 1 300); do
  grep -q '^endpoint: capnp://' "$work/node.out" 2>/dev/null && break
  kill -0 "$node_pid" 2>/dev/null || { cat "$work/node.err"; echo "node exited early"; exit 1; }
  sleep 0.1
done
ep=$(sed -n 's|^endpoint: capnp://||p' "$work/node.out")
[[ -n $ep ]] || { cat "$work/node.err"; echo "no endpoint line"; exit 1; }

run() { "$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -q -t 0 "$@"; }
client() { timeout 60 "$build/tools/troupe-client" --connect "$ep" -t 0 "$@"; }

# The endpoint is up once a replica is ready; every replica, soon after.
for _ in $(seq 1 100); do [[ $(client --health || true) == ready ]] && break; sleep 0.1; done
[[ $(client --health) == ready ]] || { echo "health is not ready"; exit 1; }
tls_logged "$work"/*.err

prompts=("" "Once upon a time" "The cat" "Lily and Tom went to the" "One day" "He was" "She saw a big" "The sun was"
         "Tim had a red" "In the park" "A little bird" "Mom said" "They played" "The dog ran" "There was a"
         "Ben wanted to" "It was a sunny day")
clients=()
for i in "${!prompts[@]}"; do
  client -p "${prompts[$i]}" -n 80 >"$work/client.$i" 2>"$work/client.$i.err" &
  clients+=($!)
  run -p "${prompts[$i]}" -n 80 >"$work/run.$i"
done
for i in "${!clients[@]}"; do
  wait "${clients[$i]}" && rc=0 || rc=$?
  [[ $rc == 0 ]] || { echo "the client of prompt '${prompts[$i]}' exited with $rc:"; cat "$work/client.$i.err"; exit 1; }
done
for i in "${!prompts[@]}"; do
  cmp -s "$work/client.$i" "$work/run.$i" || { echo "prompt '${prompts[$i]}' differs:"; cat "$work/client.$i" "$work/run.$i"; exit 1; }
done

# Junk on the RPC port: the node drops that connection and keeps serving.
head -c 4096 /dev/urandom >"$work/junk"
printf '\xff\xff\xff\xff\x00\x00\x00\x00' | cat - "$work/junk" >"$work/junk2"
timeout 5 bash -c "cat '$work/junk2' >/dev/tcp/${ep%:*}/${ep##*:}" 2>/dev/null || true
# And on every other node's middleman port (CAF's BASP): the stages keep serving.
for n in $(sed -n '/^\[\[node\]\]/,/^$/ s/^name *= *"\(.*\)"/\1/p' "$topology"); do
  [[ $n == "$gateway" ]] && continue
  port=$(sed -n "/^name *= *\"$n\"/,/^\$/ s/^port *= *\([0-9]*\)/\1/p" "$topology")
  timeout 5 bash -c "cat '$work/junk2' >/dev/tcp/127.0.0.1/$port" 2>/dev/null || true
done
# And on the step links of stages in other processes (actors/step_link.hpp).
# Every lone CPU shard of a stage outside its scheduler's process offers one.
ports=$(sed -n 's/^troupe: step link for layers .* on .*:\([0-9]*\)$/\1/p' "$work"/*.err)
expected=$(python3 -c '
import sys, tomllib
t = tomllib.load(open(sys.argv[1], "rb"))
print(sum(1 for r in t.get("replica", []) for s in r["stages"]
          if s["node"] != r.get("scheduler", r["stages"][0]["node"]) and s["devices"] == ["cpu"]))' "$topology")
opened=$(wc -w <<<"$ports")
[[ $opened == "$expected" ]] || { echo "$opened step links opened, $expected expected"; exit 1; }
# A node that names link_ports opens its step links there.
python3 - "$topology" "$work" <<'PY' || exit 1
import re, sys, tomllib
t = tomllib.load(open(sys.argv[1], "rb"))
gateway = t["gateway"]["node"]
for n in t["node"]:
    if "link_ports" not in n:
        continue
    lo, _, hi = str(n["link_ports"]).partition("-")
    lo, hi = int(lo), int(hi or lo)
    log = open(f"{sys.argv[2]}/{'node' if n['name'] == gateway else n['name']}.err").read()
    ports = list(map(int, re.findall(r"^troupe: step link for layers .* on .*:(\d+)$", log, re.M)))
    links = sum(1 for r in t.get("replica", []) for s in r["stages"]
                if s["node"] == n["name"] != r.get("scheduler", r["stages"][0]["node"]) and s["devices"] == ["cpu"])
    if len(ports) != links:
        sys.exit(f"node {n['name']} opened {len(ports)} step links, {links} expected")
    for port in ports:
        if not lo <= port <= hi:
            sys.exit(f"node {n['name']} opened a step link on {port}, outside its link_ports {lo}-{hi}")
PY
for port in $ports; do
  timeout 5 bash -c "cat '$work/junk2' >/dev/tcp/127.0.0.1/$port" 2>/dev/null || true
done
client -p "Once upon a time" -n 30 >"$work/after"
run -p "Once upon a time" -n 30 >"$work/after.run"
cmp -s "$work/after" "$work/after.run" || { echo "wrong output after junk"; exit 1; }
# Each step link said whom it hung up on, and why: junk is not a step link frame, or over
# TLS, not a handshake.
for port in $ports; do
  refusal="closed the connection from 127.0.0.1:[0-9]*: not a step link frame$"
  if tls_twin; then refusal="127.0.0.1:[0-9]*: refused: "; fi
  grep -q "^troupe: step link on port $port: $refusal" "$work"/*.err ||
    { echo "the step link on port $port did not log the junk it refused"; cat "$work"/*.err; exit 1; }
done

[[ $(client --stats | sed -n 's/^kv_blocks_used //p') == 0 ]] || { echo "blocks still in use"; exit 1; }

kill -TERM "$node_pid"
for _ in $(seq 1 100); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$node_pid" 2>/dev/null; then echo "node did not stop on SIGTERM"; exit 1; fi
wait "$node_pid" && rc=0 || rc=$?
node_pid=
[[ $rc == 0 ]] || { echo "node exited with $rc"; exit 1; }
for p in "${others[@]}"; do
  kill -TERM "$p"
  wait "$p" || { echo "a stage node exited with an error"; exit 1; }
done
others=()
# No actor printed a message it has no handler for (CAF does so on stdout).
if grep -h 'unexpected message' "$work"/*.out "$work"/*.err; then echo "an actor dropped a message it did not expect"; exit 1; fi
echo "node and client agree for ${#prompts[@]} concurrent streams ($topology)"

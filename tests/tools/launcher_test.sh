#!/usr/bin/env bash
# troupe-launch against real processes on 127.0.0.1: up prints the endpoint and the
# cluster answers; status lists every node and sees a SIGSTOPped one; down stops them all;
# a topology with a mistake starts nothing; a node that cannot start is reported at once;
# an interrupted up stops what it started.
# Bounded in time; leftovers are killed.
# Usage: launcher_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
state=$(mktemp -d)
launch() { timeout 120 "$build/tools/troupe-launch" "$@" --state-dir "$state"; }
cleanup() {
  [[ -f $state/pp2-tp2.supervisor ]] && kill -9 "$(cat "$state/pp2-tp2.supervisor")" 2>/dev/null || true
  if [[ -f $state/pp2-tp2.procs ]]; then
    while read -r _ pid; do kill -9 "$pid" 2>/dev/null || true; done <"$state/pp2-tp2.procs"
  fi
  rm -rf "$state"
}
trap cleanup EXIT
topo=$state/pp2-tp2.toml
topology_copy "$src/deploy/pp2-tp2.toml" "$topo"

ep=$(launch up "$topo" --capnp 127.0.0.1:0 | sed -n 's|^endpoint: capnp://||p')
[[ -n $ep ]] || { echo "no endpoint line"; exit 1; }
launched_over_tls "$topo" "$state"
got=$(timeout 60 "$build/tools/troupe-client" --connect "$ep" -p "Once upon a time" -n 50 -t 0)
want=$("$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -p "Once upon a time" -n 50 -t 0 -q)
[[ $got == "$want" ]] || { echo "output differs"; echo "$got"; echo "$want"; exit 1; }

status=$(launch status "$topo")
echo "$status"
[[ $(grep -cE '^node n[01] pid [0-9]+ running$' <<<"$status") == 2 ]] || { echo "status lines wrong"; exit 1; }
pid1=$(sed -n 's/^node n1 pid \([0-9]*\) .*/\1/p' <<<"$status")
kill -STOP "$pid1"
grep -q "^node n1 pid $pid1 stopped$" <<<"$(launch status "$topo")" || { echo "SIGSTOP not seen"; exit 1; }
kill -CONT "$pid1"

launch down "$topo"
for pid in $(sed -n 's/^node n[01] pid \([0-9]*\) .*/\1/p' <<<"$status"); do
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null && [[ $(ps -o stat= -p "$pid") != Z* ]]; then echo "pid $pid survived down"; exit 1; fi
done
launch status "$topo" >/dev/null && { echo "status still lists nodes after down"; exit 1; }

# A mistake is reported and nothing starts.
bad=$state/bad.toml
sed 's/layers = "3-4"/layers = "2-4"/' "$topo" >"$bad"
if out=$(launch up "$bad" 2>&1); then echo "a bad topology was started"; exit 1; fi
grep -q "overlaps" <<<"$out" || { echo "no reason given: $out"; exit 1; }
[[ ! -f $state/bad.procs ]] || { echo "processes were started for a bad topology"; exit 1; }
# A node that cannot start (its port is taken): up says which and why as soon as the node
# exits, not when its wait for the cluster runs out (an hour here, past the test's own
# time limit), and leaves nothing running (the gateway's node, waiting for a replica that
# cannot come, stops on SIGTERM within its 5 s, even with a connection to the squatter,
# which accepts nothing, still pending).
port1=$(sed -n '/^name *= *"n1"/,/^$/ s/^port *= *\([0-9]*\)/\1/p' "$topo")
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1); print("bound", flush=True); time.sleep(60)' \
  "$port1" >"$state/squatter" &
squatter=$!
for _ in $(seq 1 100); do grep -q bound "$state/squatter" && break; sleep 0.1; done
if out=$(launch up "$topo" --capnp 127.0.0.1:0 --timeout 3600 2>&1); then kill "$squatter"; echo "up succeeded without node n1"; exit 1; fi
kill "$squatter"
grep -q "node n1 exited" <<<"$out" && grep -q "cannot listen on 127.0.0.1:$port1" <<<"$out" || { echo "no reason given: $out"; exit 1; }
if pgrep -f "troupe-node $topo" >/dev/null; then echo "nodes left running: $(pgrep -af "troupe-node $topo")"; exit 1; fi
# Interrupted while it waits (node n1 here never comes up: a stand-in that only sleeps), up
# stops the nodes it started and says so.
# (The stand-in notes its pid, which exec keeps: the check below looks for that process,
# not for any `sleep 60` on the machine.)
printf '#!/bin/sh\ncase "$*" in *"--node n1"*) echo $$ >"%s"; exec sleep 60 ;; esac\nexec "%s" "$@"\n' \
  "$state/stand-in.pid" "$build/tools/troupe-node" >"$state/node.sh"
chmod +x "$state/node.sh"
timeout 120 "$build/tools/troupe-launch" up "$topo" --capnp 127.0.0.1:0 --node-binary "$state/node.sh" --state-dir "$state" \
  >"$state/up.out" 2>&1 &
up_pid=$!
for _ in $(seq 1 100); do grep -q "the gateway" "$state/up.out" && [[ -s $state/stand-in.pid ]] && break; sleep 0.1; done
kill -INT "$(pgrep -P "$up_pid")"
rc=0
wait "$up_pid" || rc=$?
grep -q "interrupted (signal 2); stopping the nodes it started" "$state/up.out" || { echo "interrupted up: $(cat "$state/up.out")"; exit 1; }
[[ $rc != 0 ]] || { echo "an interrupted up exited 0"; exit 1; }
[[ -s $state/stand-in.pid ]] || { echo "the stand-in for node n1 never started"; exit 1; }
stand_in=$(cat "$state/stand-in.pid")
for _ in $(seq 1 50); do
  pgrep -f "$state/node.sh|troupe-node $topo" >/dev/null || kill -0 "$stand_in" 2>/dev/null || break
  sleep 0.1
done
if pgrep -f "$state/node.sh|troupe-node $topo" >/dev/null || kill -0 "$stand_in" 2>/dev/null; then
  echo "left running: $(pgrep -af "$state/node.sh|troupe-node $topo") $(ps -o pid=,args= -p "$stand_in")"
  exit 1
fi
echo "launcher: up, status, SIGSTOP seen, down, bad topology refused, a node that cannot start reported, an interrupted up cleaned up"

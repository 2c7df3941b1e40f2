#!/usr/bin/env bash
# What a stranger on the network can do to a node's own links, from the hostile probe's
# findings, held on real node processes on 127.0.0.1: a prefill replica p0 (PP=2 over n0
# and n1, its second stage stepped over n1's step link) hands its prompts' KV to a decode
# replica d0 (PP=2 the other way round, taking KV on kv ports).
#  Plain links:
#  - a step-link frame trickled a byte at a time stalls nothing: requests beside it are
#    served with troupe-run's text at their usual pace, the trickler is cut off at the
#    frame's deadline, and the stall shows in /metrics and /health;
#  - two dozen KV records trickled to a decode node's landing, each announcing 60 MiB, hold
#    no more of its memory than the bytes they sent, and handoffs go on;
#  - a node whose host is off loopback is refused without [tls] (file and line, nothing
#    started), and with insecure_internal_ports = true starts and says so loudly.
#  Over TLS (the twin):
#  - silent connections filling every handshake slot of a step link and of a KV landing
#    keep out no peer with the cluster's certificate, and push out no established channel:
#    the next requests are still handed over.
# Bounded in time; every process is stopped.
# Usage: probe_links_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
launch_scratch

story="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball and wanted to play with it. Her mom said"
metric() { curl -s "$base/metrics" | sed -n "s/^$1 //p" | head -1; }
# served OUT [TIMEOUT]: a greedy completion of the story (40 tokens), its status printed;
# its cached prompt tokens in OUT.cached, its seconds in OUT.s.
served() {
  local t0 code
  t0=$(date +%s%N)
  code=$(curl -s -m "${2:-20}" -o "$1" -w '%{http_code}' -H 'Content-Type: application/json' "$base/v1/completions" \
    --data-binary '{"model":"stories260K","prompt":"'"$story"'","max_tokens":40,"temperature":0,"ignore_eos":true}' || true)
  awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.3f", (b - a) / 1e9 }' >"$1.s"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
open(sys.argv[1]+".cached","w").write(str(d["usage"].get("prompt_tokens_details",{}).get("cached_tokens",0)))' "$1" 2>/dev/null || true
  echo "$code"
}
# check_served WHAT: a request with troupe-run's text, handed over, within 5 s (it takes
# tens of milliseconds; a step held up by a stranger took 30 s or more).
check_served() {
  local code
  code=$(served "$work/r")
  [[ $code == 200 ]] || fail "$1: status $code after $(cat "$work/r.s") s: $(head -c 300 "$work/r")"
  served_as_run "$1" "$work/r" 40 "$story"
  [[ $(cat "$work/r.cached") -ge 32 ]] || fail "$1: the decode replica computed the prompt ($(cat "$work/r.cached") tokens loaded)"
  awk -v s="$(cat "$work/r.s")" 'BEGIN { exit !(s < 5) }' || fail "$1: took $(cat "$work/r.s") s"
}
# wait_metric NAME AT_LEAST: the metric's value once it reaches AT_LEAST (5 s at most; the
# gateway polls the nodes every second), else what it was.
wait_metric() {
  local v
  for _ in $(seq 1 50); do
    v=$(metric "$1")
    [[ -n $v && ${v%.*} -ge $2 ]] && break
    sleep 0.1
  done
  echo "${v:-none}"
}
pid_of() { launch status "$work/t.toml" 2>/dev/null | sed -n "s/^node $1 pid \([0-9]*\).*/\1/p" | head -1; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

read -ra ports <<<"$(free_ports 5)"
cat >"$work/t.toml" <<TOML
[model]
path      = "$models/stories260K.bin"
tokenizer = "$models/tok512.bin"
[gateway]
node  = "n0"
capnp = "127.0.0.1:${ports[0]}"
[[node]]
name = "n0"
host = "127.0.0.1"
port = ${ports[1]}
[[node]]
name = "n1"
host = "127.0.0.1"
port = ${ports[2]}
[[replica]]
name   = "p0"
role   = "prefill"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] }, { node = "n1", layers = "3-4", devices = ["cpu"] } ]
[[replica]]
name   = "d0"
role   = "decode"
stages = [ { node = "n1", layers = "0-2", devices = ["cpu"], kv_port = ${ports[3]} },
           { node = "n0", layers = "3-4", devices = ["cpu"], kv_port = ${ports[4]} } ]
TOML
launch_http "$work/t.toml"
check_served "before any stranger"
step_port=$(sed -n 's/.*troupe: step link for layers 3-4 on 127.0.0.1:\([0-9]*\)$/\1/p' "$state/n1.log" | head -1)
[[ -n $step_port ]] || fail "n1 opened no step link: $(tail -5 "$state/n1.log")"
kv_port=${ports[3]}  # n1's landing

# A trickled step-link frame.
trickled_step_frame() {
  # A 20-byte header announcing a 4,096-byte plan, then a byte every 0.3 s; cut off, it
  # starts again, for 12 s.
  python3 - "$step_port" >"$work/trickle" 2>&1 <<'PY' &
import socket, struct, sys, time
port, end = int(sys.argv[1]), time.monotonic() + 12
cut = 0
while time.monotonic() < end:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(struct.pack("<5I", 0x4C535254, 1, 4096, 0, 0))
    print("trickling", flush=True)
    try:
        while time.monotonic() < end:
            s.sendall(b"p")
            time.sleep(0.3)  # the trickler's pace
    except OSError:
        cut += 1
        print("cut off", flush=True)
    s.close()
print(f"cut off {cut} times")
PY
  trickler=$!
  others+=("$trickler")
  for _ in $(seq 1 100); do grep -q trickling "$work/trickle" && break; sleep 0.05; done
  # Requests served beside it, one after another, until the trickler has been cut off.
  local served=0
  for _ in $(seq 1 150); do
    check_served "beside a trickled step-link frame ($((served + 1)))"
    served=$((served + 1))
    ((served >= 3)) && grep -q "^cut off$" "$work/trickle" && break
    sleep 0.1
  done
  grep -q "^cut off$" "$work/trickle" || fail "the trickler was never cut off: $(cat "$work/trickle")"
  wait "$trickler" || true
  grep -q "step link on port $step_port: closed the connection from 127.0.0.1:[0-9]*: a frame of 4116 bytes not whole within" "$state/n1.log" ||
    fail "n1 does not log the stalled frame: $(grep 'step link' "$state/n1.log" | tail -3)"
  stalls=$(wait_metric 'troupe_link_stalled_total{node="n1",link="step"}' 1)
  [[ ${stalls%.*} -ge 1 ]] || fail "/metrics shows no stall of n1's step link: '$stalls'"
  curl -s "$base/health" >"$work/health"
  grep -q "node n1: a step link stalled" "$work/health" || fail "/health does not name the stall: $(cat "$work/health")"
  echo "ok: a trickled step-link frame: requests served beside it, the trickler cut off, $stalls stall(s) in /metrics"
}

# Trickled KV records.
trickled_kv_records() {
  n1=$(pid_of n1)
  before=$(rss_kb "$n1")
  python3 - "$kv_port" >"$work/kvtrickle" 2>&1 <<'PY' &
import socket, struct, sys, time
port = int(sys.argv[1])
conns = []
for _ in range(24):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"TKVH" + struct.pack("<I", 1) + b"TKVB" + struct.pack("<I", 60 << 20))
    conns.append(s)
end, rounds = time.monotonic() + 12, 0
while time.monotonic() < end:
    for s in conns:
        try:
            s.sendall(b"k")
        except OSError:
            pass
    rounds += 1
    if rounds == 4:
        print("24 records trickling", flush=True)
    time.sleep(0.5)  # the trickler's pace
PY
  kvtrickler=$!
  others+=("$kvtrickler")
  # Its 24 records begun and trickling (what an announced length would have taken by now).
  for _ in $(seq 1 100); do grep -q "24 records trickling" "$work/kvtrickle" && break; sleep 0.1; done
  grep -q "24 records trickling" "$work/kvtrickle" || fail "the KV trickler did not get going: $(cat "$work/kvtrickle")"
  during=$(rss_kb "$n1")
  check_served "beside 24 trickled KV records"
  grown=$(( (during - before) / 1024 ))
  echo "n1's memory: $((before / 1024)) MiB before, $((during / 1024)) MiB with 24 records of 60 MiB trickling"
  # Each announced record held its full 60 MiB before: 1.4 GiB for 24.
  ((grown < 32)) || fail "24 trickled KV records took n1 from $((before / 1024)) to $((during / 1024)) MiB"
  wait "$kvtrickler" || true  # (its frames' deadlines, 8.75 s, have passed)
  kv_stalls=$(wait_metric 'troupe_link_stalled_total{node="n1",link="kv"}' 1)
  [[ ${kv_stalls%.*} -ge 1 ]] || fail "/metrics shows no stall of n1's KV landing: '$kv_stalls'"
  check_served "after the trickled KV records"
  echo "ok: trickled KV records: n1 grew $grown MiB, $kv_stalls stall(s) in /metrics, handoffs went on"
}

# Internal ports off loopback.
off_loopback() {
  launch down "$work/t.toml" >/dev/null 2>&1 || true
  sed -e 's/^host = "127.0.0.1"/host = "0.0.0.0"/' "$work/t.toml" >"$work/off.toml"
  if out=$(timeout 60 "$build/tools/troupe-launch" up "$work/off.toml" --state-dir "$work/off-state" 2>&1); then
    fail "troupe-launch up started a node off loopback without [tls]: $out"
  fi
  grep -q "off.toml:[0-9]*: \[\[node\]\] #1 'n0': host 0.0.0.0 is not loopback, and without \[tls\]" <<<"$out" ||
    fail "troupe-launch's refusal does not name the line and the reason: $out"
  [[ ! -s $work/off-state/off.procs ]] || fail "a node was started off loopback"
  if out=$(timeout 60 "$build/tools/troupe-node" "$work/off.toml" --node n1 2>&1); then fail "troupe-node started off loopback: $out"; fi
  grep -q "insecure_internal_ports = true" <<<"$out" || fail "troupe-node's refusal does not say how: $out"
  # Said outright, a lone node starts, and says what it risks.
  mkdir -p "$work/lone"
  single_topology "$src" "$work/lone"
  sed -i -e 's/^host *= *"127.0.0.1"/host = "0.0.0.0"\ninsecure_internal_ports = true/' -e "s/^port *= *7410/port = $(free_port)/" "$work/lone/t.toml"
  start_node "$work/lone/t.toml" "$work/lone"
  grep -q "WARNING: node n0's internal ports (its agent, step links, KV channels) listen on 0.0.0.0 without TLS" "$work/lone/node.err" ||
    fail "an insecure node does not say so: $(head -5 "$work/lone/node.err")"
  stop_tree "$node_pid"
  node_pid=
  echo "ok: off loopback without [tls] refused at its line; insecure_internal_ports starts with a warning"
}

# Handshake floods under [tls]: silent connections opened without pause to n1's step link
# and KV landing, hundreds held at once, while a peer with the cluster's certificate
# completes handshakes with each, and requests are still handed over (the prefill
# replica's channel to the landing is not pushed out).
handshake_floods() {
  python3 - "$step_port" "$kv_port" "$work/flood.ready" >"$work/flood.log" 2>&1 <<'PY' &
import socket, sys, time
ports, ready = (int(sys.argv[1]), int(sys.argv[2])), sys.argv[3]
held, end, opened = [], time.monotonic() + 10, 0
while time.monotonic() < end:
    for port in ports:
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            opened += 1
        except OSError:
            pass
    if len(held) > 600:
        for s in held[:100]:
            s.close()
        del held[:100]
    if opened >= 400 and ready:
        open(ready, "w").close()
        ready = None
    time.sleep(0.002)
print(f"{opened} silent connections opened")
PY
  local flooder=$!
  others+=("$flooder")
  for _ in $(seq 1 100); do [[ -f $work/flood.ready ]] && break; sleep 0.05; done
  [[ -f $work/flood.ready ]] || fail "the flood did not get going: $(cat "$work/flood.log")"
  python3 - "$step_port" "$kv_port" "$work/certs" >"$work/auth" 2>&1 <<'PY' || fail "an authenticated peer during the flood: $(cat "$work/auth")"
import socket, ssl, sys, time
step, kv, certs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
ctx.check_hostname = False
ctx.load_verify_locations(f"{certs}/ca.pem")
ctx.load_cert_chain(f"{certs}/n0.pem", f"{certs}/n0.key")
for port in (step, kv):
    for round in range(5):
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with ctx.wrap_socket(raw) as tls:
                assert tls.version() == "TLSv1.3"
        print(f"port {port}: an authenticated handshake in {(time.monotonic() - t0) * 1000:.0f} ms")
PY
  cat "$work/auth"
  check_served "during the handshake floods"
  wait "$flooder" || true
  cat "$work/flood.log"
  check_served "after the handshake floods"
  local crowded
  crowded=$(wait_metric 'troupe_link_crowded_total{node="n1",link="kv"}' 100)
  [[ ${crowded%.*} -ge 100 ]] || fail "n1's KV landing counts '$crowded' crowded handshakes, not 100 or more"
  echo "ok: handshake floods: authenticated peers got in, handoffs went on, $crowded crowded out at the landing"
}

if tls_twin; then
  handshake_floods
else
  trickled_step_frame
  trickled_kv_records
  off_loopback
fi
launch down "$work/t.toml" >/dev/null 2>&1 || true
echo "PASS"

#!/usr/bin/env bash
# Links between nodes over TLS, on real processes on 127.0.0.1: troupe-launch certs makes
# the cluster's files (keys private, kept when run again); a PP=2 cluster with [tls] serves
# greedy text identical to troupe-run's, and troupe-launch reaches its agents with its own
# certificate. Strangers are refused and named in the node's log: a plain-TCP CAF client
# (valid frames, no TLS), a node of another cluster, a TLS client without a certificate,
# one with another cluster's certificate that trusts this cluster, and one that never
# finishes its handshake (closed after the handshake deadline). The step link between the
# stages is TLS as well, and refuses the same strangers. The Cap'n Proto endpoint speaks
# TLS with the gateway node's certificate: troupe-client with the cluster's CA gets the
# same text, a plain client is refused and logged, one trusting another CA refuses the
# gateway, and the bytes a relay records hold neither the prompt nor the text. The HTTP
# endpoint is HTTPS with the same certificate: curl and troupe-bench with the cluster's CA
# are served the same text, a plain HTTP client's handshake is refused and logged, and a
# client without the CA refuses the gateway.
# Bounded in time; leftovers are killed.
# Usage: tls_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
build=$1 src=$2 models=$3
source "$(dirname "$0")/lib.sh"
scratch
state=$work/state
launch() { timeout 120 "$build/tools/troupe-launch" "$@"; }
trap 'launch down "$work/pp2.toml" --state-dir "$state" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

sed -e "s|\.\./\.\./shared|$(cd "$src/.." && pwd)/shared|" "$src/deploy/pp2.toml" >"$work/pp2.toml"
printf '\n[tls]\nca = "certs/ca.pem"\ncert = "certs/{node}.pem"\nkey = "certs/{node}.key"\n' >>"$work/pp2.toml"
# The Cap'n Proto endpoint over TLS too, with the gateway node's certificate.
sed -i 's|^\[gateway\]$|[gateway]\ntls_cert = "certs/n0.pem"\ntls_key = "certs/n0.key"|' "$work/pp2.toml"

# Without the files, up says which is missing and how to make them; nothing starts.
if out=$(launch up "$work/pp2.toml" --state-dir "$state" 2>&1); then fail "up without certificates succeeded"; fi
grep -q "certs/ca.pem: cannot open" <<<"$out" && grep -q "troupe-launch certs" <<<"$out" || fail "no reason given: $out"
[[ ! -f $state/pp2.procs ]] || fail "nodes were started without certificates"

out=$(launch certs "$work/pp2.toml")
for f in ca n0 n1 troupe-launch; do [[ -s $work/certs/$f.pem && -s $work/certs/$f.key ]] || fail "certs: no $f: $out"; done
for k in "$work"/certs/*.key; do [[ $(stat -c %a "$k") == 600 ]] || fail "$k is readable by others: $(stat -c %a "$k")"; done
grep -q "wrote $work/certs/n1.pem (n1, signed by troupe cluster CA (pp2)" <<<"$out" || fail "certs report: $out"
again=$(launch certs "$work/pp2.toml")
[[ $(grep -c '^kept' <<<"$again") == 4 ]] || fail "certs run again did not keep the files: $again"

launch up "$work/pp2.toml" --capnp 127.0.0.1:0 --http 127.0.0.1:0 --state-dir "$state" >"$work/up"
ep=$(sed -n 's|^endpoint: capnps://||p' "$work/up")
hep=$(sed -n 's|^endpoint: https://||p' "$work/up")
[[ -n $ep && -n $hep ]] || fail "no endpoints over TLS: $(cat "$work/up") $(tail -5 "$state"/n0.log)"
for n in n0 n1; do grep -q "troupe-node $n: links to other nodes (actors, step links, KV) over TLS" "$state/$n.log" || fail "$n does not say it uses TLS"; done
client() { timeout 60 "$build/tools/troupe-client" "$@"; }
got=$(client --connect "capnps://$ep" --ca "$work/certs/ca.pem" -p "Once upon a time" -n 40 -t 0)
want=$("$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -p "Once upon a time" -n 40 -t 0 -q)
[[ $got == "$want" ]] || fail "output over TLS differs: $got / $want"
actors=$(launch status "$work/pp2.toml" --state-dir "$state" --actors)
grep -q '^actor r0/stage1 node n1 kind stage alive' <<<"$actors" || fail "troupe-launch with its certificate: $actors"

port1=$(sed -n '/^name *= *"n1"/,/^$/ s/^port *= *\([0-9]*\)/\1/p' "$work/pp2.toml")
refusals() { grep -c "troupe: node link on port $port1: 127.0.0.1:[0-9]*: \(refused\|no TLS handshake\)" "$state/n1.log" || true; }
expect_refusal() {  # WHAT PATTERN: the log gains a line naming PATTERN within 10 s
  for _ in $(seq 1 100); do grep -q "$2" "$state/n1.log" && return 0; sleep 0.1; done
  fail "$1: n1's log does not say '$2': $(tail -3 "$state/n1.log")"
}

# A stranger with valid CAF frames over plain TCP: the same topology without [tls].
sed '/^\[tls\]/,$d' "$work/pp2.toml" >"$work/plain.toml"
cp "$state/pp2.procs" "$state/plain.procs"
out=$(launch status "$work/plain.toml" --state-dir "$state" --actors 2>&1 || true)
grep -q "node n1 does not answer" <<<"$out" || fail "a plain-TCP client reached n1: $out"
grep -q '^actor ' <<<"$out" && fail "a plain-TCP client listed actors: $out"
expect_refusal "plain TCP" "127.0.0.1:[0-9]*: refused: it does not speak TLS"

# A node of another cluster (its own CA).
mkdir -p "$work/other"
sed 's|certs/|other/|' "$work/pp2.toml" >"$work/other.toml"
launch certs "$work/other.toml" >/dev/null
cp "$state/pp2.procs" "$state/other.procs"
out=$(launch status "$work/other.toml" --state-dir "$state" --actors 2>&1 || true)
grep -q '^actor ' <<<"$out" && fail "another cluster's troupe-launch listed actors: $out"
expect_refusal "another cluster" "it does not trust this node's certificate"

# TLS clients: without a certificate; with another cluster's that trusts this cluster's CA.
timeout 10 openssl s_client -connect "127.0.0.1:$port1" -CAfile "$work/certs/ca.pem" </dev/null >/dev/null 2>&1 || true
expect_refusal "no certificate" "it showed no certificate"
timeout 10 openssl s_client -connect "127.0.0.1:$port1" -CAfile "$work/certs/ca.pem" \
  -cert "$work/other/n0.pem" -key "$work/other/n0.key" </dev/null >/dev/null 2>&1 || true
expect_refusal "another cluster's certificate" "its certificate is not of this cluster"

# One that connects and says nothing is closed after the handshake deadline.
python3 - "$port1" <<'PY' || fail "a silent connection stayed open"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=15)
try:
    got = s.recv(10)
except socket.timeout:
    sys.exit("still open after 15 s")
except ConnectionResetError:
    got = b""
sys.exit(0 if got == b"" else f"got {got!r}")
PY
expect_refusal "silent" "127.0.0.1:[0-9]*: no TLS handshake within 5000 ms; closed"

# The step link (n1's stage, stepped by n0's scheduler) is TLS too: the scheduler used it,
# and a client without a certificate or without TLS is refused at its port.
step_port=$(sed -n 's/.*troupe: step link for layers [0-9-]* on 127.0.0.1:\([0-9]*\)$/\1/p' "$state/n1.log" | head -1)
[[ -n $step_port ]] || fail "n1 opened no step link: $(tail -5 "$state/n1.log")"
grep -q "its steps go through the middleman" "$state/n0.log" && fail "n0 did not use the step link over TLS: $(grep middleman "$state/n0.log")"
timeout 10 openssl s_client -connect "127.0.0.1:$step_port" -CAfile "$work/certs/ca.pem" </dev/null >/dev/null 2>&1 || true
expect_refusal "step link, no certificate" "troupe: step link on port $step_port: 127.0.0.1:[0-9]*: refused: it showed no certificate"
printf 'TRSL\0\0\0\0' | timeout 10 python3 -c "import socket,sys; s=socket.create_connection(('127.0.0.1',$step_port)); s.sendall(sys.stdin.buffer.read()); s.settimeout(8); s.recv(10)" 2>/dev/null || true
expect_refusal "step link, plain TCP" "troupe: step link on port $step_port: 127.0.0.1:[0-9]*: refused: it does not speak TLS"

# Clients of the Cap'n Proto endpoint: one without TLS is refused and logged; one that
# does not trust the gateway's CA refuses it; and what crosses the wire to one that
# does holds neither the prompt nor the text.
if out=$(client --connect "$ep" -p "Once upon a time" -n 8 -t 0 2>&1); then fail "a plain client was served over TLS: $out"; fi
for _ in $(seq 1 100); do grep -q "troupe-capnp: 127.0.0.1:[0-9]*: refused: it does not speak TLS" "$state/n0.log" && break; sleep 0.1; done
grep -q "troupe-capnp: 127.0.0.1:[0-9]*: refused: it does not speak TLS" "$state/n0.log" || fail "the plain client's refusal is not logged: $(tail -3 "$state/n0.log")"
if out=$(client --connect "capnps://$ep" --ca "$work/other/ca.pem" -p "Once upon a time" -n 8 -t 0 2>&1); then fail "a client trusting another CA was served"; fi
grep -q "the gateway's certificate is not trusted" <<<"$out" || fail "no reason given to the client: $out"
relay_port=$(free_port)
python3 - "$relay_port" "${ep##*:}" "$work/wire.bin" <<'PY' &
import socket, sys, threading
listen = socket.socket(); listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listen.bind(("127.0.0.1", int(sys.argv[1]))); listen.listen(1); listen.settimeout(30)
open(sys.argv[3] + ".ready", "w").close()
a, _ = listen.accept(); b = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
wire = open(sys.argv[3], "wb")
def pump(src, dst):
    while (data := src.recv(65536)):
        wire.write(data); wire.flush(); dst.sendall(data)
    dst.shutdown(socket.SHUT_WR)
threads = [threading.Thread(target=pump, args=p) for p in ((a, b), (b, a))]
for t in threads: t.start()
for t in threads: t.join()
PY
relay=$!
for _ in $(seq 1 50); do [[ -f $work/wire.bin.ready ]] && break; sleep 0.1; done
through=$(client --connect "capnps://127.0.0.1:$relay_port" --ca "$work/certs/ca.pem" -p "Once upon a time" -n 40 -t 0)
[[ $through == "$want" ]] || fail "output through the relay differs: $through"
wait "$relay" || true
[[ -s $work/wire.bin ]] || fail "the relay recorded nothing"
if grep -aq "Once upon a time" "$work/wire.bin" || grep -aqF "${want:20:24}" "$work/wire.bin"; then fail "the prompt or the text crossed the wire in the clear"; fi

# HTTPS: the same text with the cluster's CA, from curl and from troupe-bench; a plain
# HTTP client is refused (and logged), and one without the CA refuses the gateway.
# (troupe-run's -n 40 counts the prompt's 4 tokens: 36 more.)
body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":36,"temperature":0}'
curl -s --cacert "$work/certs/ca.pem" "https://$hep/v1/completions" -d "$body" >"$work/https" || true
text=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"], end="")' "$work/https") ||
  fail "HTTPS completion: $(head -c 300 "$work/https")"
[[ "Once upon a time$text" == "$want" ]] || fail "HTTPS text differs: $text"
timeout 60 "$build/tools/troupe-bench" --endpoint "https://$hep" --ca "$work/certs/ca.pem" --requests 4 --concurrency 2 \
  --output-tokens 8 >"$work/bench" 2>&1 || fail "troupe-bench over HTTPS: $(tail -3 "$work/bench")"
if curl -s -m 10 "http://$hep/health" >/dev/null; then fail "plain HTTP was answered on the HTTPS endpoint"; fi
for _ in $(seq 1 100); do grep -q "troupe-http: refused [0-9]* TLS handshake" "$state/n0.log" && break; sleep 0.1; done
grep -q "troupe-http: refused [0-9]* TLS handshake" "$state/n0.log" || fail "the plain HTTP client's refusal is not logged"
rc=0
curl -s -m 10 "https://$hep/health" >/dev/null || rc=$?
[[ $rc == 60 ]] || fail "a client without the cluster's CA: curl exit $rc, wanted 60 (certificate not trusted)"

# Still serving, as before.
again=$(client --connect "capnps://$ep" --ca "$work/certs/ca.pem" -p "Once upon a time" -n 40 -t 0)
[[ $again == "$want" ]] || fail "output after the strangers differs: $again"
launch down "$work/pp2.toml" --state-dir "$state" >/dev/null
echo "refused or closed: $(refusals) connections from strangers"

#!/usr/bin/env bash
# A real troupe-node on 127.0.0.1 against clients that hold connections without using
# them, more of them than [gateway] max_connections and than the file descriptors the
# process may open (its limit lowered once it runs): both endpoints go on serving a
# working client while the idle ones are still there (the idle connection waiting longest
# makes room), idle connections are closed after read_timeout_s (6 s here), and the Cap'n
# Proto endpoint keeps listening after running out of descriptors; and a client that
# leaves before its whole answer has its request cancelled, and a request is cancelled only
# with the key that made it. Bounded in time; the nodes are always stopped.
# Usage: gateway_limits_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
scratch

single_topology "$src" "$work"
sed -i 's|^capnp = .*|&\nmax_connections = 60\nread_timeout_s = 6|' "$work/t.toml"
printf '[scheduler]\nmax_running = 4\n' >>"$work/t.toml"  # so that HTTP serves 60 at once too
start_node "$work/t.toml" "$work"
node=$(pgrep -P "$node_pid" troupe-node)
capnp_ep=${capnp_url#capnp://}
client() { timeout 20 "$build/tools/troupe-client" --connect "$capnp_ep" "$@"; }

# flood N_CAPNP N_HTTP: that many idle connections to each endpoint (the HTTP ones with
# half a request), then a working client on each endpoint that has any, served while idle
# ones are still held (not only once they have timed out); then every idle one must be
# closed by the node, the Cap'n Proto ones without a word (to make room, or not greeting
# in time), the HTTP ones with a 408.
cat >"$work/flood.py" <<'PY'
import subprocess, sys, time
from raw_conns import HALF_GET, address, connect, held
capnp, http, client = address(sys.argv[1]), address(sys.argv[2]), sys.argv[3]
n_capnp, n_http = int(sys.argv[4]), int(sys.argv[5])
t0 = time.time()
idle = connect(capnp, n_capnp)
half = connect(http, n_http, HALF_GET)
if idle:
    r = subprocess.run(["timeout", "20", client, "--connect", sys.argv[1], "-p", "Once", "-n", "5"], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.startswith("Once"):
        sys.exit(f"a Cap'n Proto client beside {n_capnp} idle connections: rc {r.returncode}: {r.stdout} {r.stderr}")
    if held(idle) == 0:
        sys.exit("the Cap'n Proto client was served only once every idle connection had been closed")
if half:
    r = subprocess.run(["curl", "-s", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}", f"http://{sys.argv[2]}/health"],
                       capture_output=True, text=True)
    if r.stdout != "200":
        sys.exit(f"an HTTP client beside {n_http} half requests got {r.stdout or 'no answer'}")
    if held(half) == 0:
        sys.exit("the HTTP client was served only once every half request had been closed")
for c in idle:
    got = c.until_closed(15)
    if got != b"":
        sys.exit(f"an idle Cap'n Proto connection was {'sent ' + repr(got[:40]) if got else 'not closed'}")
for c in half:
    got = c.until_closed(15)
    if not (got or b"").startswith(b"HTTP/1.1 408"):
        sys.exit(f"a half HTTP request got {got[:40] if got is not None else 'no answer, its connection open'}")
print(f"all closed after {time.time() - t0:.1f} s")
PY
flood() { python3 "$work/flood.py" "$capnp_ep" "${http_url#http://}" "$build/tools/troupe-client" "$@" >"$work/flood" 2>&1; }

# More idle connections than max_connections (60 on each endpoint).
flood 250 250 || fail "flood: $(cat "$work/flood")"
grep -q 'troupe-capnp: closed the connection that had waited longest' "$work/node.err" ||
  fail "the node did not say why it closed Cap'n Proto connections"
metrics=$(curl -s -m 10 "$http_url/metrics")
for api in http capnp; do
  grep -Eq "^troupe_connections_shed_total\{api=\"$api\"\} [1-9]" <<<"$metrics" || fail "no $api connection counted as shed"
done
grep -q '^troupe_connections_open{api="capnp"} 0$' <<<"$metrics" ||
  fail "Cap'n Proto connections still counted open: $(grep troupe_connections_open <<<"$metrics")"

# Out of descriptors: the process may open a dozen more than it has open. The Cap'n Proto
# endpoint goes on listening, closing idle connections to take the next.
open_now=$(ls "/proc/$node/fd" | wc -l)
prlimit --pid "$node" --nofile=$((open_now + 12)):$((open_now + 12)) || fail "cannot lower the node's descriptor limit"
flood 80 0 || fail "flood at the descriptor limit: $(cat "$work/flood")"
grep -q 'troupe-capnp: cannot accept a connection' "$work/node.err" || fail "the node never ran out of descriptors"

# Afterwards both endpoints serve as before.
out=$(client -p "Once upon a time" -n 8 2>&1) || fail "Cap'n Proto after the flood: $out"
[[ $out == "Once upon a time"* ]] || fail "Cap'n Proto after the flood: $out"
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$http_url/v1/completions" -d '{"model":"stories260K","prompt":"Once","max_tokens":4}')
[[ $code == 200 ]] || fail "HTTP after the flood: $code"
kill -0 "$node" || fail "the node died"

# Stopping is not held up by connections waiting for their request: they are closed at
# once, not left to their read_timeout_s.
python3 - "$http_url" >"$work/holder" 2>&1 <<'PY' &
import sys, time
from raw_conns import HALF_GET, address, connect
half = connect(address(sys.argv[1]), 20, HALF_GET)
print("holding", flush=True)
time.sleep(30)
PY
holder=$!
others+=("$holder")
for _ in $(seq 1 100); do grep -q holding "$work/holder" && break; sleep 0.1; done
kill -TERM "$node"
for _ in $(seq 1 40); do kill -0 "$node" 2>/dev/null || break; sleep 0.1; done
kill -0 "$node" 2>/dev/null && fail "the node was still stopping 4 s later, with connections waiting for their request"
kill "$holder" 2>/dev/null || true
stop_tree "$node_pid"
node_pid=

# A client that gives up waiting for a whole answer, once its request runs, has it
# cancelled, not run to its 1,000 tokens (a synthetic model of 25M F32 parameters: 25 s
# here at 40 tokens/s, and more than 2 s even at the 40 GB/s its weights would need to
# stream 400 times a second; a whole answer's client is checked for every second).
"$build/tools/make-model" "$work/slow.gguf" --dim 512 --hidden 1376 --layers 8 --heads 8 --vocab 512 --context 1024 >/dev/null
sed -e "s|^path .*|path = \"$work/slow.gguf\"|; /^tokenizer/d; s|layers = \"0-4\"|layers = \"all\"|" "$work/t.toml" >"$work/slow.toml"
start_node "$work/slow.toml" "$work"
curl -s -o /dev/null "$http_url/v1/completions" -d '{"model":"slow","prompt":"a","max_tokens":1000,"ignore_eos":true}' &
leaver=$!
others+=("$leaver")
running() { grep -q '^troupe_requests_running 1$' <<<"$(curl -s "$http_url/metrics")"; }  # (grep -q would cut curl short)
for _ in $(seq 1 100); do running && break; sleep 0.1; done
running || fail "the request never ran"
kill "$leaver"
for _ in $(seq 1 100); do grep -q ' outcome=' "$work/node.err" && break; sleep 0.1; done
line=$(grep ' outcome=' "$work/node.err" | head -1)
[[ $line == *outcome=cancelled* ]] || fail "a client that left a whole answer: ${line:-no request line}"
out=$(sed -n 's/.* tokens_out=\([0-9]*\).*/\1/p' <<<"$line")
((out < 1000)) || fail "the request ran to its end: $line"
stop_tree "$node_pid"
node_pid=

# A request can be cancelled with the key that made it, and not with another: a client of
# another key is told there is no such request. (The gateway's first request has id 1.)
printf 'key-one\nkey-two\n' >"$work/keys"
sed -i 's|^capnp = .*|&\napi_keys_file = "'"$work"'/keys"|' "$work/slow.toml"
start_node "$work/slow.toml" "$work"
capnp_ep=${capnp_url#capnp://}
TROUPE_API_KEY=key-one timeout 30 "$build/tools/troupe-client" --connect "$capnp_ep" -p a -n 600 --ignore-eos \
  >"$work/long" 2>&1 &
long_pid=$!
others+=("$long_pid")
for _ in $(seq 1 100); do [[ -s $work/long ]] && break; sleep 0.1; done
out=$(TROUPE_API_KEY=key-two timeout 10 "$build/tools/troupe-client" --connect "$capnp_ep" --cancel 1 2>&1 || true)
[[ $out == "no such request" ]] || fail "another key's cancel: $out"
out=$(TROUPE_API_KEY=key-one timeout 10 "$build/tools/troupe-client" --connect "$capnp_ep" --cancel 1 2>&1 || true)
[[ $out == "cancelled" ]] || fail "the same key's cancel: $out"
wait "$long_pid" || true
for _ in $(seq 1 50); do grep -q 'request id=1 ' "$work/node.err" && break; sleep 0.1; done
grep -q 'request id=1 outcome=cancelled' "$work/node.err" || fail "the cancelled request: $(grep 'request id=1 ' "$work/node.err")"

# Connections that ask for the gateway and then wait, without a key, more of them than
# max_connections (60): a client with a key is still served while they are held.
python3 - "$capnp_ep" "$build/tools/troupe-client" >"$work/greeted" 2>&1 <<'PY' ||
import os, subprocess, sys
from raw_conns import BOOTSTRAP, address, connect, held
greeted = connect(address(sys.argv[1]), 80, BOOTSTRAP)
r = subprocess.run(["timeout", "20", sys.argv[2], "--connect", sys.argv[1], "-p", "a", "-n", "3"],
                   capture_output=True, text=True, env=dict(os.environ, TROUPE_API_KEY="key-one"))
if r.returncode != 0:
    sys.exit(f"a client with a key beside 80 greeted connections: rc {r.returncode}: {r.stdout} {r.stderr}")
if held(greeted) == 0:
    sys.exit("the client was served only once every greeted connection had been closed")
PY
  fail "greeted connections: $(cat "$work/greeted")"
echo "gateway limits: idle and surplus connections closed, both endpoints serving at the descriptor limit, departed clients' requests cancelled, cancels only by the requester's key, keyless connections making room for clients"

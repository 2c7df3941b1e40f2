#!/usr/bin/env bash
# Faults of the HTTP gateway found by probing a real troupe-node on 127.0.0.1, each held
# here: clients that half-close their socket after a whole request get their answer (12
# request shapes, HTTP/1.1 and 1.0, whole and streamed); numbers no double holds get a 400
# naming the field; requests the scheduler refuses with a 400 count as invalid in
# /metrics; 1,000 idle keep-alive connections and 100 streams whose readers never read
# leave a working client served, with the gateway's threads unchanged; and SIGTERM drains
# a stream in flight to its end. Bounded in time; the node is always stopped.
# Usage: http_faults_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
scratch

single_topology "$src" "$work"
printf '[scheduler]\nmax_running = 128\n' >>"$work/t.toml"
start_node "$work/t.toml" "$work"
node=$(pgrep -P "$node_pid" troupe-node)

# Twelve request shapes, each sent whole and then the client's sending half shut down.
python3 - "$http_url" >"$work/half" 2>&1 <<'PY' || fail "half-closed clients: $(cat "$work/half")"
import json, socket, sys
from raw_conns import address
addr = address(sys.argv[1])
def body(d):
    return json.dumps(d).encode()
comp = body({"model": "stories260K", "prompt": "Once", "max_tokens": 8, "temperature": 0})
stream = body({"model": "stories260K", "prompt": "Once", "max_tokens": 8, "stream": True})
chat = body({"model": "stories260K", "messages": [{"role": "user", "content": "Once"}], "max_tokens": 8})
chat_stream = body({"model": "stories260K", "messages": [{"role": "user", "content": "Once"}], "max_tokens": 8, "stream": True})
def post(path, b, version="1.1", extra=b""):
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(b)}\r\n").encode() + extra + b"\r\n" + b
shapes = [
    ("GET /health 1.1", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"200", b'"ok"'),
    ("GET /health 1.0", b"GET /health HTTP/1.0\r\n\r\n", b"200", b'"ok"'),
    ("GET /v1/models 1.1", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", b"200", b'"stories260K"'),
    ("GET /metrics 1.0", b"GET /metrics HTTP/1.0\r\n\r\n", b"200", b"troupe_requests_total"),
    ("completion 1.1", post("/v1/completions", comp), b"200", b'"text_completion"'),
    ("completion 1.0", post("/v1/completions", comp, "1.0"), b"200", b'"text_completion"'),
    ("streamed completion 1.1", post("/v1/completions", stream), b"200", b"data: [DONE]"),
    ("streamed completion 1.0", post("/v1/completions", stream, "1.0"), b"200", b"data: [DONE]"),
    ("chat 1.1, Connection: close", post("/v1/chat/completions", chat, extra=b"Connection: close\r\n"), b"200", b'"chat.completion"'),
    ("streamed chat 1.1", post("/v1/chat/completions", chat_stream), b"200", b"data: [DONE]"),
    ("tokenize 1.1", post("/tokenize", body({"prompt": "Once upon a time"})), b"200", b'"tokens"'),
    ("bad JSON 1.1", post("/v1/completions", b"{bad"), b"400", b"not valid JSON"),
]
failed = []
for name, req, status, want in shapes:
    s = socket.create_connection(addr, timeout=20)
    s.sendall(req)
    s.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        failed.append(f"{name}: no end in 20 s after {got[:80]!r}")
        continue
    finally:
        s.close()
    if not got.startswith(b"HTTP/1.") or got[9:12] != status or want not in got:
        failed.append(f"{name}: {got[:200]!r}")
if failed:
    sys.exit("\n".join(failed))
print(f"{len(shapes)} half-closed shapes answered")
PY

# Numbers no double holds: a 400 that names the field.
post() { curl -s -o "$work/body" -w '%{http_code}' "$http_url$1" -H 'Content-Type: application/json' --data-binary "$2"; }
code=$(post /v1/completions '{"model":"stories260K","prompt":"a","temperature":1e309}')
[[ $code == 400 ]] && grep -q "'temperature'" "$work/body" || fail "temperature 1e309: $code $(cat "$work/body")"
code=$(post /v1/completions '{"model":"stories260K","prompt":1e999999}')
[[ $code == 400 ]] && grep -q "'prompt'" "$work/body" || fail "prompt 1e999999: $code $(cat "$work/body")"

# A 400 is an invalid request in /metrics, whoever refused it.
invalid() { curl -s "$http_url/metrics" | sed -n 's/^troupe_requests_total{outcome="invalid"} //p'; }
errors() { curl -s "$http_url/metrics" | sed -n 's/^troupe_requests_total{outcome="error"} //p'; }
before=$(invalid) errors_before=$(errors)
long=$(python3 -c 'print(" ".join(["Once upon a time"] * 200))')
for request in '{"model":"stories260K","prompt":"'"$long"'","max_tokens":4}' \
  '{"model":"stories260K","prompt":[1,99999]}' \
  '{"model":"stories260K","prompt":"a","logit_bias":{"512":3}}' \
  '{"model":"stories260K","prompt":"Once","max_tokens":600}'; do
  code=$(post /v1/completions "$request")
  [[ $code == 400 ]] || fail "${request:0:60}: status $code ($(cat "$work/body"))"
done
after=$(invalid) errors_after=$(errors)
((after == before + 4)) || fail "four refused requests counted as invalid $((after - before)) time(s)"
[[ $errors_after == "$errors_before" ]] || fail "refused requests counted as errors: $errors_before -> $errors_after"

# 1,000 idle keep-alive connections (each after a request of its own) and 100 streams
# whose readers never read: a working client is served meanwhile, and the gateway's
# threads stay as they were.
threads() { ls "/proc/$node/task" | wc -l; }
threads_before=$(threads)
python3 - "$http_url" "$node" >"$work/load" 2>&1 <<'PY' || fail "idle connections and stuck readers: $(cat "$work/load")"
import json, os, socket, subprocess, sys, time
from raw_conns import address
addr, node = address(sys.argv[1]), sys.argv[2]
idle = []
for i in range(1000):
    s = socket.create_connection(addr, timeout=10)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    idle.append(s)
for s in idle:
    got = b""
    while b'"ok"' not in got:
        got += s.recv(4096)
stuck = []
req = json.dumps({"model": "stories260K", "prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
for i in range(100):
    s = socket.create_connection(addr, timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(req) + req)
    stuck.append(s)
t0 = time.time()
r = subprocess.run(["curl", "-s", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}", sys.argv[1] + "/v1/completions",
                    "-d", json.dumps({"model": "stories260K", "prompt": "Once", "max_tokens": 5})], capture_output=True, text=True)
if r.stdout != "200":
    sys.exit(f"a working client beside 1,000 idle connections and 100 stuck readers got {r.stdout or 'no answer'}")
print(f"served in {time.time() - t0:.2f} s; node threads {len(os.listdir(f'/proc/{node}/task'))}")
def still_open(s):
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
held = sum(still_open(s) for s in idle)
if held != len(idle):
    sys.exit(f"the gateway closed {len(idle) - held} of the idle keep-alive connections within a minute")
print(f"holding {held} idle connections", flush=True)
PY
threads_after=$(threads)
((threads_after <= threads_before + 2)) || fail "the node's threads went from $threads_before to $threads_after with 1,100 connections"

# SIGTERM while a stream runs: it finishes whole, then the node stops.
curl -sN "$http_url/v1/completions" -d '{"model":"stories260K","prompt":"Once","max_tokens":300,"ignore_eos":true,"stream":true}' \
  >"$work/drained" &
streamer=$!
others+=("$streamer")
for _ in $(seq 1 100); do [[ -s $work/drained ]] && break; sleep 0.05; done
kill -TERM "$node"
wait "$streamer" || true
for _ in $(seq 1 100); do kill -0 "$node" 2>/dev/null || break; sleep 0.1; done
kill -0 "$node" 2>/dev/null && fail "the node did not stop within 10 s of SIGTERM"
tail -1 "$work/drained" | grep -q '^$' && grep -q 'data: \[DONE\]' "$work/drained" || fail "the stream in flight was cut: $(tail -c 300 "$work/drained")"
node_pid=
cat "$work/half" "$work/load"
echo "http faults: half-closed clients answered, numbers out of range named, refusals counted invalid, idle and stuck clients harmless, streams drained"

#!/usr/bin/env bash
# What a stranger can send a gateway, from the hostile probe's findings, held on a real
# troupe-node on 127.0.0.1:
#  - a prompt longer than the context can hold is refused from its bytes, before it is
#    tokenized, on both APIs (the message says so; a tokenized one would name its token
#    count), and eight clients sending such prompts over and over leave a normal request
#    served at its usual pace;
#  - an API keys file with CRLF line ends, blank and whitespace-only lines and a key with
#    a trailing space: both APIs take the same keys, whitespace is no key, and the node
#    says how many keys it read;
#  - a head over 64 KiB of many short fields, sent in pieces, is a 431;
#  - Cap'n Proto garbage, a body that is not JSON, an unknown SLO class and
#    add_generation_prompt false get troupe's own words, naming the field, with no library
#    text and no internal id.
# Bounded in time; the node is always stopped.
# Usage: probe_requests_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
scratch

single_topology "$src" "$work"
sed -i "s/^port *= *7410/port = $(free_port)/" "$work/t.toml"  # its own ports: the test runs beside others
printf 'A-key-one\r\n\r\n   \r\n# a comment\r\n\t\r\nkeyD \r\n' >"$work/keys"
sed -i 's|^capnp = .*|&\napi_keys_file = "'"$work"'/keys"|' "$work/t.toml"
printf '\n[[class]]\nname = "interactive"\nttft_ms = 5000\n' >>"$work/t.toml"
start_node "$work/t.toml" "$work"
base=$http_url
capnp_ep=${capnp_url#capnp://}
client() { TROUPE_API_KEY=$1 timeout 30 "$build/tools/troupe-client" --connect "$capnp_ep" "${@:2}"; }
auth=(-H "Authorization: Bearer A-key-one" -H 'Content-Type: application/json')

# -- the keys file ---------------------------------------------------------------------
grep -q "API keys: 2 from $work/keys" "$work/node.err" || fail "the node does not say it read 2 keys: $(grep -i key "$work/node.err")"
body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":4,"temperature":0}'
for key in A-key-one keyD; do
  code=$(status -H "Authorization: Bearer $key" -H 'Content-Type: application/json' "$base/v1/completions" -d "$body")
  [[ $code == 200 ]] || fail "HTTP with key '$key': $code $(cat "$work/body")"
done
for key in A-key-one keyD "keyD "; do
  out=$(client "$key" -p "Once upon a time" -n 8 -t 0 2>&1) || fail "Cap'n Proto with key '$key': $out"
done
for key in "   " " " "keyD x"; do
  if out=$(client "$key" -p "Once upon a time" -n 8 -t 0 2>&1); then fail "Cap'n Proto took the key '$key': $out"; fi
  grep -q "missing or wrong API key" <<<"$out" || fail "key '$key' refused without the reason: $out"
done
code=$(status -H "Authorization: Bearer    " -H 'Content-Type: application/json' "$base/v1/completions" -d "$body")
[[ $code == 401 ]] || fail "HTTP with a blank key: $code"

# -- long prompts ----------------------------------------------------------------------
# Just under the 1 MiB cap: past the context's bound by far. The refusal names bytes, not
# tokens: the text was never tokenized.
python3 -c 'import json; print(json.dumps({"model": "stories260K", "prompt": "Once upon a time " * 61000, "max_tokens": 4}))' >"$work/long.json"
t0=$(date +%s%N)
code=$(status "${auth[@]}" "$base/v1/completions" --data-binary @"$work/long.json")
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[[ $code == 400 ]] || fail "a 1 MiB prompt: status $code ($(head -c 300 "$work/body"))"
grep -q '"code":"context_length_exceeded"' "$work/body" && grep -q "bytes, more than the model's context of 512 tokens can hold" "$work/body" ||
  fail "a 1 MiB prompt: not refused from its bytes: $(head -c 300 "$work/body")"
echo "a 1 MiB prompt refused in $ms ms"
# The same over Cap'n Proto (a command line holds 120 KB of it).
long=$(python3 -c 'print("Once upon a time " * 7000, end="")')
if out=$(client A-key-one -p "$long" -n 8 -t 0 2>&1 >/dev/null); then fail "Cap'n Proto served a prompt past the context"; fi
grep -q "bytes, more than the model's context of 512 tokens can hold" <<<"$out" || fail "Cap'n Proto, a long prompt: $out"
# Eight clients sending such prompts as fast as they can; normal requests beside them.
python3 - "$base" "$work/long.json" >"$work/flood" 2>&1 <<'PY' || fail "beside long prompts: $(cat "$work/flood")"
import json, statistics, sys, threading, time, urllib.request, urllib.error
base, long_body = sys.argv[1], open(sys.argv[2], "rb").read()
headers = {"Authorization": "Bearer A-key-one", "Content-Type": "application/json"}
def post(data):
    req = urllib.request.Request(base + "/v1/completions", data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
stop = time.monotonic() + 8
sent = [0]
def flood():
    while time.monotonic() < stop:
        assert post(long_body) == 400
        sent[0] += 1
threads = [threading.Thread(target=flood) for _ in range(8)]
for t in threads: t.start()
normal = json.dumps({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}).encode()
times = []
time.sleep(0.5)
while time.monotonic() < stop - 0.5:
    t0 = time.monotonic()
    assert post(normal) == 200
    times.append(time.monotonic() - t0)
for t in threads: t.join()
p50 = statistics.median(times)
print(f"{sent[0]} long prompts refused; normal requests beside them: p50 {p50 * 1000:.0f} ms over {len(times)}")
# Tokenizing each long prompt took about half a second of the router's time, and normal
# requests waited seconds behind them; refused from their bytes, they cost milliseconds.
assert p50 < 1.0, f"normal requests p50 {p50:.2f} s beside the long prompts"
assert sent[0] >= 40, f"only {sent[0]} long prompts went out in 8 s"
PY
cat "$work/flood"

# -- heads -----------------------------------------------------------------------------
python3 - "$base" >"$work/heads" 2>&1 <<'PY' || fail "large heads: $(cat "$work/heads")"
import sys, time
from raw_conns import Conn, address
addr = address(sys.argv[1])
def send_head(size, piece):
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n"
    while len(head) < size:
        head += b"X-F: y\r\n"
    head += b"\r\n"
    c = Conn(addr)
    for at in range(0, len(head), piece):
        try:
            c.sock.sendall(head[at:at + piece])
        except OSError:  # refused before the head was whole: its answer is waiting
            break
        time.sleep(0.001)
    return (c.answer() or "").split("\r\n")[0]
for size in (70_000, 90_000, 119_000):
    for piece in (1460, 16384):
        status = send_head(size, piece)
        assert " 431 " in status, f"a head of {size} bytes in pieces of {piece}: {status!r}"
assert " 200 " in send_head(60_000, 1460), "a head under 64 KiB was not served"
print("heads over 64 KiB: 431")
PY

# -- troupe's own words ----------------------------------------------------------------
python3 - "$capnp_url" >"$work/garbage" 2>&1 <<'PY' || fail "Cap'n Proto garbage: $(cat "$work/garbage")"
import struct, sys
from raw_conns import Conn, address
addr = address(sys.argv[1])
def answer(data):
    return Conn(addr, data).until_closed(10) or b""
for name, data in [("text", b"hello, not Cap'n Proto at all" * 4),
                   ("a segment count of 2^32 - 1", struct.pack("<II", 0xFFFFFFFF, 10) + bytes(64)),
                   ("a pointer of the wrong kind", struct.pack("<II", 0, 4) + bytes(range(1, 9)) * 4),
                   ("HTTP", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")]:
    got = answer(data)
    assert b"troupe-capnp: the connection" in got, f"{name}: {got!r}"
    for library in (b"expected ", b"segmentCount", b"WirePointer", b".c++"):
        assert library not in got, f"{name}: the library's words reached the client: {got!r}"
print("Cap'n Proto garbage: troupe's words")
PY
grep -q "troupe-capnp: 127.0.0.1:[0-9]*: closed: a frame the library refused: expected segmentCount()" "$work/node.err" ||
  fail "the library's text is not in the node's log: $(grep troupe-capnp "$work/node.err" | tail -3)"
code=$(status "${auth[@]}" "$base/v1/completions" -d '{"model":"stories260K","prompt":"Once","max_tokens":[4')
[[ $code == 400 ]] && grep -q "not valid JSON: a syntax error at byte [0-9]*, after the key 'max_tokens'" "$work/body" ||
  fail "a body that is not JSON: $code $(cat "$work/body")"
grep -q "json.exception\|parse_error" "$work/body" && fail "the JSON library's words reached the client: $(cat "$work/body")"
code=$(status "${auth[@]}" "$base/v1/completions" -d '{"model":"stories260K","prompt":"Once","max_tokens":4,"slo_class":"batchy"}')
[[ $code == 400 ]] && grep -q "interactive" "$work/body" || fail "an unknown class: $code $(cat "$work/body")"
grep -q '"request [0-9]' "$work/body" && fail "an internal id reached the client: $(cat "$work/body")"
code=$(status "${auth[@]}" "$base/v1/chat/completions" -d '{"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false}')
[[ $code == 400 ]] && grep -q '"param":"add_generation_prompt"' "$work/body" || fail "add_generation_prompt false: $code $(cat "$work/body")"
echo "PASS"

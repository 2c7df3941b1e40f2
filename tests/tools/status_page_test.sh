#!/usr/bin/env bash
# The gateway's status page in headless Chromium (Debian's), against a live node with API
# keys: /status.json refuses a caller without a key; the page, given one in its address's
# fragment, renders the live figures (health, requests served, tokens, each replica's
# state, stages and KV blocks, the node's agent, recent events) and follows them as they
# change; without a key it asks for one. Bounded in time; the node is always stopped.
# Usage: status_page_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
scratch
browser=$(command -v chromium || command -v chromium-browser || true)
[[ -n $browser ]] || fail "chromium is not installed (tools/install-packages.sh installs it)"

printf 'status-key\n' >"$work/keys"
single_topology "$src" "$work"
sed -i 's|^capnp = .*|&\napi_keys_file = "'"$work"'/keys"|' "$work/t.toml"
start_node "$work/t.toml" "$work"
base=$http_url
auth=(-H 'Authorization: Bearer status-key')
complete() {
  for _ in $(seq 1 "$1"); do
    curl -sf "${auth[@]}" "$base/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":7,"temperature":0}' >/dev/null ||
      fail "a completion failed"
  done
}
complete 3

[[ $(curl -s -o /dev/null -w '%{http_code}' "$base/status.json") == 401 ]] || fail "/status.json without a key was answered"
curl -sf "${auth[@]}" "$base/status.json" >"$work/status.json" || fail "/status.json with the key"
python3 - "$work/status.json" <<'PY' || fail "/status.json: $(cat "$work/status.json")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["model"] == "stories260K" and s["requests"]["length"] == 3 and s["output_tokens"] == 21, s
(r,) = s["replicas"]
assert r["name"] == "r0" and r["ready"] and r["kv_used"] + r["kv_free"] == 1024, r
assert s["layout"] == [{"name": "r0", "stages": [{"node": "n0", "layers": "0-4", "devices": ["cpu"]}]}], s["layout"]
PY

# The rendered page: the browser runs its script (virtual time lets its first fetches land).
render() {  # address, output file
  timeout 60 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --user-data-dir="$work/profile" --virtual-time-budget=6000 --dump-dom "$1" >"$2" 2>"$work/browser.log" ||
    fail "chromium: $(tail -3 "$work/browser.log")"
}
render "$base/status#key=status-key" "$work/page.html"
python3 - "$work/page.html" 3 21 <<'PY' || fail "the rendered page lacks the live figures"
import re, sys
html = open(sys.argv[1]).read()
def need(pattern, what):
    if not re.search(pattern, html, re.S):
        print("missing:", what)
        sys.exit(1)
need(r'id="health" class="ok">ok<', "health ok")
need(r'id="served">%s<' % sys.argv[2], "requests served")
need(r'id="tokens">%s<' % sys.argv[3], "output tokens")
need(r'id="replica-r0"><td>r0</td><td class="ok">ready</td><td>n0: layers 0-4 on cpu</td>', "replica r0, ready, its stage")
need(r'/ 1024</td>', "the replica's KV blocks")
need(r'<td>n0</td><td class="ok">answers</td>', "node n0's agent")
need(r'replica r0 ready', "the event of the replica becoming ready")
need(r'troupe: <span id="model">stories260K</span>', "the model")
PY
# Later figures follow.
complete 2
render "$base/status#key=status-key" "$work/page2.html"
grep -q 'id="served">5<' "$work/page2.html" || fail "the page did not follow the figures: $(grep -o 'id="served">[0-9]*' "$work/page2.html")"
# No key: the page asks for one, and shows nothing of the deployment.
rm -rf "$work/profile"
render "$base/status" "$work/nokey.html"
grep -q 'This server wants an API key' "$work/nokey.html" || fail "without a key the page did not ask for one"
! grep -q 'id="replica-r0"\|stories260K' "$work/nokey.html" || fail "without a key the page showed the deployment"
echo "PASS"

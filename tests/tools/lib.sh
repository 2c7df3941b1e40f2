# Shared by the process tests. Their Python finds its helpers (raw_conns.py) beside this
# file.
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"

# Background servers run under `timeout`, so the pid a test holds is timeout's; SIGKILL on
# it would orphan the server. stop_tree stops the server (timeout's children) and timeout
# itself: TERM first, KILL after 3 s.
stop_tree() {
  local pid=$1
  [[ -n $pid ]] || return 0
  local kids
  kids=$(pgrep -P "$pid" 2>/dev/null || true)
  kill -TERM $kids "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $kids "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# Every process test has a twin over TLS: the same script with TROUPE_TEST_TLS=1. There,
# every topology a test starts gains a [tls] table and the certificates troupe-launch certs
# makes (beside the topology, kept across the test's topologies), so that the nodes'
# links (actors, step links, KV channels) and troupe-launch's links to node agents all
# run over TLS; each started node must say so in its log. Client endpoints stay plain,
# as on loopback.
tls_twin() { [[ ${TROUPE_TEST_TLS:-} == 1 ]]; }
TLS_LINE="links to other nodes (actors, step links, KV) over TLS"
# with_tls FILE: in the twin, FILE over TLS (once however often asked). Needs $build.
with_tls() {
  tls_twin || return 0
  grep -q '^\[tls\]' "$1" ||
    printf '\n[tls]\nca = "certs/ca.pem"\ncert = "certs/{node}.pem"\nkey = "certs/{node}.key"\n' >>"$1"
  "$build/tools/troupe-launch" certs "$1" >/dev/null
}
# topology_copy SRC DST: a copy of a topology of deploy/ with the shared models' path made
# absolute (DST may live anywhere), over TLS in the twin.
topology_copy() {
  sed -e "s|\.\./\.\./shared|$(cd "$(dirname "$1")/../.." && pwd)/shared|" "$1" >"$2"
  with_tls "$2"
}
# tls_logged LOG...: in the twin, fails unless every LOG says its node's links run over TLS.
tls_logged() {
  tls_twin || return 0
  local log
  for log in "$@"; do
    grep -qF "$TLS_LINE" "$log" || { echo "FAIL: $log does not say its links run over TLS"; tail -5 "$log"; exit 1; }
  done
}
# launched_over_tls TOPOLOGY STATE_DIR: tls_logged for every node troupe-launch started.
launched_over_tls() {
  tls_twin || return 0
  local logs=() n
  for n in $("$build/tools/troupe-launch" status "$1" --state-dir "$2" 2>/dev/null | sed -n 's/^node \([^ ]*\) pid.*/\1/p'); do
    logs+=("$2/$n.log")
  done
  [[ ${#logs[@]} -gt 0 ]] || { echo "FAIL: troupe-launch status lists no node of $1"; exit 1; }
  tls_logged "${logs[@]}"
}

# Starts troupe-node on TOPOLOGY with both APIs on free loopback ports, logs in DIR, and
# sets node_pid, http_url (http://...) and capnp_url (capnp://...). Needs $build.
start_node() {
  local topology=$1 dir=$2
  # Emptied here, not only by the redirection below: that runs in the background job, and
  # the wait below could otherwise read the endpoints of a node started before.
  : >"$dir/node.out"
  : >"$dir/node.err"
  with_tls "$topology"
  timeout 180 "$build/tools/troupe-node" "$topology" --capnp 127.0.0.1:0 --http 127.0.0.1:0 \
    >"$dir/node.out" 2>"$dir/node.err" &
  node_pid=$!
  for _ in $(seq 1 300); do grep -q '^endpoint: capnp' "$dir/node.out" 2>/dev/null && break; sleep 0.1; done
  http_url=$(sed -n 's|^endpoint: \(http://.*\)|\1|p' "$dir/node.out")
  capnp_url=$(sed -n 's|^endpoint: \(capnp://.*\)|\1|p' "$dir/node.out")
  [[ -n $http_url && -n $capnp_url ]] || { cat "$dir/node.err"; echo "FAIL: the node did not start"; exit 1; }
  tls_logged "$dir/node.err"
}

# A copy of deploy/single.toml (topology_copy) at DIR/t.toml.
single_topology() { topology_copy "$1/deploy/single.toml" "$2/t.toml"; }

# The scaffolding of a process test: a scratch directory ($work) and the servers it starts
# ($node_pid, and any pid added to $others), all stopped and removed on exit however the
# test ends; fail() reports, with the node's last log lines when it has any, and exits.
scratch() {
  work=$(mktemp -d)
  node_pid=
  others=()
  trap 'stop_tree "$node_pid"; for p in "${others[@]}"; do stop_tree "$p"; done; rm -rf "$work"' EXIT
}
fail() {
  echo "FAIL: $*"
  [[ -s ${work:-}/node.err ]] && tail -5 "$work/node.err"
  # The nodes troupe-launch started: what each logged last.
  local log
  for log in "${state:-/nonexistent}"/*.log; do
    [[ -s $log ]] && { echo "--- ${log##*/}, last lines:"; tail -8 "$log"; }
  done
  exit 1
}

# A free loopback port (free when asked: a server started soon after binds it).
# status CURL_ARGS...: the HTTP status of a request; its body is left in $work/body.
status() { curl -s -o "$work/body" -w '%{http_code}' "$@"; }
# post PATH BODY: a JSON POST to $base (the gateway's HTTP address); status as above.
post() { status -H 'Content-Type: application/json' "$base$1" --data-binary "$2"; }
# text_of: the first choice's text of the completion in $work/body.
text_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"], end="")' "$work/body"; }
# streamed_text: the text of the streamed completion in $work/body, its events' joined.
streamed_text() {
  python3 -c '
import json, sys
ev = [l[6:].strip() for l in open(sys.argv[1]) if l.startswith("data: ")]
print("".join(c["choices"][0].get("text", "") for c in map(json.loads, ev[:-1]) if c.get("choices")), end="")' "$work/body"
}

# served_as_run WHAT BODY MAX_TOKENS PROMPT [TROUPE_RUN_ARGS...]: the greedy, non-streamed
# completion in the file BODY ran to MAX_TOKENS (finish "length" and usage's
# completion_tokens both say so) with a text, and that text is exactly troupe-run's
# continuation of PROMPT over as many tokens (with --ignore-eos and TROUPE_RUN_ARGS: a KV
# budget, say). Leaves the text in BODY.text, and the prompt's tokens (BOS included, as
# usage counts them) in $served_prompt_tokens. Needs $build and $models (stories260K).
served_as_run() {
  local what=$1 body=$2 max=$3 prompt=$4 counts p_tokens c_tokens want
  shift 4
  counts=$(python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    c = d["choices"][0]
    assert c["text"], "no text"
    assert c["finish_reason"] == "length", "finish_reason %s, not length" % c["finish_reason"]
    u = d["usage"]
    assert u["completion_tokens"] == int(sys.argv[2]), "%d tokens, not max_tokens %s" % (u["completion_tokens"], sys.argv[2])
except Exception as e:
    print(e)
    sys.exit(1)
open(sys.argv[1] + ".text", "w").write(c["text"])
print(u["prompt_tokens"], u["completion_tokens"])' "$body" "$max") || fail "$what: $counts $(head -c 300 "$body")"
  read -r p_tokens c_tokens <<<"$counts"
  served_prompt_tokens=$p_tokens
  want=$("$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -p "$prompt" -t 0 -q --ignore-eos \
    -n $((p_tokens - 1 + c_tokens)) "$@")  # (troupe-run counts the prompt's tokens after BOS)
  [[ $(cat "$body.text") == "${want#"$prompt"}" ]] ||
    fail "$what: the text is not troupe-run's over $c_tokens tokens: '$(cat "$body.text")' vs '${want#"$prompt"}'"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# N free loopback ports, all different, on one line.
free_ports() {
  python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# scratch, for a test that starts clusters with troupe-launch: launch() runs it with the
# test's state directory ($state), and every topology under $work is taken down on exit
# (and the servers in $node_pid and $others stopped, as scratch does).
launch_scratch() {
  scratch
  state=$work/state
  launch() {
    if [[ $1 == up ]]; then with_tls "$2"; fi
    timeout 120 "$build/tools/troupe-launch" "$@" --state-dir "$state" || return
    if [[ $1 == up ]]; then launched_over_tls "$2" "$state"; fi
  }
  trap 'for p in "${others[@]}"; do stop_tree "$p"; done; stop_tree "$node_pid"
        for t in "$work"/*.toml; do launch down "$t" >/dev/null 2>&1 || true; done; rm -rf "$work"' EXIT
}

# launch_http TOPOLOGY [WHAT]: troupe-launch up (launch_scratch's launch) with the client
# endpoints on free ports; sets $base to the HTTP one. A failure names WHAT.
launch_http() {
  local out who=${2:+$2: }
  out=$(launch up "$1" --capnp 127.0.0.1:0 --http 127.0.0.1:0) || fail "${who}troupe-launch up: $out"
  base=$(sed -n 's|^endpoint: \(http://.*\)|\1|p' <<<"$out")
  [[ -n $base ]] || fail "${who}no HTTP endpoint line: $out"
}

# pp2_topology FILE LINES...: a PP=2 stories260K topology at FILE (nodes n0 and n1 on free
# ports, the gateway on n0, layers 0-2 and 3-4), LINES (the test's own tables) after
# [gateway], and $replica_extra inside its [[replica]]. Needs $models.
pp2_topology() {
  local file=$1
  shift
  cat >"$file" <<TOML
[model]
path      = "$models/stories260K.bin"
tokenizer = "$models/tok512.bin"

[gateway]
node  = "n0"
capnp = "127.0.0.1:$(free_port)"

$(printf '%s\n' "$@")

[[node]]
name = "n0"
host = "127.0.0.1"
port = $(free_port)

[[node]]
name = "n1"
host = "127.0.0.1"
port = $(free_port)

[[replica]]
name   = "r0"
stages = [ { node = "n0", layers = "0-2", devices = ["cpu"] },
           { node = "n1", layers = "3-4", devices = ["cpu"] } ]
${replica_extra:-}
TOML
}

# speculative_topology NAME LINES...: pp2_topology at $work/NAME.toml with a
# [speculative] table of LINES.
speculative_topology() {
  local name=$1
  shift
  pp2_topology "$work/$name.toml" "[speculative]" "$@"
}

# Starts Debian's Prometheus on CONFIG (a file in $work) at a free port, its log in
# $work/prom.log, and sets $prom to its address; it is stopped with the test's servers.
start_prometheus() {
  local port
  port=$(free_port)
  timeout 120 prometheus --config.file="$1" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address=127.0.0.1:$port --log.level=warn >"$work/prom.log" 2>&1 &
  others+=($!)
  prom=http://127.0.0.1:$port
}

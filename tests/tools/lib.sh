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

# Starts troupe-node on TOPOLOGY with both APIs on free loopback ports, logs in DIR, and
# sets node_pid, http_url (http://...) and capnp_url (capnp://...). Needs $build.
start_node() {
  local topology=$1 dir=$2
  timeout 180 "$build/tools/troupe-node" "$topology" --capnp 127.0.0.1:0 --http 127.0.0.1:0 \
    >"$dir/node.out" 2>"$dir/node.err" &
  node_pid=$!
  for _ in $(seq 1 300); do grep -q '^endpoint: capnp' "$dir/node.out" 2>/dev/null && break; sleep 0.1; done
  http_url=$(sed -n 's|^endpoint: \(http://.*\)|\1|p' "$dir/node.out")
  capnp_url=$(sed -n 's|^endpoint: \(capnp://.*\)|\1|p' "$dir/node.out")
  [[ -n $http_url && -n $capnp_url ]] || { cat "$dir/node.err"; echo "FAIL: the node did not start"; exit 1; }
}

# A copy of deploy/single.toml with the shared models' path made absolute, at DIR/t.toml.
single_topology() {
  local src=$1 dir=$2
  sed -e "s|\.\./\.\./shared|$(cd "$src/.." && pwd)/shared|" "$src/deploy/single.toml" >"$dir/t.toml"
}

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
  exit 1
}

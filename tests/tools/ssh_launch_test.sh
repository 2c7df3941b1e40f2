#!/usr/bin/env bash
# troupe-launch starts a node of another host through ssh. A stand-in `ssh` first on PATH
# runs the remote command here and logs it, so the test checks what the launcher sends
# (the node's flags, quoted) and that the cluster then serves: node n1's host is
# 127.0.0.2, loopback to the kernel but not a host the launcher treats as local.
# Usage: ssh_launch_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
state=$(mktemp -d)
launch() { timeout 120 "$build/tools/troupe-launch" "$@" --state-dir "$state"; }
cleanup() {
  if [[ -f $state/t.procs ]]; then
    while read -r _ pid; do kill -9 "$pid" 2>/dev/null || true; done <"$state/t.procs"
  fi
  rm -rf "$state"
}
trap cleanup EXIT

mkdir -p "$state/bin"
cat >"$state/bin/ssh" <<'SH'
#!/usr/bin/env bash
# ssh -o OPTION ... HOST COMMAND: log HOST and COMMAND, then run COMMAND here.
while [[ $1 == -o ]]; do shift 2; done
host=$1
shift
echo "$host $*" >>"$(dirname "$0")/../ssh.log"
exec bash -c "$*"
SH
chmod +x "$state/bin/ssh"
export PATH="$state/bin:$build/tools:$PATH"

shared=$(cd "$src/../shared" && pwd)
sed -e "s|\.\./\.\./shared|$shared|" -e '/^name = "n1"/,/^port/ s/^host = "127.0.0.1"/host = "127.0.0.2"/' \
  "$src/deploy/pp2.toml" >"$state/t.toml"
printf '\n[failure]\nrestart = "never"\n' >>"$state/t.toml"
grep -q '127.0.0.2' "$state/t.toml" || { echo "the test topology has no remote node"; exit 1; }
with_tls "$state/t.toml"

ep=$(launch up "$state/t.toml" --capnp 127.0.0.1:0 | sed -n 's|^endpoint: capnp://||p')
[[ -n $ep ]] || { cat "$state"/*.log; echo "no endpoint"; exit 1; }
grep -qx "127.0.0.2 troupe-node '$state/t.toml' --node 'n1'" "$state/ssh.log" ||
  { echo "ssh was not asked to start node n1 as expected:"; cat "$state/ssh.log"; exit 1; }
[[ $(grep -c . "$state/ssh.log") == 1 ]] || { echo "ssh started more than node n1"; exit 1; }
launched_over_tls "$state/t.toml" "$state"

got=$(timeout 60 "$build/tools/troupe-client" --connect "$ep" -p "Once upon a time" -n 50 -t 0)
want=$("$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -p "Once upon a time" -n 50 -t 0 -q)
[[ $got == "$want" ]] || { echo "output differs"; echo "$got"; echo "$want"; exit 1; }
grep -q '^node n1 pid [0-9]* running$' <<<"$(launch status "$state/t.toml")" || { echo "n1 not running"; exit 1; }

launch down "$state/t.toml" >/dev/null 2>&1
launch status "$state/t.toml" >/dev/null && { echo "status still lists nodes after down"; exit 1; }
echo "ssh launch: node n1 started through ssh with its flags quoted; the cluster served; down stopped it"

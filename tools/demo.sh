#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts a local troupe node serving a
# small model (the gateway, scheduler, stage and two tensor-parallel shards as actors in
# one process), answers real requests through troupe-client over Cap'n Proto RPC, and
# keeps serving until Ctrl-C when run on a terminal.
#
#   tools/demo.sh                    serves ../shared/models/stories260K (deploy/tp2.toml)
#   tools/demo.sh MODEL [TOKENIZER]  serves another llama2.c or GGUF model
#   TROUPE_PORT=7500 tools/demo.sh   another client port (default 7400)
#   TROUPE_TOPOLOGY=deploy/tiers.toml tools/demo.sh
#                                    serves a one-process topology of your own; when it
#                                    names a Redis KV tier on this machine with nothing
#                                    answering there, a redis-server is started for it
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build >&2

port=${TROUPE_PORT:-7400}
work=$(mktemp -d)
node_pid=
redis_pid=
cleanup() {
  [[ -n $node_pid ]] && kill -TERM "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null || true
  [[ -n $redis_pid ]] && kill -TERM "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

if [[ -n ${TROUPE_TOPOLOGY:-} ]]; then
  topology=$TROUPE_TOPOLOGY
  model=$(sed -n 's/^path *= *"\(.*\)"/\1/p' "$topology" | head -1)
  # A Redis tier on this machine that nothing answers: a server for the demo's lifetime.
  for redis_port in $(sed -n 's/^address *= *"\(127\.0\.0\.1\|localhost\):\([0-9]*\)"/\2/p' "$topology"); do
    if ! redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
      echo "demo: starting redis-server on port $redis_port for the topology's Redis tier" >&2
      redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
      redis_pid=$!
    fi
  done
elif [[ $# -ge 1 ]]; then
  model=$(realpath "$1")
  tokenizer=${2:+$(realpath "$2")}
  topology=$work/topology.toml
  cat >"$topology" <<TOML
[model]
path = "$model"
tokenizer = "$tokenizer"
[gateway]
node = "n0"
capnp = "127.0.0.1:$port"
[[node]]
name = "n0"
host = "127.0.0.1"
port = $((port + 10))
threads = 2
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
TOML
else
  model=../shared/models/stories260K/stories260K.bin
  topology=deploy/tp2.toml
  if [[ ! -f $model ]]; then
    echo "demo: no model given and $model is not here; run: tools/demo.sh MODEL [TOKENIZER]" >&2
    exit 2
  fi
fi

echo "demo: starting a troupe node for $model ($topology)" >&2
# The node's log goes to the terminal, but for its one line per request (kept in the file,
# counted at the end), which would interleave with the streamed output.
build/tools/troupe-node "$topology" --capnp "127.0.0.1:$port" --http "127.0.0.1:$((port + 1))" \
  >"$work/node.out" 2> >(tee "$work/node.err" | grep --line-buffered -v ' info request id=' >&2) &
node_pid=$!
for _ in $(seq 1 600); do
  grep -q '^endpoint: capnp' "$work/node.out" 2>/dev/null && break
  kill -0 "$node_pid" 2>/dev/null || { echo "demo: the node did not start" >&2; exit 1; }
  sleep 0.1
done
endpoint=$(sed -n 's|^endpoint: capnp://||p' "$work/node.out")
http=$(sed -n 's|^endpoint: \(http://.*\)|\1|p' "$work/node.out")
echo "endpoint: capnp://$endpoint"
echo "endpoint: $http"
model_id=$(curl -s "$http/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')

ask() {
  echo
  echo "\$ troupe-client --connect $endpoint -p \"$1\" ${*:2}"
  build/tools/troupe-client --connect "$endpoint" -p "$1" "${@:2}"
}
ask "Once upon a time" -t 0 -n 120
ask "Lily and Tom went to the" -t 0.8 --top-p 0.95 --seed 7 -n 120
ask "The little dog" -t 1.0 --seed 3 -n 120 --stop "."
echo
echo "\$ curl $http/v1/completions -d '{\"model\": \"$model_id\", \"prompt\": \"Tim and his dog\", \"max_tokens\": 60}'"
curl -s "$http/v1/completions" -d "{\"model\": \"$model_id\", \"prompt\": \"Tim and his dog\", \"max_tokens\": 60, \"temperature\": 0.7, \"seed\": 1}"
echo
echo
build/tools/troupe-client --connect "$endpoint" --stats
sleep 0.2
echo "demo: the node logged $(grep -c ' info request id=' "$work/node.err") request lines (id, outcome, tokens, TTFT; no text), e.g."
grep ' info request id=' "$work/node.err" | tail -1 | sed 's/^/  /'

if [[ -t 0 ]]; then
  echo
  echo "demo: the node keeps serving at capnp://$endpoint; in another terminal try"
  echo "  build/tools/troupe-client --connect $endpoint -p \"Once upon a time\" -n 100 -t 0.8"
  echo "  curl $http/v1/chat/completions -d '{\"model\": \"$model_id\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'"
  echo "demo: it serves loopback only, without API keys; to require them (and to serve off"
  echo "  loopback), set api_keys_file in the topology's [gateway] (deploy/*.toml show where)."
  echo "demo: Ctrl-C stops it."
  wait "$node_pid"
fi

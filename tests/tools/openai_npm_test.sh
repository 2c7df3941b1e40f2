#!/usr/bin/env bash
# The official `openai` npm package, at the version tests/tools/npm pins (tools/setup.sh
# installs it into BUILD_DIR/npm), against a real troupe-node: completion, two prompts in
# one, chat and a streamed chat; the completion's text equals troupe-client's for the
# same greedy request.
# Usage: openai_npm_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
scratch

installed=$build/npm/node_modules/openai/package.json
if [[ ! -f $installed ]]; then
  echo "FAIL: the openai npm package is not installed in $build/npm: tools/setup.sh installs it from the npm registry"
  [[ -s $build/npm/npm.log ]] && { echo "npm said:"; tail -5 "$build/npm/npm.log"; }
  exit 1
fi
pinned=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dependencies"]["openai"])' "$src/tests/tools/npm/package.json")
version=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$installed")
[[ $version == "$pinned" ]] || fail "openai $version is installed in $build/npm, $pinned pinned: run tools/setup.sh"
cp "$src/tests/tools/openai_client.mjs" "$work/"
ln -s "$build/npm/node_modules" "$work/node_modules"

echo "key-for-npm" >"$work/keys"
single_topology "$src" "$work"
sed -i 's|^capnp = .*|&\napi_keys_file = "'"$work"'/keys"|' "$work/t.toml"
start_node "$work/t.toml" "$work"
base=$http_url capnp=${capnp_url#capnp://}

timeout 120 node "$work/openai_client.mjs" "$base" key-for-npm stories260K >"$work/got.json" || fail "the openai client failed"
py() { python3 -c "import json,sys; d=json.load(open('$work/got.json')); print($1, end='')"; }
want=$(TROUPE_API_KEY=key-for-npm timeout 60 "$build/tools/troupe-client" --connect "$capnp" -p "Once upon a time" -n 44 -t 0)
[[ "Once upon a time$(py 'd["completion"]')" == "$want" ]] || fail "completion differs from troupe-client: $(py 'd["completion"]')"
[[ $(py 'd["completion_tokens"]') == 40 ]] || fail "usage"
[[ $(py '[i for i, _ in d["several"]]') == "[0, 1]" ]] || fail "two prompts: $(py 'd["several"]')"
[[ $(py 'd["several"][0][1]') == "$(py 'd["completion"]')" ]] || fail "the first of two prompts differs from it alone"
[[ $(py 'd["several"][1][1]') != "$(py 'd["completion"]')" ]] || fail "the second of two prompts was answered as the first"
[[ -n $(py 'd["chat"]') ]] || fail "empty chat"
[[ $(py 'd["streamed"]') == "$(py 'd["chat"]')" ]] || fail "streamed chat differs from the whole one"
[[ $(py 'd["stream_usage"]["completion_tokens"]') == 24 ]] || fail "stream usage"
[[ $(py '",".join(d["models"])') == stories260K ]] || fail "models"
kill -TERM "$node_pid"; wait "$node_pid" || true; node_pid=
echo "openai npm client: completion equals troupe-client's, two prompts in one request, chat and stream agree"

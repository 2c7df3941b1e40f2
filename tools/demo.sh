#!/usr/bin/env bash
# The main job: installs what is missing, builds, and serves a small model from this
# machine's CPU: ../shared/models/stories260K when it is there, else the model named as
# the first argument (with its tokenizer.bin as the second for llama2.c files).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build >&2

model=${1:-}
tokenizer=${2:-}
if [[ -z $model ]]; then
  model=../shared/models/stories260K/stories260K.bin
  tokenizer=../shared/models/stories260K/tok512.bin
  if [[ ! -f $model ]]; then
    echo "demo: no model given and $model is not here; run: tools/demo.sh MODEL [TOKENIZER]" >&2
    exit 2
  fi
fi
tok_args=()
[[ -n $tokenizer ]] && tok_args=(-z "$tokenizer")

echo "demo: serving $model" >&2
run() { echo; echo "\$ troupe-run $model -p \"$1\" ${*:2}"; build/tools/troupe-run "$model" "${tok_args[@]}" -p "$1" "${@:2}"; }
run "Once upon a time" -t 0 -n 120
run "Lily and Tom went to the" -t 0.8 --top-p 0.95 --seed 7 -n 120
run "The little dog" -t 1.0 --seed 3 -n 120 --stop "."

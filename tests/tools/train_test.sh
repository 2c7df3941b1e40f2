#!/usr/bin/env bash
# troupe-train end to end, small: Medusa heads, an EAGLE head and a draft model trained for
# stories260K in seconds, each taken by troupe-run, whose greedy output with them (chains
# and a tree) is plain decoding's; mistakes in its flags are named.
# Usage: train_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
build=$1 src=$2 models=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
train() { timeout 300 "$src/tools/troupe-train/troupe-train" "$models/stories260K.bin" -z "$models/tok512.bin" --build "$build" "$@"; }
fail() { echo "FAIL: $*"; exit 1; }

train --out "$work/s" --sequences 16 --length 64 --steps 20 --batch 4 --medusa-heads 3 --seed 3 2>"$work/log" ||
  fail "troupe-train: $(tail -3 "$work/log")"
for kind in medusa eagle draft; do
  [[ -s $work/s-$kind.gguf ]] || fail "no $kind file"
  grep -q "wrote $work/s-$kind.gguf" "$work/log" || fail "no line for the $kind file"
done
grep -q "medusa: held-out top-1 agreement with the target, head by head: [0-9.]*, [0-9.]*, [0-9.]*$" "$work/log" ||
  fail "no agreement figures for three Medusa heads: $(cat "$work/log")"

run() { "$build/tools/troupe-run" "$models/stories260K.bin" -z "$models/tok512.bin" -p "Once upon a time" -t 0 -n 120 --ids -q "$@"; }
plain=$(run)
for spec in "medusa --heads $work/s-medusa.gguf" "medusa --heads $work/s-medusa.gguf --tree 3,2,1" \
            "eagle --heads $work/s-eagle.gguf" "eagle --heads $work/s-eagle.gguf --tree 2,2" \
            "draft --draft $work/s-draft.gguf" "draft --draft $work/s-draft.gguf --tree 2,1,1"; do
  # shellcheck disable=SC2086
  got=$(run --speculative $spec) || fail "troupe-run --speculative $spec"
  [[ $got == "$plain" ]] || fail "--speculative $spec: output differs from plain decoding"
done
# Three heads reach three drafts, not four.
if out=$(run --speculative medusa --heads "$work/s-medusa.gguf" -k 4 2>&1); then fail "k 4 with three heads was taken"; fi
grep -q "deeper than the 3 Medusa heads" <<<"$out" || fail "k 4 with three heads: $out"

# Mistakes in the flags, named before anything is trained.
if out=$(train --out "$work/x" --what hydra 2>&1); then fail "--what hydra was taken"; fi
grep -q "'hydra' is not one of medusa, eagle, draft" <<<"$out" || fail "--what hydra: $out"
if out=$(train --out "$work/x" --length 4096 --sequences 2 --what medusa 2>&1); then fail "--length 4096 was taken"; fi
grep -q "past the target's context of 512" <<<"$out" || fail "--length 4096: $out"
if out=$(train --out "$work/x" --build /nonexistent 2>&1); then fail "a missing build was taken"; fi
grep -q "make-model is missing" <<<"$out" || fail "missing build: $out"
echo "troupe-train: heads and a draft trained and taken by troupe-run, equal to plain decoding; mistakes named"

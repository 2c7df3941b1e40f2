#!/usr/bin/env bash
# Trained proposers side by side (BENCHMARKS.md): batch-1 greedy decode by troupe-run of
# TARGET, plainly and with each proposer, chains and token trees, in one sitting; the
# plain decode is the anchor of every speedup. Each row sums PROMPTS prompts of TOKENS
# tokens each (best of RUNS runs per prompt).
#
#   tools/bench-heads.sh                       stories260K with tests/data's proposers
#   TARGET=m.gguf HEADS=prefix tools/bench-heads.sh   another model, PREFIX-{medusa,eagle,draft}.gguf
#                                                     from troupe-train --out PREFIX
set -euo pipefail
cd "$(dirname "$0")/.."
shared=$(cd .. && pwd)/shared/models/stories260K
TARGET=${TARGET:-$shared/stories260K.bin}
TOKENIZER=${TOKENIZER:-$([[ $TARGET == "$shared/stories260K.bin" ]] && echo "$shared/tok512.bin" || true)}
HEADS=${HEADS:-tests/data/stories260K}
TOKENS=${TOKENS:-300}
RUNS=${RUNS:-3}
THREADS=${THREADS:-1}
MEDUSA_TREE=${MEDUSA_TREE:-3,2,1}
TREE=${TREE:-2,2,1}
tools/setup.sh build >&2
run=build/tools/troupe-run
prompts=("Once upon a time" "The cat" "Lily and Tom went to the" "One day, a little bird" "Ben had a red ball")
z=()
[[ -n $TOKENIZER ]] && z=(-z "$TOKENIZER")

# One configuration: total tokens, total seconds (best run per prompt), verifies and tokens
# kept, over every prompt.
measure() {
  local tokens=0 secs=0 verifies=0 kept=0
  for p in "${prompts[@]}"; do
    local best="" line acc
    for _ in $(seq 1 "$RUNS"); do
      line=$("$run" "$TARGET" "${z[@]}" -p "$p" -t 0 -n "$TOKENS" -j "$THREADS" "$@" 2>&1 >/dev/null)
      local r
      r=$(sed -n 's/.*, \([0-9]*\) tokens at \([0-9.]*\) tok\/s.*/\1 \2/p' <<<"$line")
      [[ -n $r ]] || { echo "bench-heads: troupe-run $*: $line" >&2; exit 1; }
      if [[ -z $best ]] || awk -v a="${r#* }" -v b="${best#* }" 'BEGIN {exit !(a > b)}'; then best=$r; acc=$line; fi
    done
    local n=${best% *} rate=${best#* }
    tokens=$((tokens + n))
    secs=$(awk -v s="$secs" -v n="$n" -v r="$rate" 'BEGIN {print s + n / r}')
    local v k
    read -r k v < <(sed -n 's/.*: \([0-9]*\) of [0-9]* drafts accepted.*, \([0-9.]*\) tokens per verify.*/\1 \2/p' <<<"$acc" | head -1) || true
    if [[ -n ${k:-} ]]; then
      kept=$((kept + k))
      verifies=$((verifies + $(awk -v k="$k" -v t="$v" 'BEGIN {printf "%d", k / (t - 1) + 0.5}')))
    fi
  done
  echo "$tokens $secs $verifies $kept"
}

echo "### Batch-1 greedy decode of $(basename "$TARGET"), ${#prompts[@]} prompts x $TOKENS tokens, $THREADS thread(s), best of $RUNS"
echo
echo "| proposer | shape | tokens per verify | tok/s | speedup |"
echo "| --- | --- | ---: | ---: | ---: |"
read -r pt ps _ _ < <(measure)
plain=$(awk -v t="$pt" -v s="$ps" 'BEGIN {printf "%.0f", t / s}')
echo "| none (plain decoding) | | 1.00 | $plain | 1.00x |"
row() {
  local name=$1 shape=$2
  shift 2
  read -r t s v k < <(measure "$@")
  local rate per
  rate=$(awk -v t="$t" -v s="$s" 'BEGIN {printf "%.0f", t / s}')
  per=$(awk -v v="$v" -v k="$k" 'BEGIN {printf "%.2f", (v > 0 ? 1 + k / v : 1)}')
  echo "| $name | $shape | $per | $rate | $(awk -v a="$rate" -v b="$plain" 'BEGIN {printf "%.2f", a / b}')x |"
}
row "Medusa heads" "chain, k 4" --speculative medusa --heads "$HEADS-medusa.gguf" -k 4
row "Medusa heads" "tree $MEDUSA_TREE" --speculative medusa --heads "$HEADS-medusa.gguf" --tree "$MEDUSA_TREE"
row "EAGLE head" "chain, k 4" --speculative eagle --heads "$HEADS-eagle.gguf" -k 4
row "EAGLE head" "tree $TREE" --speculative eagle --heads "$HEADS-eagle.gguf" --tree "$TREE"
row "draft model (trained)" "chain, k 4" --speculative draft --draft "$HEADS-draft.gguf" -k 4
row "draft model (trained)" "tree $TREE" --speculative draft --draft "$HEADS-draft.gguf" --tree "$TREE"
row "n-gram" "chain, k 4" --speculative ngram -k 4
row "n-gram" "tree $TREE" --speculative ngram --tree "$TREE"
row "early exit" "chain, k 4" --speculative early-exit -k 4
row "early exit" "tree $TREE" --speculative early-exit --tree "$TREE"

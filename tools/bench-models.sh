# Sourced by the benchmark scripts: the synthetic 110M Llama (dim 768, hidden 2048, 12
# layers, 12 heads, separate classifier) that every benchmark table uses, written once by
# make-model into BENCH_DIR (default /tmp/troupe-bench) with the same flags whichever
# script comes first, with the Llama 2 vocabulary when ../shared has it.
#   bench_model FILE [make-model args...]   prints the path, making the file if missing
BENCH_DIR=${BENCH_DIR:-/tmp/troupe-bench}
mkdir -p "$BENCH_DIR"
bench_vocab=()
[[ -f ../shared/models/llama2-tokenizer/tokenizer.bin ]] &&
  bench_vocab=(--vocab-from ../shared/models/llama2-tokenizer/tokenizer.bin)
bench_model() {
  local file=$BENCH_DIR/$1
  if [[ ! -f $file ]]; then
    local extra=("${@:2}")
    [[ $1 == *.gguf ]] && extra+=("${bench_vocab[@]}")
    build/tools/make-model "$file" --preset 110m --separate-classifier "${extra[@]}" >&2
  fi
  echo "$file"
}
